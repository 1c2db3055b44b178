# shellcheck shell=bash
# tests/vm/guest-init.sh: PID 1's work inside the Soft-RoCE test VM.
#
# Not run on the host. run-in-vm.sh copies it, with job.env, into the per-run control share;
# the image's /sbin/rdmasched-init mounts that share at /run/rdmasched-ctl and execs this file
# with bash. Steps: mounts, network, checkout and results shares, `soft-roce-setup.sh up`,
# (two hosts: a barrier with the peer), COMMAND beside guest-stalls.py (two hosts: then an
# end barrier and the wire's account, wire.txt and dmesg.txt), then the exit code back to the host in
# /run/rdmasched-ctl/rc and power off. Progress goes to the console (ttyS0), which the host
# streams; the host learns how far the guest got from /run/rdmasched-ctl/stage.
#
# PID 1 must never exit on its own (the kernel would panic), so no `set -e` here: every step
# checks its result and ends in finish().
set -u

ctl=/run/rdmasched-ctl
# shellcheck source=/dev/null
. "$ctl/job.env"

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=${RS_TERM:-linux}
tag="[guest${RS_ROLE:+ $RS_ROLE}]"

say() {
    local up
    up=$(cut -d' ' -f1 /proc/uptime)
    printf '%s %6ss %s\n' "$tag" "$up" "$*"
}

stage() {
    echo "$1" >"$ctl/stage.tmp" && mv -f "$ctl/stage.tmp" "$ctl/stage"
}

# finish RC [STAGE]: hand RC to the host and power off.
finish() {
    local rc=$1
    [[ -n ${2:-} ]] && stage "$2"
    cd /
    sync
    mountpoint -q "$RS_RESULTS" && umount "$RS_RESULTS"
    echo "$rc" >"$ctl/rc.tmp" && mv -f "$ctl/rc.tmp" "$ctl/rc"
    say "exit code $rc; powering off"
    sync
    umount "$ctl" 2>/dev/null
    echo o >/proc/sysrq-trigger
    sleep 60
}

fail_setup() {
    say "SETUP FAILED: $*"
    finish 122 setup-failed
}

# wire_account BARRIER: what this guest's kernel counted on the wire, one "key value" a line
# (two hosts, after COMMAND and an end barrier with the peer; run-in-vm.sh compares the two
# guests' files): the NIC's packets, the qdisc's (handed to the NIC's TX ring: more than the
# NIC's tx_packets once the wire is quiet means packets left in the ring, a lost kick), rxe's
# own counters (sent, received, retries, sequence errors) and UDP's.
wire_account() {
    local netdev=${RDMASCHED_NETDEV:-eth0} dev=${RDMASCHED_DEVICE:-} f qdisc
    echo "end_barrier $1"
    for f in rx_packets tx_packets rx_dropped tx_dropped rx_errors tx_errors; do
        echo "net.$f $(cat "/sys/class/net/$netdev/statistics/$f" 2>/dev/null || echo -1)"
    done
    qdisc=$(tc -s qdisc show dev "$netdev" 2>/dev/null | awk '/Sent/ {print $4; exit}')
    echo "qdisc.sent_packets ${qdisc:--1}"
    if [[ -n $dev && -d /sys/class/infiniband/$dev/ports/1/hw_counters ]]; then
        for f in /sys/class/infiniband/"$dev"/ports/1/hw_counters/*; do
            echo "rxe.${f##*/} $(<"$f")"
        done
    fi
    awk '/^Udp:/ { if (!seen) { split($0, k); seen = 1 } else for (i = 2; i <= NF; i++) print "udp." k[i], $i }' /proc/net/snmp
}

stage booted
say "booted (kernel $(uname -r)); setting up"

# The initramfs moved /proc, /sys, /dev and /run here already: guard every mount.
mkdir -p /dev/pts /dev/shm
mountpoint -q /dev/pts || mount -t devpts -o gid=5,mode=620 devpts /dev/pts
mountpoint -q /dev/shm || mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mountpoint -q /tmp || mount -t tmpfs -o mode=1777 tmpfs /tmp
echo "$RS_HOSTNAME" >/proc/sys/kernel/hostname
ip link set lo up || fail_setup "cannot bring up lo"

# Shares: the checkout read-only at the host's path, the results writable.
share() { # TAG DIR MODE
    mkdir -p "$2" && mount -t 9p -o "trans=virtio,version=9p2000.L,msize=262144,$3" "$1" "$2"
}
share rsrepo "$RS_CHECKOUT" ro || fail_setup "cannot mount the checkout at $RS_CHECKOUT"
share rsres "$RS_RESULTS" rw || fail_setup "cannot mount the results at $RS_RESULTS"

ulimit -l unlimited
ulimit -n 65536 2>/dev/null

# Two hosts: the virtual wire (virtio-net, no udev here so load the driver by hand).
if [[ -n ${RS_NETDEV:-} ]]; then
    modprobe virtio_net || fail_setup "modprobe virtio_net failed"
    for _ in $(seq 50); do [[ -e /sys/class/net/$RS_NETDEV ]] && break; sleep 0.1; done
    if ! ip addr add "$RS_SELF_IP/24" dev "$RS_NETDEV" || ! ip link set "$RS_NETDEV" up; then
        fail_setup "cannot configure $RS_NETDEV with $RS_SELF_IP/24"
    fi
    say "wire: $RS_NETDEV $RS_SELF_IP/24, peer $RS_PEER_IP"
fi

# The checkout is read-only: Hypothesis keeps its example database in /tmp instead.
export HYPOTHESIS_STORAGE_DIRECTORY=${HYPOTHESIS_STORAGE_DIRECTORY:-/tmp/hypothesis}
export RDMASCHED_IN_VM=1 RDMASCHED_VM_HOSTS=$RS_HOSTS RDMASCHED_RESULTS=$RS_RESULTS
if [[ -n ${RS_ROLE:-} ]]; then
    export RDMASCHED_VM_ROLE=$RS_ROLE RDMASCHED_PEER_IP=$RS_PEER_IP
fi

if ((RS_SETUP)); then
    say "soft-roce-setup.sh up ${RS_NETDEV:-}"
    setup_out=$(bash "$RS_CHECKOUT/soft-roce-setup.sh" up ${RS_NETDEV:+"$RS_NETDEV"})
    setup_rc=$?
    ((setup_rc == 0)) || fail_setup "soft-roce-setup.sh up exited with $setup_rc"
    line=$(tail -n 1 <<<"$setup_out")
    [[ $line =~ ^RDMASCHED_[A-Z_]+=[^[:space:]]+([[:space:]]+RDMASCHED_[A-Z_]+=[^[:space:]]+)*$ ]] ||
        fail_setup "unexpected last line from soft-roce-setup.sh: $line"
    read -r -a assignments <<<"$line"
    export "${assignments[@]}"
    export RDMASCHED_SELF_IP=${RDMASCHED_IP:-}
    say "Soft-RoCE ready: $line"
fi

for assignment in "${RS_ENV[@]}"; do
    export "${assignment?}"
done

if [[ -n ${RS_ROLE:-} ]]; then
    say "waiting for the peer ($RS_PEER_IP)"
    python3 "$ctl/guest-barrier.py" "$RS_SELF_IP" "$RS_PEER_IP" "${RS_BARRIER_TIMEOUT:-180}" ||
        fail_setup "the peer VM did not reach its barrier"
fi

stage running
cd "$RS_CHECKOUT" || fail_setup "cannot cd to $RS_CHECKOUT"
export PYTHONPATH=$RS_CHECKOUT${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1
rc=0
# beside COMMAND: how long this VM was not run at all (guest-stalls.py; read by run-in-vm.sh)
python3 "$ctl/guest-stalls.py" "$RS_RESULTS/stalls.txt" </dev/null &
stalls_pid=$!
if ((${#RS_CMD[@]} == 1)); then
    say "running: bash -c ${RS_CMD[0]@Q}"
    bash -c "${RS_CMD[0]}" </dev/null
    rc=$?
elif ((${#RS_CMD[@]} > 1)); then
    say "running: ${RS_CMD[*]@Q}"
    "${RS_CMD[@]}" </dev/null
    rc=$?
fi
kill "$stalls_pid" 2>/dev/null
if [[ -n ${RS_ROLE:-} ]]; then
    # Both guests done, the wire quiet: then the counters of the two ends can be compared.
    barrier=ok
    python3 "$ctl/guest-barrier.py" "$RS_SELF_IP" "$RS_PEER_IP" 60 7471 ||
        barrier=failed
    sleep 1
    wire_account "$barrier" >"$RS_RESULTS/wire.txt"
    dmesg >"$RS_RESULTS/dmesg.txt" 2>&1
fi
if ((RS_SHELL)); then
    say "interactive shell (exit it to power off; its exit code is the run's)"
    setsid -c bash -i </dev/ttyS0 >/dev/ttyS0 2>&1
    rc=$?
fi
finish "$rc" "done"
