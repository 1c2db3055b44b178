#!/usr/bin/env bash
# The whole test suite: lint and types, tiers 1 and 2 on this host, tier 3 (real Soft-RoCE)
# inside a qemu VM. Installs what it needs first; safe to run twice.
#
# With CI=true a tier that cannot run fails the run; elsewhere tier 3 is skipped with a
# message when this machine cannot start the VM (RDMASCHED_SKIP_VM=1 skips it on purpose).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
PY=.venv/bin/python
RESULTS=${RDMASCHED_RESULTS:-results}
mkdir -p "$RESULTS"
# the tests keep their artifacts (the mirror's browser screenshots, ...) here too
export RDMASCHED_RESULTS
RDMASCHED_RESULTS=$(realpath -m "$RESULTS")

echo "== lint, format, types"
.venv/bin/ruff check rdmasched tests scripts
.venv/bin/ruff format --check rdmasched tests scripts
.venv/bin/mypy

echo "== tiers 1 and 2: wire, ring, scheduler, shm between processes"
"$PY" -m pytest tests -m "not tier3" -q --junitxml="$RESULTS/host.xml"
scripts/test-slurm.sh  # the Slurm tier: deploy/slurm/ on a real Slurm here (docs/SLURM.md)

echo "== tier 3: Soft-RoCE (rdma_rxe) inside a VM"
scripts/test-tier3.sh
