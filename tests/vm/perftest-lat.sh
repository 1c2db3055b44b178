#!/usr/bin/env bash
# tests/vm/perftest-lat.sh: perftest's ib_write_lat on the Soft-RoCE device, the baseline that
# rdmasched's verbs figures are compared with. Runs inside the VM (tests/vm/run-in-vm.sh).
#
# Usage: tests/vm/perftest-lat.sh [loopback | server | client PEER_IP] [-- IB_WRITE_LAT_ARGS...]
#   loopback  (default) server and client on the one device, client to $RDMASCHED_IP
#   server    the server side only (two hosts: VM a)
#   client    the client side to PEER_IP (two hosts: VM b, PEER_IP=$RDMASCHED_PEER_IP);
#             retries while the server is not listening yet
# Prints ib_write_lat's output (the client's table; in loopback also the server's, prefixed);
# exits non-zero if a side failed.
#
# Environment: RDMASCHED_DEVICE, RDMASCHED_GID_INDEX, RDMASCHED_IP (exported by run-in-vm.sh
# from soft-roce-setup.sh), PERFTEST_ITERS (default 200), PERFTEST_PORT (default 18515),
# PERFTEST_TIMEOUT (seconds a side may take, default 120).
# Figures under emulation are only good as ratios within one VM run (see SOFT-ROCE-VM.md).
set -euo pipefail

mode=${1:-loopback}
[[ $# -gt 0 ]] && shift
peer=''
if [[ $mode == client ]]; then
    peer=${1:?usage: perftest-lat.sh client PEER_IP}
    shift
fi
[[ ${1:-} == -- ]] && shift
extra=("$@")

: "${RDMASCHED_DEVICE:?not set: run inside tests/vm/run-in-vm.sh or export soft-roce-setup.sh up}"
: "${RDMASCHED_GID_INDEX:?not set}"
iters=${PERFTEST_ITERS:-200}
port=${PERFTEST_PORT:-18515}
limit=${PERFTEST_TIMEOUT:-120}
args=(-d "$RDMASCHED_DEVICE" -x "$RDMASCHED_GID_INDEX" -F -n "$iters" -p "$port" "${extra[@]}")
ulimit -l unlimited 2>/dev/null || true

server() {
    timeout "$limit" ib_write_lat "${args[@]}"
}

# client HOST: retries while the server is not up yet (perftest gives up at once).
client() {
    local out rc try
    for try in $(seq 1 60); do
        rc=0
        out=$(timeout "$limit" ib_write_lat "${args[@]}" "$1" 2>&1) || rc=$?
        if ((rc != 0)) && grep -q "Couldn't connect" <<<"$out" && ((try < 60)); then
            sleep 0.5
            continue
        fi
        printf '%s\n' "$out"
        return "$rc"
    done
}

listening() { ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; }

case $mode in
server)
    echo "ib_write_lat server: ${args[*]}"
    server
    ;;
client)
    echo "ib_write_lat client: ${args[*]} $peer"
    client "$peer"
    ;;
loopback)
    : "${RDMASCHED_IP:?not set}"
    echo "ib_write_lat loopback on $RDMASCHED_DEVICE (GID index $RDMASCHED_GID_INDEX, $RDMASCHED_IP): ${args[*]}"
    ! listening || { echo "port $port is busy (PERFTEST_PORT)" >&2; exit 1; }
    log=$(mktemp)
    trap 'rm -f "$log"' EXIT
    server >"$log" 2>&1 &
    spid=$!
    for _ in $(seq 1 100); do listening && break; sleep 0.1; done
    crc=0
    client "$RDMASCHED_IP" || crc=$?
    src=0
    wait "$spid" || src=$?
    sed 's/^/server| /' "$log"
    if ((crc || src)); then
        echo "ib_write_lat failed: client exit $crc, server exit $src" >&2
        exit 1
    fi
    ;;
*)
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
    exit 2
    ;;
esac
