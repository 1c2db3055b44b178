#!/usr/bin/env bash
# tests/vm/bench-verbs.sh: `rdmasched bench latency --transport verbs` inside the Soft-RoCE VM,
# with perftest's ib_write_lat on the same device in the same run; prints the table.
#
# Usage: tests/vm/bench-verbs.sh [--hosts 2] [BENCH ARGS...]
#                                  (default: --iterations 20000 --rounds 5)
#   e.g. tests/vm/bench-verbs.sh --json
#   --hosts 2: two VMs on a virtual wire, VM a the server (--server), VM b the client
#              (--client A), ib_write_lat likewise; prints the client's table
# Build the extensions on the host first: python3 setup.py build_ext --inplace
# Figures under emulation (TCG) are only good as ratios within one run (SOFT-ROCE-VM.md).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
hosts=1
if [[ ${1:-} == --hosts ]]; then
    hosts=${2:?--hosts 1|2}
    shift 2
fi
args=("$@")
((${#args[@]})) || args=(--iterations 20000 --rounds 5)
results=$(mktemp -d "${TMPDIR:-/tmp}/rdmasched-bench-verbs.XXXXXX")
trap 'rm -rf "$results"' EXIT
printf -v cmd '%q ' python3 -m rdmasched.cli bench latency --transport verbs "${args[@]}"
out='>"$RDMASCHED_RESULTS/bench.out" 2>"$RDMASCHED_RESULTS/bench.err"'
rc=0
if [[ $hosts == 2 ]]; then
    "$here/run-in-vm.sh" --quiet --hosts 2 --results "$results" -- \
        "if [ \"\$RDMASCHED_VM_ROLE\" = a ]; then $cmd --server $out; else $cmd --client \"\$RDMASCHED_PEER_IP\" $out; fi" || rc=$?
    for side in a b; do
        sed "s/^/[$side] /" "$results/$side/bench.err" 2>/dev/null >&2 || true
    done
    cat "$results/b/bench.out" 2>/dev/null || true
else
    "$here/run-in-vm.sh" --quiet --results "$results" -- "$cmd $out" || rc=$?
    cat "$results/bench.err" 2>/dev/null >&2 || true
    cat "$results/bench.out" 2>/dev/null || true
fi
exit "$rc"
