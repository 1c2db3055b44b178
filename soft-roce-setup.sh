#!/usr/bin/env bash
# soft-roce-setup.sh: set up, inspect and remove a Soft-RoCE device (the kernel's rdma_rxe).
#
# Usage:
#   soft-roce-setup.sh up [NETDEV]   load rdma_rxe and put an rxe device on NETDEV. Without
#                                    NETDEV: a dummy interface rsdummy0 with 192.0.2.1/24
#                                    (RDMASCHED_DUMMY_ADDR overrides), made here if missing.
#                                    NETDEV must be up and have an IPv4 address.
#   soft-roce-setup.sh down          remove the rxe device(s) and the dummy that `up` made
#   soft-roce-setup.sh status        list RDMA devices, ports, states and GIDs
#
# up and status print what they find on stderr and, when an rxe device is ACTIVE with a RoCE v2
# IPv4 GID, one last line on stdout for machines (eval it, or `export $(... | tail -n1)`):
#   RDMASCHED_DEVICE=rxe0 RDMASCHED_GID_INDEX=1 RDMASCHED_IP=192.0.2.1 RDMASCHED_NETDEV=rsdummy0
# Running `up` twice is harmless: an existing rxe device on NETDEV is reused.
#
# Exit codes:
#   0  done; for status: an rxe device is ACTIVE
#   1  failed; for status: no ACTIVE rxe device (run `soft-roce-setup.sh up`)
#   2  usage error
#   3  this kernel has no rdma_rxe: Soft-RoCE cannot run here (use tests/vm/run-in-vm.sh)
#   4  a needed tool is missing (the message names the Debian package)
#   5  up/down need root
#
# Environment: RDMASCHED_DUMMY_ADDR (default 192.0.2.1/24), RDMASCHED_SETUP_TIMEOUT (seconds
# to wait for the port to turn ACTIVE and its GID to appear, default 30).
#
# GIDs are read from `ibv_devinfo -v` (or a few sysfs entries), never by walking all 1024 sysfs
# GID entries: under emulation that walk takes minutes.
set -euo pipefail

readonly EXIT_FAIL=1 EXIT_USAGE=2 EXIT_NO_RXE=3 EXIT_NO_TOOL=4 EXIT_NOT_ROOT=5
readonly DUMMY=rsdummy0
readonly STATE_DIR=/run/rdmasched-soft-roce
readonly IB=/sys/class/infiniband
dummy_addr=${RDMASCHED_DUMMY_ADDR:-192.0.2.1/24}
setup_timeout=${RDMASCHED_SETUP_TIMEOUT:-30}
export PATH=$PATH:/usr/sbin:/sbin

prog=soft-roce-setup.sh
say() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() {
    local code=$1
    shift
    printf '%s: error: %s\n' "$prog" "$*" >&2
    exit "$code"
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

need_tool() { # COMMAND PACKAGE
    command -v "$1" >/dev/null 2>&1 ||
        die "$EXIT_NO_TOOL" "'$1' not found: install the Debian package $2 (apt-get install $2)"
}

need_root() {
    ((EUID == 0)) || die "$EXIT_NOT_ROOT" "'$prog $1' needs root"
}

# ---- kernel support ----------------------------------------------------------------------------

rxe_loaded() { [[ -d /sys/module/rdma_rxe ]]; }

# rxe_loadable: the module can be found (dry run; loads nothing).
rxe_loadable() {
    command -v modprobe >/dev/null 2>&1 && modprobe -n -q rdma_rxe 2>/dev/null
}

# no_rxe [DETAIL]: explain why this kernel cannot do Soft-RoCE and exit EXIT_NO_RXE.
no_rxe() {
    local kver why=() cfg=''
    kver=$(uname -r)
    [[ -n ${1:-} ]] && why+=("$1")
    [[ -e /proc/modules ]] || why+=("the kernel cannot load modules (no /proc/modules)")
    [[ -d /lib/modules/$kver ]] || why+=("no /lib/modules/$kver")
    if [[ -r /proc/config.gz ]]; then
        cfg=$(zcat /proc/config.gz 2>/dev/null | grep -E '^(# )?CONFIG_(INFINIBAND|RDMA_RXE)[ =]' || true)
        cfg=${cfg:+/proc/config.gz: $(printf '%s' "$cfg" | tr '\n' ';' | sed 's/;$//; s/;/; /g')}
    elif [[ -r /boot/config-$kver ]]; then
        cfg=$(grep -E '^(# )?CONFIG_(INFINIBAND|RDMA_RXE)[ =]' "/boot/config-$kver" || true)
        cfg=${cfg:+/boot/config-$kver: $(printf '%s' "$cfg" | tr '\n' ';' | sed 's/;$//; s/;/; /g')}
    fi
    [[ -n $cfg ]] && why+=("$cfg")
    [[ -d $IB ]] || why+=("no $IB (no RDMA core in the running kernel)")
    {
        echo "$prog: this kernel ($kver) has no rdma_rxe module: Soft-RoCE cannot run here."
        local w
        for w in "${why[@]}"; do echo "  - $w"; done
        echo "  Run the tier-3 (Soft-RoCE) tests in a VM that boots Debian's kernel instead, e.g."
        echo "    tests/vm/run-in-vm.sh -- python3 -m pytest -p no:cacheprovider tests"
        echo "  (see tests/vm/README.md)."
    } >&2
    exit "$EXIT_NO_RXE"
}

# ---- devices -----------------------------------------------------------------------------------

# rxe_devices: names of the rxe devices (software RoCE: a 'parent' netdev, node type CA).
rxe_devices() {
    local d
    [[ -d $IB ]] || return 0
    for d in "$IB"/*; do
        [[ -r $d/parent ]] || continue
        [[ $(cat "$d/node_type" 2>/dev/null) == 1:* ]] || continue
        basename "$d"
    done
}

rxe_parent() { cat "$IB/$1/parent" 2>/dev/null; }

rxe_on_netdev() { # NETDEV -> device name or nothing
    local dev
    for dev in $(rxe_devices); do
        if [[ $(rxe_parent "$dev") == "$1" ]]; then
            echo "$dev"
            return
        fi
    done
}

port_state() { # DEVICE -> e.g. ACTIVE (port 1: rxe has one)
    local s
    s=$(cat "$IB/$1/ports/1/state" 2>/dev/null) || return 1
    echo "${s#*: }"
}

netdev_ipv4() { # NETDEV -> first IPv4 address, or nothing
    ip -4 -o addr show dev "$1" 2>/dev/null | awk '{sub(/\/.*/, "", $4); print $4; exit}'
}

# roce_v2_gid_index DEVICE IPV4: index of the RoCE v2 GID ::ffff:IPV4, or nothing.
roce_v2_gid_index() {
    local dev=$1 ip=$2
    if command -v ibv_devinfo >/dev/null 2>&1; then
        # lines like "GID[  1]:<tabs>::ffff:192.0.2.1, RoCE v2"; compare without blanks
        ibv_devinfo -d "$dev" -v 2>/dev/null | awk -v want="]:::ffff:$ip,RoCEv2" '
            { l = $0; gsub(/[ \t]/, "", l) }
            l ~ /^GID\[[0-9]+\]:/ {
                i = l; sub(/^GID\[/, "", i); sub(/\].*/, "", i)
                if (l == "GID[" i want) { print i; exit }
            }'
        return
    fi
    # No ibv_devinfo: read the first few sysfs entries only (see the header).
    local hex i
    hex=$(IFS=. read -r a b c d <<<"$ip" && printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
    for i in 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do
        if [[ $(cat "$IB/$dev/ports/1/gids/$i" 2>/dev/null) == "$hex" &&
            $(cat "$IB/$dev/ports/1/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]]; then
            echo "$i"
            return
        fi
    done
}

print_gids() { # DEVICE: the valid GIDs, indented
    local dev=$1 i g t
    if command -v ibv_devinfo >/dev/null 2>&1; then
        ibv_devinfo -d "$dev" -v 2>/dev/null | awk '$1 ~ /^GID\[/ {sub(/^[ \t]+/, ""); print "      " $0}'
        return
    fi
    for i in 0 1 2 3 4 5 6 7; do
        g=$(cat "$IB/$dev/ports/1/gids/$i" 2>/dev/null) || continue
        [[ $g == 0000:0000:0000:0000:0000:0000:0000:0000 ]] && continue
        t=$(cat "$IB/$dev/ports/1/gid_attrs/types/$i" 2>/dev/null || true)
        echo "      GID[$i]: $g, $t"
    done
}

# machine_line DEVICE: prints the RDMASCHED_* line if DEVICE is ACTIVE with a RoCE v2 IPv4 GID.
machine_line() {
    local dev=$1 netdev ip idx
    [[ $(port_state "$dev") == ACTIVE ]] || return 1
    netdev=$(rxe_parent "$dev")
    ip=$(netdev_ipv4 "$netdev")
    [[ -n $ip ]] || return 1
    idx=$(roce_v2_gid_index "$dev" "$ip")
    [[ -n $idx ]] || return 1
    echo "RDMASCHED_DEVICE=$dev RDMASCHED_GID_INDEX=$idx RDMASCHED_IP=$ip RDMASCHED_NETDEV=$netdev"
}

record() { # KEY=VALUE into the state file (what `down` removes)
    mkdir -p "$STATE_DIR"
    grep -qxF "$1" "$STATE_DIR/state" 2>/dev/null || echo "$1" >>"$STATE_DIR/state"
}

# ---- commands ----------------------------------------------------------------------------------

cmd_up() {
    local netdev=${1:-} dev line
    need_tool ip iproute2

    # Already up? Then this is a no-op and needs no root.
    if [[ -n $netdev || -e /sys/class/net/$DUMMY ]]; then
        dev=$(rxe_on_netdev "${netdev:-$DUMMY}")
        if [[ -n $dev ]] && line=$(machine_line "$dev"); then
            say "$dev on ${netdev:-$DUMMY} is already up"
            report_up "$line"
            return 0
        fi
    fi

    need_root up
    if ! rxe_loaded; then
        [[ -e /proc/modules ]] || no_rxe
        command -v modprobe >/dev/null 2>&1 || {
            local rxe_in_tree
            rxe_in_tree=$(find "/lib/modules/$(uname -r)" -name 'rdma_rxe.ko*' 2>/dev/null | head -n 1)
            [[ -n $rxe_in_tree ]] || no_rxe "modprobe is missing (package kmod) and no rdma_rxe.ko was found"
            need_tool modprobe kmod
        }
        local err
        if ! err=$(modprobe rdma_rxe 2>&1); then
            no_rxe "modprobe rdma_rxe failed: ${err:-no message}"
        fi
        say "loaded rdma_rxe"
    fi
    need_tool rdma iproute2

    if [[ -z $netdev ]]; then
        netdev=$DUMMY
        if [[ ! -e /sys/class/net/$netdev ]]; then
            modprobe dummy numdummies=0 2>/dev/null || true
            ip link add "$netdev" type dummy || die "$EXIT_FAIL" "cannot create the dummy interface $netdev"
            record "dummy=$netdev"
            say "created dummy interface $netdev"
        fi
        ip link set "$netdev" up
        if [[ -z $(netdev_ipv4 "$netdev") ]]; then
            ip addr add "$dummy_addr" dev "$netdev" ||
                die "$EXIT_FAIL" "cannot add $dummy_addr to $netdev"
        fi
    else
        [[ -e /sys/class/net/$netdev ]] || die "$EXIT_FAIL" "no network interface '$netdev'"
        ip link show dev "$netdev" | grep -q '[<,]UP[,>]' ||
            die "$EXIT_FAIL" "$netdev is down (ip link set $netdev up)"
        [[ -n $(netdev_ipv4 "$netdev") ]] ||
            die "$EXIT_FAIL" "$netdev has no IPv4 address, so no RoCE v2 IPv4 GID; add one" \
                "(ip addr add ADDR/PREFIX dev $netdev) or run 'up' without NETDEV for a dummy"
    fi

    dev=$(rxe_on_netdev "$netdev")
    if [[ -z $dev ]]; then
        local n=0
        while [[ -e $IB/rxe$n ]]; do n=$((n + 1)); done
        dev=rxe$n
        local err
        err=$(rdma link add "$dev" type rxe netdev "$netdev" 2>&1) ||
            die "$EXIT_FAIL" "rdma link add $dev type rxe netdev $netdev failed: $err"
        record "rxe=$dev"
        say "created $dev on $netdev"
    else
        say "reusing $dev on $netdev"
    fi

    local deadline=$((SECONDS + setup_timeout))
    until line=$(machine_line "$dev"); do
        if ((SECONDS >= deadline)); then
            say "port state: $(port_state "$dev" || echo unknown); GIDs:"
            print_gids "$dev" >&2
            die "$EXIT_FAIL" "$dev did not become ACTIVE with a RoCE v2 IPv4 GID within $setup_timeout s"
        fi
        sleep 0.2
    done
    report_up "$line"
}

report_up() { # LINE
    local line=$1 word dev='' idx='' ip='' netdev=''
    for word in $line; do
        case $word in
        RDMASCHED_DEVICE=*) dev=${word#*=} ;;
        RDMASCHED_GID_INDEX=*) idx=${word#*=} ;;
        RDMASCHED_IP=*) ip=${word#*=} ;;
        RDMASCHED_NETDEV=*) netdev=${word#*=} ;;
        esac
    done
    say "device $dev on $netdev ($ip): port 1 ACTIVE; RoCE v2 IPv4 GID index $idx (::ffff:$ip)"
    say "e.g. ib_write_lat -d $dev -x $idx -F   (server), then the same plus $ip (client)"
    echo "$line"
}

cmd_down() {
    need_root down
    local line dev removed=0
    if [[ -r $STATE_DIR/state ]]; then
        while IFS='=' read -r key value; do
            case $key in
            rxe)
                if [[ -e $IB/$value ]]; then
                    rdma link delete "$value" && say "removed $value" && removed=1
                fi
                ;;
            esac
        done <"$STATE_DIR/state"
    fi
    # rxe devices on our dummy, even without a state file (e.g. /run was cleared)
    if [[ -e /sys/class/net/$DUMMY ]]; then
        dev=$(rxe_on_netdev "$DUMMY")
        if [[ -n $dev ]]; then
            rdma link delete "$dev" && say "removed $dev" && removed=1
        fi
        ip link delete "$DUMMY" && say "removed dummy interface $DUMMY" && removed=1
    fi
    rm -rf "$STATE_DIR"
    ((removed)) || say "nothing to remove"
    return 0
}

cmd_status() {
    if [[ ! -d $IB ]] && ! rxe_loaded && ! rxe_loadable; then
        no_rxe
    fi
    local d dev found=0 line='' kind
    if [[ -d $IB ]]; then
        for d in "$IB"/*; do
            [[ -e $d ]] || continue
            dev=$(basename "$d")
            found=1
            kind="node type $(cut -d' ' -f2- "$d/node_type" 2>/dev/null || echo '?')"
            [[ -r $d/parent ]] && kind="rxe on $(cat "$d/parent"), $kind"
            echo "$dev: $kind" >&2
            local p
            for p in "$d"/ports/*; do
                [[ -e $p ]] || continue
                echo "  port $(basename "$p"): $(cut -d' ' -f2- "$p/state" 2>/dev/null)" \
                    "($(cut -d' ' -f2- "$p/phys_state" 2>/dev/null)), active_mtu" \
                    "$(ibv_devinfo -d "$dev" 2>/dev/null | awk '$1 == "active_mtu:" {print $2; exit}')" >&2
            done
            echo "    GIDs:" >&2
            print_gids "$dev" >&2
        done
    fi
    ((found)) || say "no RDMA devices (rdma_rxe $(rxe_loaded && echo loaded || echo 'not loaded'))"
    for dev in $(rxe_devices); do
        if line=$(machine_line "$dev"); then
            echo "$line"
            return 0
        fi
    done
    say "no ACTIVE rxe device with a RoCE v2 IPv4 GID; run: $prog up [NETDEV]"
    return "$EXIT_FAIL"
}

main() {
    (($#)) || { usage >&2; exit "$EXIT_USAGE"; }
    local cmd=$1
    shift
    case $cmd in
    up)
        (($# <= 1)) || die "$EXIT_USAGE" "usage: $prog up [NETDEV]"
        cmd_up "$@"
        ;;
    down)
        (($# == 0)) || die "$EXIT_USAGE" "usage: $prog down"
        cmd_down
        ;;
    status)
        (($# == 0)) || die "$EXIT_USAGE" "usage: $prog status"
        cmd_status
        ;;
    -h | --help | help) usage ;;
    *)
        usage >&2
        exit "$EXIT_USAGE"
        ;;
    esac
}

main "$@"
