#!/usr/bin/env bash
# tests/vm/run-in-vm.sh: run a command inside qemu VM(s) that have a real Soft-RoCE device.
#
# Usage: tests/vm/run-in-vm.sh [OPTIONS] -- COMMAND...
#   --hosts 1|2        one VM (2 vCPU, 2 GiB; rxe on a dummy netdev) or two VMs (1 vCPU, 1 GiB
#                      each; rxe on eth0, joined by a virtual wire 198.51.100.0/24)  [1]
#   --timeout SECONDS  hard limit for the whole VM run, boot included; then qemu is killed [900]
#   --results DIR      host directory shared writable with the guest as $RDMASCHED_RESULTS
#                      (two hosts: DIR/a and DIR/b); the console logs land in DIR too.
#                      Default: a temporary directory, removed at the end.
#   --env NAME=VALUE   export NAME=VALUE inside the guest (repeatable); CI is passed on if set
#   --no-setup         skip `soft-roce-setup.sh up` inside (for debugging the setup itself)
#   --shell            after COMMAND (COMMAND optional), an interactive root shell on the
#                      console (one host only; needs a terminal)
#   --quiet            do not stream the guest console; print its tail on failure
#
# COMMAND runs with bash in the checkout, which the guest mounts read-only at the same absolute
# path as on the host. One word is a shell snippet (bash -c WORD); several are an argv.
# Inside, COMMAND sees:
#   RDMASCHED_DEVICE RDMASCHED_GID_INDEX RDMASCHED_IP RDMASCHED_NETDEV  (from soft-roce-setup.sh)
#   RDMASCHED_SELF_IP (= RDMASCHED_IP), RDMASCHED_RESULTS, RDMASCHED_IN_VM=1,
#   RDMASCHED_VM_HOSTS=1|2, and with --hosts 2 RDMASCHED_VM_ROLE=a|b, RDMASCHED_PEER_IP;
#   PYTHONPATH=<checkout>, PYTHONDONTWRITEBYTECODE=1, `ulimit -l unlimited`.
#
# Exit code: COMMAND's (two hosts: the first harness failure below, else a's COMMAND if
# non-zero, else b's), or
#   2 usage, 120 host preparation failed (packages, image), 121 a VM did not boot or stopped
#   before COMMAND finished, 122 Soft-RoCE set-up (or the two-host barrier) failed in the
#   guest, 123 two hosts: the virtual wire stalled (a guest kernel reported a virtio-net
#   transmit timeout: qemu's emulated NIC stopped taking packets, whatever COMMAND did; the
#   VMs are stopped at once), 124 timeout (qemu killed).
#
# Environment: RDMASCHED_VM_CACHE (image cache, default /var/cache/rdmasched-vm),
#   RDMASCHED_VM_MIRROR (Debian mirror for the image), RDMASCHED_VM_BOOT_TIMEOUT (seconds
#   until the guest must have started its init, default 300), RDMASCHED_VM_CPUS and
#   RDMASCHED_VM_MEM (per VM; defaults 2 and 2G for one host, 1 and 1G each for two).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$here/lib.sh"

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

hosts=1 timeout=900 results='' setup=1 shell=0 quiet=0
env_pass=()
while (($#)); do
    case $1 in
    --hosts) hosts=${2-}; shift ;;
    --hosts=*) hosts=${1#*=} ;;
    --timeout) timeout=${2-}; shift ;;
    --timeout=*) timeout=${1#*=} ;;
    --results) results=${2-}; shift ;;
    --results=*) results=${1#*=} ;;
    --env) env_pass+=("${2-}"); shift ;;
    --env=*) env_pass+=("${1#*=}") ;;
    --no-setup) setup=0 ;;
    --shell) shell=1 ;;
    --quiet) quiet=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) usage >&2; vm_die "$VM_EXIT_USAGE" "unknown argument: $1 (COMMAND goes after --)" ;;
    esac
    shift
done
cmd=("$@")

[[ $hosts == 1 || $hosts == 2 ]] || vm_die "$VM_EXIT_USAGE" "--hosts must be 1 or 2"
[[ $timeout =~ ^[1-9][0-9]*$ ]] || vm_die "$VM_EXIT_USAGE" "--timeout needs a whole number of seconds"
((${#cmd[@]} || shell)) || vm_die "$VM_EXIT_USAGE" "no COMMAND (usage: run-in-vm.sh [OPTIONS] -- COMMAND...)"
if ((shell)); then
    ((hosts == 1)) || vm_die "$VM_EXIT_USAGE" "--shell works with one host only"
    [[ -t 0 && -t 1 ]] || vm_die "$VM_EXIT_USAGE" "--shell needs a terminal"
    quiet=0
fi
for e in "${env_pass[@]}"; do
    [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || vm_die "$VM_EXIT_USAGE" "--env wants NAME=VALUE, got: $e"
done
[[ -n ${CI:-} ]] && env_pass+=("CI=$CI")
boot_timeout=${RDMASCHED_VM_BOOT_TIMEOUT:-300}
((EUID == 0)) || vm_die "$VM_EXIT_HOST" "run-in-vm.sh needs root (it installs host packages and builds the image)"

checkout=$(cd "$here/../.." && pwd -P)
[[ -f $checkout/soft-roce-setup.sh ]] || vm_die "$VM_EXIT_HOST" "no soft-roce-setup.sh in $checkout"

# ---- host preparation ----------------------------------------------------------------------
vm_ensure_host_packages qemu-system-x86_64:qemu-system-x86 tail:coreutils
image=$("$here/build-image.sh") || exit "$VM_EXIT_HOST"
for f in root.ext4 vmlinuz initrd.img; do
    [[ -f $image/$f ]] || vm_die "$VM_EXIT_HOST" "image $image lacks $f"
done

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/rdmasched-vm.XXXXXX")
keep_results=1
if [[ -z $results ]]; then
    results=$run_dir/results
    keep_results=0
fi
mkdir -p "$results"
results=$(cd "$results" && pwd -P)

# The guest mounts the shares at the host's paths, unless that path would hide the guest's own
# system directories.
guest_path() {
    case $1 in
    / | /bin | /bin/* | /boot | /boot/* | /dev | /dev/* | /etc | /etc/* | /lib* | /proc | /proc/* | \
        /run | /run/* | /sbin | /sbin/* | /sys | /sys/* | /usr | /usr/*)
        printf '/mnt/rdmasched-%s\n' "$2" ;;
    *) printf '%s\n' "$1" ;;
    esac
}

# ---- VM processes --------------------------------------------------------------------------
qemu_pids=()
tail_pids=()
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    local pid
    for pid in "${qemu_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${qemu_pids[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    for pid in "${tail_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf -- "$run_dir"
}
# shellcheck disable=SC2317  # called by the signal traps
interrupted() {
    vm_log "interrupted (signal $1): stopping the VM(s)"
    exit $((128 + $1))
}
trap cleanup EXIT
trap 'interrupted 2' INT
trap 'interrupted 15' TERM
trap 'interrupted 1' HUP

# free_udp_ports N: N distinct UDP ports free on 127.0.0.1 now.
free_udp_ports() {
    if command -v python3 >/dev/null; then
        python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
    else
        local ports=() p
        while ((${#ports[@]} < $1)); do
            p=$((20000 + RANDOM % 40000))
            [[ " ${ports[*]} " == *" $p "* ]] && continue
            ss -Hlun "sport = :$p" 2>/dev/null | grep -q . || ports+=("$p")
        done
        echo "${ports[*]}"
    fi
}

# qemu_esc PATH: PATH for a qemu option value (a comma is written twice).
qemu_esc() { printf '%s' "${1//,/,,}"; }

# console_log ROLE: the console log of the VM of ROLE ('' for one host).
console_log() { printf '%s' "$results/vm-console${1:+-$1}.log"; }

# start_vm ROLE: writes the job for the VM of ROLE ('' for one host) and starts qemu.
start_vm() {
    local role=$1 name=${1:-vm} ctl res cpus mem
    ctl=$run_dir/ctl-$name
    mkdir -p "$ctl"
    cp "$here/guest-init.sh" "$here/guest-barrier.py" "$here/guest-stalls.py" "$ctl/"
    res=$results
    [[ -n $role ]] && res=$results/$role
    mkdir -p "$res"

    local -a net=(-nic none)
    local netdev='' self_ip='' peer_ip='' hostname=rdmasched-vm
    if [[ -n $role ]]; then
        local mine=${udp_ports[0]} theirs=${udp_ports[1]} octet=1 peer_octet=2 mac=52:54:00:72:64:0a
        if [[ $role == b ]]; then
            mine=${udp_ports[1]} theirs=${udp_ports[0]} octet=2 peer_octet=1 mac=52:54:00:72:64:0b
        fi
        net=(-netdev "socket,id=wire,udp=127.0.0.1:$theirs,localaddr=127.0.0.1:$mine"
            -device "virtio-net-pci,netdev=wire,mac=$mac,romfile=")
        netdev=eth0 self_ip=198.51.100.$octet peer_ip=198.51.100.$peer_octet
        hostname=rdmasched-$role
        cpus=${RDMASCHED_VM_CPUS:-1} mem=${RDMASCHED_VM_MEM:-1G}
    else
        cpus=${RDMASCHED_VM_CPUS:-2} mem=${RDMASCHED_VM_MEM:-2G}
    fi

    {
        printf 'RS_ROLE=%q\nRS_HOSTS=%q\nRS_HOSTNAME=%q\n' "$role" "$hosts" "$hostname"
        printf 'RS_CHECKOUT=%q\nRS_RESULTS=%q\n' "$(guest_path "$checkout" checkout)" \
            "$(guest_path "$res" results)"
        printf 'RS_NETDEV=%q\nRS_SELF_IP=%q\nRS_PEER_IP=%q\n' "$netdev" "$self_ip" "$peer_ip"
        printf 'RS_SETUP=%q\nRS_SHELL=%q\nRS_TERM=%q\n' "$setup" "$shell" "${TERM:-linux}"
        printf 'RS_CMD=('
        ((${#cmd[@]})) && printf ' %q' "${cmd[@]}"
        printf ' )\nRS_ENV=('
        ((${#env_pass[@]})) && printf ' %q' "${env_pass[@]}"
        printf ' )\n'
    } >"$ctl/job.env"

    local log
    log=$(console_log "$role")
    : >"$log"
    local -a console=(-chardev "file,id=console,path=$(qemu_esc "$log")" -serial chardev:console)
    ((shell)) && console=(-serial mon:stdio)

    # One vCPU still gets maxcpus=2: qemu 7.2's TCG drops the guest's memory barriers when
    # no second vCPU can exist (CF_PARALLEL is max_cpus > 1; upstream stopped eliding them
    # in 8.1, "tcg: Do not elide memory barriers for !CF_PARALLEL in system mode"), and
    # virtio needs them against qemu's I/O thread: without them a guest's kick of the
    # wire's TX queue was lost now and then and the wire stalled for good (README: quirks).
    local smp=$cpus
    ((cpus == 1)) && smp=1,maxcpus=2
    # shellcheck disable=SC2054  # commas inside qemu option values
    local -a qemu=(qemu-system-x86_64 -name "rdmasched-$name" -nodefaults -no-user-config
        -accel tcg,thread=multi -cpu max -smp "$smp" -m "$mem"
        -display none -no-reboot
        -kernel "$image/vmlinuz" -initrd "$image/initrd.img"
        -append "root=/dev/vda rw console=ttyS0 init=/sbin/rdmasched-init panic=-1 quiet loglevel=4 mitigations=off"
        -drive "file=$(qemu_esc "$image/root.ext4"),format=raw,if=virtio,cache=unsafe"
        -snapshot
        -virtfs "local,path=$(qemu_esc "$checkout"),mount_tag=rsrepo,security_model=none,readonly=on"
        -virtfs "local,path=$(qemu_esc "$res"),mount_tag=rsres,security_model=none"
        -virtfs "local,path=$(qemu_esc "$ctl"),mount_tag=rsctl,security_model=none"
        "${console[@]}" "${net[@]}")
    if ((shell)); then
        # An explicit stdin: a background job would get /dev/null.
        "${qemu[@]}" 0<&0 &
    else
        "${qemu[@]}" </dev/null >"$run_dir/qemu-$name.out" 2>&1 &
    fi
    qemu_pids+=($!)
    vm_log "started VM ${role:-(one host)}: qemu pid $!, console $log"

    if ((!quiet)); then
        local prefix=''
        [[ -n $role ]] && prefix="$role| "
        tail -n +1 -F --pid="$!" "$log" 2>/dev/null | sed -u "s/^/$prefix/" &
        tail_pids+=($!)
    fi
}

roles=('')
if ((hosts == 2)); then
    roles=(a b)
    read -r -a udp_ports <<<"$(free_udp_ports 2)"
    vm_log "two hosts: wire on UDP 127.0.0.1:${udp_ports[0]} <-> 127.0.0.1:${udp_ports[1]}"
fi
vm_log "checkout $checkout (read-only), results $results"
# the host's UDP counters (/proc/net/snmp): the two-host wire is qemu's UDP on 127.0.0.1, and
# a datagram that finds the receiving qemu's socket buffer full is dropped there
host_udp() { awk '/^Udp:/ { if (!seen) { split($0, k); seen = 1 } else for (i = 2; i <= NF; i++) if (k[i] == "'"$1"'") print $i }' /proc/net/snmp 2>/dev/null; }
udp_rcvbuf_before=$(host_udp RcvbufErrors)
t_boot=$SECONDS
for role in "${roles[@]}"; do
    start_vm "$role"
done

# ---- watch: timeout, boot timeout, a failed peer, a stalled wire, all VMs gone -------------
# status: '' (all VMs ended by themselves), timeout, boot-timeout, peer-failed (two hosts:
# one VM ended without finishing COMMAND, so the other is stopped instead of waiting for it),
# or wire-stalled (two hosts: a guest kernel's NETDEV WATCHDOG fired on the wire's
# virtio-net, i.e. qemu's emulated NIC took none of its packets for 5 s; seen under qemu
# 7.2's TCG before one-vCPU VMs got maxcpus=2, never caused by what runs in the guest;
# nothing sent afterwards would arrive, so the VMs are stopped instead of letting every test
# time out).
status='' failed_role='' stalled_role=''
while :; do
    alive=0
    for i in "${!qemu_pids[@]}"; do
        if kill -0 "${qemu_pids[i]}" 2>/dev/null; then
            alive=$((alive + 1))
        elif ((hosts == 2)) && [[ -z $failed_role ]] &&
            [[ $(cat "$run_dir/ctl-${roles[i]}/stage" 2>/dev/null) != "done" ]]; then
            failed_role=${roles[i]}
        fi
    done
    ((alive == 0)) && break
    if [[ -n $failed_role ]]; then
        status=peer-failed
        vm_log "VM $failed_role ended without finishing COMMAND: stopping the other VM"
        break
    fi
    if ((hosts == 2)); then
        for role in "${roles[@]}"; do
            if grep -q 'NETDEV WATCHDOG' "$(console_log "$role")" 2>/dev/null; then
                stalled_role=$role
                break
            fi
        done
        if [[ -n $stalled_role ]]; then
            status=wire-stalled
            vm_log "VM $stalled_role: the virtual wire stalled: its kernel reports a virtio-net" \
                "transmit timeout (NETDEV WATCHDOG; qemu's emulated NIC stopped taking packets)." \
                "An emulator fault, not a test result: stopping both VMs (exit $VM_EXIT_WIRE)"
            break
        fi
    fi
    elapsed=$((SECONDS - t_boot))
    if ((elapsed >= timeout)); then
        status=timeout
        break
    fi
    if ((elapsed >= boot_timeout)); then
        for role in "${roles[@]}"; do
            if [[ ! -e $run_dir/ctl-${role:-vm}/stage ]]; then
                status=boot-timeout
            fi
        done
        [[ -n $status ]] && break
    fi
    sleep 1
done
if [[ -n $status ]]; then
    for pid in "${qemu_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    sleep 0.5
fi
for pid in "${qemu_pids[@]}"; do
    [[ -n $status ]] && { kill -KILL "$pid" 2>/dev/null || true; }
    wait "$pid" 2>/dev/null || true
done
for pid in "${tail_pids[@]}"; do
    wait "$pid" 2>/dev/null || true
done
tail_pids=()
qemu_pids=()

# ---- verdict -------------------------------------------------------------------------------
harness_code='' command_code=''
for role in "${roles[@]}"; do
    name=${role:-vm}
    ctl=$run_dir/ctl-$name
    label="VM${role:+ $role}"
    log=$(console_log "$role")
    stage=$(cat "$ctl/stage" 2>/dev/null || echo none)
    rc=''
    [[ -f $ctl/rc ]] && rc=$(<"$ctl/rc")
    problem=''
    if [[ $status == wire-stalled ]]; then
        code=$VM_EXIT_WIRE
        problem="stopped: the virtual wire stalled (VM $stalled_role's NETDEV WATCHDOG; guest stage: $stage)"
    elif [[ $status == peer-failed && -z $rc && $role != "$failed_role" ]]; then
        code=$VM_EXIT_BOOT
        problem="stopped because VM $failed_role failed (guest stage: $stage)"
    elif [[ $status == timeout && -z $rc ]]; then
        code=$VM_EXIT_TIMEOUT
        problem="timed out after $timeout s (guest stage: $stage); qemu killed"
    elif [[ $status == boot-timeout && $stage == none ]]; then
        code=$VM_EXIT_BOOT
        problem="did not boot within $boot_timeout s (RDMASCHED_VM_BOOT_TIMEOUT); qemu killed"
    elif [[ -z $rc ]]; then
        code=$VM_EXIT_BOOT
        if [[ $stage == none ]]; then
            problem="did not boot: qemu exited before the guest's init started"
        else
            problem="stopped before COMMAND finished (guest stage: $stage): crash or power-off"
        fi
    elif [[ $stage == setup-failed ]]; then
        code=$VM_EXIT_SETUP
        problem="Soft-RoCE set-up failed in the guest (see the console above)"
    else
        code=$rc
    fi
    if [[ -n $problem ]]; then
        vm_log "$label: ERROR: $problem"
        if grep -qv 'terminating on signal' "$run_dir/qemu-$name.out" 2>/dev/null; then
            vm_log "$label: qemu said:"
            grep -v 'terminating on signal' "$run_dir/qemu-$name.out" | sed 's/^/    /' >&2 || true
        fi
        if ((quiet)) || [[ $stage == none ]]; then
            vm_log "$label: last lines of the console ($log):"
            tail -n 40 "$log" | sed 's/^/    /' >&2
        fi
    else
        vm_log "$label: COMMAND exited with $code"
    fi
    if [[ -n $problem && -z $harness_code && ($status != peer-failed || $role == "$failed_role") ]]; then
        harness_code=$code
    elif [[ -z $problem && $code != 0 && -z $command_code ]]; then
        command_code=$code
    fi
done
# ---- two hosts: the wire's account ---------------------------------------------------------
# Each guest wrote wire.txt after COMMAND and an end barrier (guest-init.sh's wire_account).
# Once the wire is quiet a guest's qdisc has handed its NIC no packet that the NIC did not
# send: more means packets were left in the TX ring, the guest's kick to qemu lost (the fault
# of the NETDEV WATCHDOG above, caught before the ring filled: tests/vm/README.md). A
# COMMAND that failed on such a wire is void (exit 123), with this evidence.
VM_STALL_VOID_MS=10000
# wire_value FILE KEY: KEY's value in FILE, empty when either is missing (never fails: set -e)
wire_value() { [[ -f $1 ]] && awk -v k="$2" '$1 == k { print $2; exit }' "$1" 2>/dev/null || true; }
wire_fault=''
if ((hosts == 2)); then
    if [[ -f $results/a/wire.txt && -f $results/b/wire.txt ]]; then
        for x in a b; do
            y=$([[ $x == a ]] && echo b || echo a)
            fx=$results/$x/wire.txt fy=$results/$y/wire.txt
            handed=$(wire_value "$fx" qdisc.sent_packets) sent=$(wire_value "$fx" net.tx_packets)
            vm_log "wire $x->$y: $x's qdisc handed its NIC ${handed:-?} packets, the NIC sent" \
                "${sent:-?}, $y's NIC received $(wire_value "$fy" net.rx_packets) (dropped" \
                "$(wire_value "$fy" net.rx_dropped)); RoCE: $x's rxe sent" \
                "$(wire_value "$fx" rxe.sent_pkts), $y's received $(wire_value "$fy" rxe.rcvd_pkts);" \
                "$x resent after $(wire_value "$fx" rxe.completer_retry_err) timeouts and" \
                "$(wire_value "$fx" rxe.rcvd_seq_err) sequence NAKs, gave up" \
                "$(wire_value "$fx" rxe.retry_exceeded_err) times (retries exhausted); $y:" \
                "$(wire_value "$fy" rxe.out_of_seq_request) out-of-sequence," \
                "$(wire_value "$fy" rxe.duplicate_request) duplicate requests;" \
                "end barrier $(wire_value "$fx" end_barrier)"
            if [[ $handed =~ ^[0-9]+$ && $sent =~ ^[0-9]+$ ]] && ((handed > sent)); then
                wire_fault+="${wire_fault:+; }$((handed - sent)) packets left in VM $x's TX ring"
            fi
        done
    else
        vm_log "wire: no account (a guest wrote no wire.txt)"
    fi
    udp_rcvbuf_after=$(host_udp RcvbufErrors)
    if [[ $udp_rcvbuf_before =~ ^[0-9]+$ && $udp_rcvbuf_after =~ ^[0-9]+$ ]]; then
        vm_log "host: UDP receive-buffer drops during the run: $((udp_rcvbuf_after - udp_rcvbuf_before))" \
            "(all of this host's UDP; the wire's datagrams are among them; RC resends what is lost)"
    fi
    # A guest not run at all for as long as the tests' shortest wait for an answer (10 s: the
    # hot ping's, a verbs send's completion) fails them whatever they do: its account too.
    for x in a b; do
        st=$results/$x/stalls.txt
        worst=$(wire_value "$st" max_stall_ms)
        nstalls=$(wire_value "$st" stalls_over_1s)
        vm_log "VM $x: longest time not run during COMMAND: ${worst:-under 1000} ms" \
            "(${nstalls:-no} stalls over 1 s; guest-stalls.py)"
        if [[ $worst =~ ^[0-9]+$ ]] && ((worst >= VM_STALL_VOID_MS)); then
            wire_fault+="${wire_fault:+; }VM $x was not run for $worst ms (at guest uptime"
            wire_fault+=" $(awk -v w="$worst" '$1 == "stall" && $3 == w { print $2 "s"; exit }' "$st" || true))"
        fi
    done
    if [[ -n $wire_fault && -z $harness_code && -n $command_code ]]; then
        vm_log "the virtual wire stalled: $wire_fault (an emulator or host fault: qemu did not" \
            "take what a guest queued, or did not run a guest). COMMAND's failure" \
            "($command_code) is void: exit $VM_EXIT_WIRE"
        harness_code=$VM_EXIT_WIRE
    fi
fi
final=${harness_code:-${command_code:-0}}
vm_log "done in $((SECONDS - t_boot)) s of VM time (whole run $SECONDS s)"
if ((keep_results)); then
    vm_log "results and console logs in $results"
fi
exit "$final"
