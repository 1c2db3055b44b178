#!/usr/bin/env bash
# Install what rdmasched needs on a Debian machine and build it; safe to run twice.
#
#   scripts/setup.sh          apt packages (as root), a venv in .venv, the Cython build
#
# The venv is made from Debian's own python3 with --system-site-packages, because pyverbs
# (the verbs control plane) comes from Debian's python3-pyverbs, not from PyPI.
# Everything else (msgpack, Cython, pytest, ...) comes from PyPI into the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3 python3-venv python3-dev gcc libc6-dev
              libibverbs-dev rdma-core ibverbs-providers ibverbs-utils python3-pyverbs)
VENV=${RDMASCHED_VENV:-.venv}

need_apt=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if ((${#need_apt[@]})); then
    if [ "$(id -u)" != 0 ]; then
        echo "setup: missing Debian packages: ${need_apt[*]}; run as root (or install them)" >&2
        exit 1
    fi
    echo "setup: installing ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # refresh the package lists once (or when they are a day old)
    if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -n1)" ]; then
        apt-get update -qq
    fi
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV (Debian python3, with system site-packages for pyverbs)"
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
# -e: the compiled modules land next to the sources, where the VM (which mounts this
# checkout and uses its own Debian python3) imports them too.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[dev]'
"$VENV/bin/python" - <<'PY'
import rdmasched, rdmasched._ring, rdmasched._shm, rdmasched._bench  # noqa: E401
print(f"setup: rdmasched {rdmasched.__version__} built and importable")
PY
