#!/usr/bin/env bash
# The Slurm tier: deploy/slurm/ on a real Slurm (Debian's slurm-wlm and munge) on this host.
#
#   scripts/test-slurm.sh          install, start the cluster, run tests/slurm, stop it
#   scripts/test-slurm.sh up       install and start the cluster; print its variables
#   scripts/test-slurm.sh down     stop what `up` started (by the pids it recorded)
#
# The cluster (docs/SLURM.md, "What the test runs"): its own munged on a private socket and
# key, one slurmctld, and three slurmd: node `<this host>` in this host's network (the
# ordinary one-node set-up) and nodes rs1 and rs2, each in a network namespace of its own
# (rdmasched-rs1, -rs2) with its own address on a bridge (rdmasched-br0, 10.231.0.0/24;
# Debian's slurmd is not built with --enable-multiple-slurmd, so two slurmd on one host need
# two network stacks). Partitions `one` (this host) and `two` (rs1, rs2). The tree topology
# (topology.conf next to slurm.conf) is the job's topology. The epilog is
# deploy/slurm/epilog.sh. No accounting; ProctrackType=proctrack/linuxproc (this machine
# has no cgroup hierarchy slurmd could use). Ports 16817 (slurmctld) and 16818 (slurmd),
# apart from a system Slurm's.
#
# Everything lives in $RDMASCHED_SLURM_DIR (default /run/rdmasched-slurm); a second run, or
# one after a run that was killed, first stops what the last one left (its recorded pids,
# its namespaces, its bridge) and starts afresh. Needs root. With CI=true a cluster that
# cannot be started fails the run; elsewhere the tier is skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
D=${RDMASCHED_SLURM_DIR:-/run/rdmasched-slurm}
VENV=${RDMASCHED_VENV:-$REPO/.venv}
RESULTS=$(realpath -m "${RDMASCHED_RESULTS:-results}")
NETNS=(rdmasched-rs1 rdmasched-rs2)
BRIDGE=rdmasched-br0
NET=10.231.0
CTLD_PORT=16817
SLURMD_PORT=16818
HOST=$(hostname -s)

say() { echo "test-slurm: $*" >&2; }

cannot() {
    if [ "${CI:-}" = true ]; then
        say "the Slurm tier cannot run: $*; failing because CI=true"
        exit 1
    fi
    say "Slurm tier SKIPPED: $*"
    exit 0
}
# `cannot` after `up` started something: stop it (in `all` mode the EXIT trap does)
on_exit_up() { [ "${MODE:-}" = up ] && [ "${UP_DONE:-0}" != 1 ] && down; return 0; }

# ---- stop: by recorded pid only (never by name: other Slurms may run on this host) -------
stop_pid() {  # stop_pid FILE: TERM the process it names, KILL it after 5 s
    local f=$1 pid
    [ -s "$f" ] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

down() {
    [ -d "$D" ] || return 0
    local f jobs
    # jobs still running (a run killed mid-test): cancel them while slurmctld is up, so
    # their steps end with them
    if [ -s "$D/pids/slurmctld.pid" ] && kill -0 "$(cat "$D/pids/slurmctld.pid")" 2>/dev/null; then
        jobs=$(SLURM_CONF=$D/etc/slurm.conf timeout 10 squeue -h -o %i 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            SLURM_CONF=$D/etc/slurm.conf timeout 10 scancel $jobs 2>/dev/null || true
            sleep 2
        fi
    fi
    for f in "$D"/pids/slurmd-*.pid; do [ -e "$f" ] && stop_pid "$f"; done
    stop_pid "$D/pids/slurmctld.pid"
    stop_pid "$D/pids/munged.pid"
    # what is left in our namespaces (a step whose slurmstepd was killed with its slurmd)
    for ns in "${NETNS[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    say "stopped the cluster in $D"
}

# ---- install ------------------------------------------------------------------------------
install() {
    local need=() p
    for p in slurm-wlm munge iproute2; do  # iproute2: `ip`, for the network namespaces
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            need+=("$p")
    done
    ((${#need[@]})) || return 0
    command -v apt-get >/dev/null || cannot "${need[*]} missing and there is no apt-get"
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n1)" ]; then
        apt-get update -qq
    fi
    # policy-rc.d (or no systemd) keeps the packages' own services from starting; ours
    # below run from $D
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# ---- the two namespaced nodes -----------------------------------------------------------
netns_up() {  # the bridge on this host at $NET.1, node rsN at $NET.1N in its namespace
    ip link add "$BRIDGE" type bridge || return 1
    ip addr add "$NET.1/24" dev "$BRIDGE" || return 1
    ip link set "$BRIDGE" up || return 1
    local i=1 ns
    for ns in "${NETNS[@]}"; do
        ip netns add "$ns" || return 1
        ip link add "rdms-h$i" type veth peer name eth0 netns "$ns" || return 1
        ip link set "rdms-h$i" master "$BRIDGE" up || return 1
        ip -n "$ns" addr add "$NET.1$i/24" dev eth0 || return 1
        ip -n "$ns" link set eth0 up || return 1
        ip -n "$ns" link set lo up || return 1
        i=$((i + 1))
    done
}

write_conf() {  # slurm.conf, topology.conf, the epilog's wrapper
    local cpus mem two=$1
    cpus=$(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -n1)
    mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -n1)
    cat >"$D/etc/slurm.conf" <<EOF
# written by scripts/test-slurm.sh: a cluster on one host (docs/SLURM.md)
ClusterName=rdmasched-test
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$D/ctld
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/pids/slurmctld.pid
SlurmdPidFile=$D/pids/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
TopologyPlugin=topology/tree
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=600
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
Epilog=$D/etc/epilog
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=one Nodes=$HOST Default=YES MaxTime=10 State=UP
EOF
    if [ "$two" = 1 ]; then
        # the namespaced nodes reach slurmctld at this host's address on the bridge
        cat >>"$D/etc/slurm.conf" <<EOF
SlurmctldAddr=$NET.1
NodeName=rs1 NodeAddr=$NET.11 CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=rs2 NodeAddr=$NET.12 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=two Nodes=rs[1-2] MaxTime=10 State=UP
EOF
    fi
    # leaf switches listed rs2's first: rdmasched's node ids follow the topology, not the
    # node list, which the test checks
    {
        echo "# written by scripts/test-slurm.sh: Slurm's tree topology, which rdmasched reads"
        [ "$two" = 1 ] && echo "SwitchName=leaf2 Nodes=rs2" && echo "SwitchName=leaf1 Nodes=rs1"
        echo "SwitchName=leaf0 Nodes=$HOST"
        if [ "$two" = 1 ]; then echo "SwitchName=spine Switches=leaf[0-2]"; fi
    } >"$D/etc/topology.conf"
    # the epilog runs as root with Slurm's bare environment: put this checkout's rdmasched
    # on its path, then run the deployed script
    cat >"$D/etc/epilog" <<EOF
#!/bin/sh
PATH=$VENV/bin:\$PATH PYTHONPATH=$REPO RDMASCHED_EPILOG_LOG=$D/log/epilog.log
export PATH PYTHONPATH RDMASCHED_EPILOG_LOG
exec $REPO/deploy/slurm/epilog.sh
EOF
    chmod 755 "$D/etc/epilog"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
    local t=$1 what=$2
    shift 2
    for _ in $(seq $((t * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    say "$what did not happen within $t s"
    return 1
}

nodes_idle() {  # every node is idle
    local states
    states=$(sinfo -h -N -o '%N %t')
    ! echo "$states" | grep -qv ' idle$'
}

up() {
    [ "$(id -u)" = 0 ] || cannot "it needs root (apt-get, munged, slurmd, network namespaces)"
    install
    down
    rm -rf "$D"
    mkdir -p "$D"/{etc,ctld,spool,pids,log,munge}
    mkdir -p "$D/spool/$HOST" "$D/spool/rs1" "$D/spool/rs2"
    local two=1
    if ! netns_up 2>"$D/log/netns.log"; then
        two=0
        say "no network namespaces here ($(tail -n1 "$D/log/netns.log")): one node only"
        ip link del "$BRIDGE" 2>/dev/null || true
        if [ "${CI:-}" = true ]; then cannot "the two-node cluster needs network namespaces"; fi
    fi
    write_conf "$two"
    export SLURM_CONF=$D/etc/slurm.conf
    dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$D/munge/munge.key"
    # the daemons get neither the lock (fd 9: a next run would wait for them) nor our output
    munged --force --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" \
        --pid-file="$D/pids/munged.pid" --log-file="$D/log/munged.log" \
        --seed-file="$D/munge/munged.seed" 9>&- </dev/null >>"$D/log/start.log" 2>&1
    wait_for 10 "munged's start" test -S "$D/munge/munge.socket" || cannot "munged did not start"
    slurmctld -f "$SLURM_CONF" -i 9>&- </dev/null >>"$D/log/start.log" 2>&1
    wait_for 20 "slurmctld's start" scontrol ping || cannot "slurmctld did not start"
    slurmd -f "$SLURM_CONF" -N "$HOST" 9>&- </dev/null >>"$D/log/start.log" 2>&1
    if [ "$two" = 1 ]; then
        # nsenter, not `ip netns exec`: that one mounts a sysfs of the namespace's own, without
        # the /sys/fs/cgroup slurmd looks for
        for i in 1 2; do
            nsenter --net="/run/netns/rdmasched-rs$i" slurmd -f "$SLURM_CONF" -N "rs$i" \
                9>&- </dev/null >>"$D/log/start.log" 2>&1
        done
    fi
    wait_for 60 "every node idle" nodes_idle || {
        sinfo -N >&2
        cannot "the nodes did not come up (logs in $D/log)"
    }
    say "cluster up: $(sinfo -h -o '%P %D %N' | tr '\n' ' ')"
    printf 'SLURM_CONF=%s\nRDMASCHED_SLURM_TWO=%s\n' "$SLURM_CONF" "$two" >"$D/env"
    cat "$D/env"
}

# one run at a time on this host: a second one waits (its `down` would stop the first's cluster)
mkdir -p "$(dirname "$D")"
exec 9>"$D.lock"
flock -w 600 9 || cannot "another run of this script holds $D.lock"

MODE=${1:-all}
trap on_exit_up EXIT
case "$MODE" in
up)
    up
    UP_DONE=1
    ;;
down) down ;;
all)
    echo "== the Slurm tier: deploy/slurm/ on a real Slurm (slurmctld, slurmd, munged here)"
    trap down EXIT
    up >/dev/null
    export RDMASCHED_SLURM_DIR="$D"
    set -a
    . "$D/env"
    set +a
    mkdir -p "$RESULTS"
    PY=$VENV/bin/python
    "$PY" -m pytest tests/slurm -q -p no:cacheprovider --junitxml="$RESULTS/slurm.xml"
    ;;
*)
    echo "usage: $0 [up|down]" >&2
    exit 2
    ;;
esac
