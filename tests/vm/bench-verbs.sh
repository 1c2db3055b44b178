#!/usr/bin/env bash
# tests/vm/bench-verbs.sh: `rdmasched bench latency --transport verbs` inside the Soft-RoCE VM,
# with perftest's ib_write_lat on the same device in the same run; prints the table.
#
# Usage: tests/vm/bench-verbs.sh [BENCH ARGS...]   (default: --iterations 20000 --rounds 5)
#   e.g. tests/vm/bench-verbs.sh --json
# Build the extensions on the host first: python3 setup.py build_ext --inplace
# Figures under emulation (TCG) are only good as ratios within one run (SOFT-ROCE-VM.md).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
args=("$@")
((${#args[@]})) || args=(--iterations 20000 --rounds 5)
results=$(mktemp -d "${TMPDIR:-/tmp}/rdmasched-bench-verbs.XXXXXX")
trap 'rm -rf "$results"' EXIT
printf -v cmd '%q ' python3 -m rdmasched.cli bench latency --transport verbs "${args[@]}"
rc=0
"$here/run-in-vm.sh" --quiet --results "$results" -- \
    "$cmd >\"\$RDMASCHED_RESULTS/bench.out\" 2>\"\$RDMASCHED_RESULTS/bench.err\"" || rc=$?
cat "$results/bench.err" 2>/dev/null >&2 || true
cat "$results/bench.out" 2>/dev/null || true
exit "$rc"
