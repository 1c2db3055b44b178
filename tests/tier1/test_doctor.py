"""`rdmasched doctor` on a host without RDMA, and its reasoning on made-up kernels (no RDMA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdmasched import doctor


def run_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmasched.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )


def test_exit_code_agrees_with_the_report_and_says_why() -> None:
    r = run_doctor("--json")
    rep = json.loads(r.stdout)
    assert (r.returncode == 0) == rep["usable"]
    if not rep["usable"]:
        assert rep["problems"], "an unusable machine must say why"
        assert any("tests/vm/run-in-vm.sh" in p for p in rep["problems"])
    text = run_doctor()
    assert text.returncode == r.returncode
    assert "rdmasched doctor" in text.stdout and "usable:" in text.stdout


@pytest.mark.skipif(os.path.isdir("/sys/class/infiniband"), reason="this host has RDMA")
def test_host_without_rdma_names_the_missing_sysfs_class() -> None:
    r = run_doctor()
    assert r.returncode == 1
    assert "no /sys/class/infiniband" in r.stdout
    assert "usable: NO" in r.stdout


def test_kernel_without_modules_directory(tmp_path: Path) -> None:
    rep = doctor.diagnose(
        sysfs_ib=str(tmp_path / "none"),
        sys_module=str(tmp_path),
        modules_root=str(tmp_path),
        release="9.9.9-test",
    )
    assert rep["usable"] is False and rep["rdma_rxe"]["state"] == "missing"
    assert any("no modules directory" in p for p in rep["problems"])
    assert any("no " + str(tmp_path / "none") in p for p in rep["problems"])


def test_kernel_with_rxe_available_says_how_to_load_it(tmp_path: Path) -> None:
    mdir = tmp_path / "9.9.9-test"
    mdir.mkdir()
    (mdir / "modules.dep").write_text(
        "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko: kernel/drivers/infiniband/core/ib_core.ko\n"
    )
    rep = doctor.diagnose(
        sysfs_ib=str(tmp_path / "none"),
        sys_module=str(tmp_path),
        modules_root=str(tmp_path),
        release="9.9.9-test",
    )
    assert rep["rdma_rxe"]["state"] == "available"
    assert any("soft-roce-setup.sh up" in p for p in rep["problems"])


def test_kernel_without_rxe_module(tmp_path: Path) -> None:
    mdir = tmp_path / "9.9.9-test"
    mdir.mkdir()
    (mdir / "modules.dep").write_text("kernel/fs/ext4/ext4.ko:\n")
    rep = doctor.diagnose(
        sysfs_ib=str(tmp_path / "none"),
        sys_module=str(tmp_path),
        modules_root=str(tmp_path),
        release="9.9.9-test",
    )
    assert rep["rdma_rxe"]["state"] == "missing"
    assert any("has no rdma_rxe module" in p for p in rep["problems"])


def test_loaded_module_is_seen(tmp_path: Path) -> None:
    (tmp_path / "rdma_rxe").mkdir()
    rep = doctor.diagnose(
        sysfs_ib=str(tmp_path / "none"),
        sys_module=str(tmp_path),
        modules_root=str(tmp_path),
        release="9.9.9-test",
    )
    assert rep["rdma_rxe"]["state"] == "loaded"
