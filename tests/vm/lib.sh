# shellcheck shell=bash
# Shared helpers of the Soft-RoCE VM harness (tests/vm/*.sh). Sourced, never run.
#
# Environment read here:
#   RDMASCHED_VM_CACHE   cache directory (default /var/cache/rdmasched-vm): images, .deb cache
#   RDMASCHED_VM_MIRROR  Debian mirror for the image (default: the one the host's apt uses,
#                        else http://deb.debian.org/debian)

# Exit codes shared by the harness scripts (documented in tests/vm/README.md).
# shellcheck disable=SC2034  # used by the scripts that source this file
readonly VM_EXIT_USAGE=2 VM_EXIT_HOST=120 VM_EXIT_BOOT=121 VM_EXIT_SETUP=122 VM_EXIT_WIRE=123 VM_EXIT_TIMEOUT=124

# Seconds since the outermost harness script started (shared with the scripts it calls).
VM_T0=${VM_T0:-$(printf '%(%s)T' -1)}
export VM_T0

vm_log() {
    local now
    printf -v now '%(%s)T' -1
    printf '[vm %3ds] %s\n' "$((now - VM_T0))" "$*" >&2
}

# vm_die CODE MESSAGE...
vm_die() {
    local code=$1
    shift
    printf '[vm] ERROR: %s\n' "$*" >&2
    exit "$code"
}

vm_cache_dir() {
    printf '%s\n' "${RDMASCHED_VM_CACHE:-/var/cache/rdmasched-vm}"
}

# vm_ensure_host_packages COMMAND:PACKAGE...
# Installs (apt-get, no recommends) the packages whose command is missing on the host.
vm_ensure_host_packages() {
    local pair cmd pkg missing=()
    for pair in "$@"; do
        cmd=${pair%%:*}
        pkg=${pair#*:}
        if ! PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1; then
            missing+=("$pkg")
        fi
    done
    ((${#missing[@]} == 0)) && return 0
    if ((EUID != 0)); then
        vm_die "$VM_EXIT_HOST" "missing host packages: ${missing[*]}; install them" \
            "(apt-get install --no-install-recommends ${missing[*]}) or run as root"
    fi
    vm_log "installing host packages: ${missing[*]}"
    local -a apt=(apt-get install -y -q --no-install-recommends "${missing[@]}")
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" >/dev/null; then
        vm_log "apt-get install failed; running apt-get update and trying once more"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null ||
            vm_die "$VM_EXIT_HOST" "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive "${apt[@]}" >/dev/null ||
            vm_die "$VM_EXIT_HOST" "could not install host packages: ${missing[*]}"
    fi
}

# vm_detect_mirror: prints the Debian archive URI that the host's apt uses for its release
# (deb822 *.sources and one-line *.list files), so the image builds wherever only that mirror
# is reachable. RDMASCHED_VM_MIRROR overrides it.
vm_detect_mirror() {
    if [[ -n ${RDMASCHED_VM_MIRROR:-} ]]; then
        printf '%s\n' "$RDMASCHED_VM_MIRROR"
        return
    fi
    local codename='' uri=''
    # shellcheck disable=SC1091
    codename=$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")
    codename=${codename:-bookworm}
    local -a files=()
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -r $f ]] && files+=("$f")
    done
    if ((${#files[@]})); then
        uri=$(awk -v suite="$codename" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " suite " ") &&
                    (" " comps " ") ~ / main /) { split(uris, u, " "); if (u[1] != "") { print u[1]; exit } }
                types = uris = suites = comps = ""; enabled = "yes"
            }
            FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
            /^[ \t]*#/ { next }
            deb822 && /^[ \t]*$/ { flush(); next }
            deb822 {
                key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "")
                if (key == "types") types = $0; else if (key == "uris") uris = $0
                else if (key == "suites") suites = $0; else if (key == "components") comps = $0
                else if (key == "enabled") enabled = tolower($0)
                next
            }
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
                if ($(i + 1) == suite) {
                    for (j = i + 2; j <= NF; j++) if ($j == "main") { print $i; exit }
                }
            }
            END { flush() }
        ' "${files[@]}" | head -n 1)
    fi
    printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

# vm_umount_under DIR: unmounts everything mounted at or below DIR (deepest first), e.g. the
# /proc and /sys that an interrupted debootstrap left mounted in a half-built root.
vm_umount_under() {
    local dir mnt
    dir=$(realpath -m -- "$1")
    while read -r mnt; do
        if [[ $mnt == "$dir" || $mnt == "$dir"/* ]]; then
            umount -l -- "$mnt" 2>/dev/null || true
        fi
    done < <(awk '{print $2}' /proc/self/mounts | sort -r)
}
