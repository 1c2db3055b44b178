"""The Slurm tier: these tests submit jobs to the real Slurm that scripts/test-slurm.sh
installs and starts on this host (docs/SLURM.md); that script runs them and stops it.

Without that cluster (SLURM_CONF and RDMASCHED_SLURM_DIR unset: the host suite, `pytest
tests`) they skip, naming the script; in CI the script runs them, and fails when it cannot
start the cluster (CI=true)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_env() -> dict[str, str]:
    """The environment a job is submitted with: the test cluster's SLURM_CONF, and this
    checkout's rdmasched first on PATH and PYTHONPATH (the jobs run `rdmasched` and
    deploy/slurm/rank.py from here)."""
    if not os.environ.get("SLURM_CONF") or not os.environ.get("RDMASCHED_SLURM_DIR"):
        pytest.skip("needs the Slurm cluster that scripts/test-slurm.sh starts (it runs these)")
    for tool in ("sbatch", "scontrol", "sinfo"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on PATH although the cluster is up", pytrace=False)
    import sys

    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ)
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHON"] = sys.executable
    return env
