#!/usr/bin/env bash
# Install what rdmasched needs on a Debian machine and build it; safe to run twice.
#
#   scripts/setup.sh          apt packages (as root), a venv in .venv, the Cython build,
#                             torch 2.13.0 (CPU) for the PyTorch integration
#
# The venv is made from Debian's own python3 with --system-site-packages, because pyverbs
# (the verbs control plane) comes from Debian's python3-pyverbs, not from PyPI.
# Everything else (msgpack, Cython, pytest, ...) comes from PyPI into the venv.
#
# Everything it says goes to stderr, so `scripts/main.sh --json` prints only JSON. A run
# with nothing changed takes a second or two: after a good set-up it records a stamp of its
# inputs (this script, setup.py, pyproject.toml, cython/, the compiled scheduler source,
# the venv's python; scripts/setup_stamp.py) and skips pip and the build while the stamp
# matches and the built modules import. RDMASCHED_SETUP_FORCE=1 redoes it all.
set -euo pipefail
cd "$(dirname "$0")/.."
exec 1>&2  # set-up chatter, and pip's, goes to stderr

APT_PACKAGES=(python3 python3-venv python3-dev gcc libc6-dev
              libibverbs-dev rdma-core ibverbs-providers ibverbs-utils python3-pyverbs valgrind
              chromium)  # chromium: the mirror's headless browser test (tests/tier2/test_mirror.py)
APT_PACKAGES+=(systemd curl)  # systemd-analyze, curl: tests/tier2/test_systemd_unit.py, test_daemon_production.py
VENV=${RDMASCHED_VENV:-.venv}
STAMP="$VENV/.rdmasched-setup-stamp"

need_apt=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if ((${#need_apt[@]})); then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing Debian packages: ${need_apt[*]}; run as root (or install them)"
        exit 1
    fi
    echo "setup: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # refresh the package lists once (or when they are a day old)
    if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n1)" ]; then
        apt-get update -qq
    fi
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    rm -f "$STAMP"  # new system packages: rebuild against them
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV (Debian python3, with system site-packages for pyverbs)"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi

importable() {
    "$VENV/bin/python" - <<'PY'
import rdmasched, rdmasched._ring, rdmasched._shm, rdmasched._bench  # noqa: E401
import rdmasched.scheduler.core as core
import importlib.util
assert core.IMPLEMENTATION != "python", "the scheduler core is not compiled"
import rdmasched.daemon.core as node_core
assert node_core.IMPLEMENTATION != "python", "the node core is not compiled"
assert importlib.util.find_spec("torch"), "torch (the [torch] extra) is not installed"
import chakra.schema.protobuf.et_def_pb2  # noqa: F401  (mlc-chakra, --no-deps, and protobuf)
print(f"setup: rdmasched {rdmasched.__version__} built and importable")
PY
}

if [ "${RDMASCHED_SETUP_FORCE:-0}" != 1 ] &&
    "$VENV/bin/python" scripts/setup_stamp.py check "$STAMP" &&
    importable >/dev/null 2>&1; then
    echo "setup: up to date (nothing changed since the last set-up; RDMASCHED_SETUP_FORCE=1 redoes it)"
    exit 0
fi

rm -f "$STAMP"
echo "setup: installing the Python dependencies and building (about 1.5 minutes)"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
# -e: the compiled modules land next to the sources, where the VM (which mounts this
# checkout and uses its own Debian python3) imports them too.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'
# Chakra execution traces (docs/WORKLOADS.md): the dev extra brings protobuf; chakra's schema
# comes from mlc-chakra without its requirements (its converter's, ~500 MB; the reader needs
# none of them)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps 'mlc-chakra==1.0.0'
# the [torch] extra (rdmasched.integrations.torch, examples/ddp_train.py, its tests): torch
# 2.13.0 is the CPU build on these machines (elsewhere: your own torch >= 2.3 will do)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[torch]' 'torch==2.13.0'
# the [peers] extra: Ray and Dask distributed for `rdmasched bench peers` (docs/BENCH.md)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[peers]'
importable
"$VENV/bin/python" scripts/setup_stamp.py write "$STAMP"
