#!/usr/bin/env bash
# The main job on the embedded default (shm transport, one host, no RDMA hardware):
# `rdmasched demo`, a local cluster under rdmasched and under a central scheduler.
# Installs what it needs first (scripts/setup.sh: seconds when nothing changed; all it says goes
# to stderr, so --json output is only JSON); safe to run twice. Extra arguments go to
# the command, e.g. scripts/main.sh --json
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/rdmasched demo "$@"
