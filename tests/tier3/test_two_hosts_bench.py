"""`rdmasched bench latency --transport verbs` across two hosts, as perftest runs: VM a is the
server (`--server`), VM b the client (`--client A`), ib_write_lat's server and client likewise
in the same run. Runs only inside `tests/vm/run-in-vm.sh --hosts 2`; elsewhere skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROLE = os.environ.get("RDMASCHED_VM_ROLE")
PEER = os.environ.get("RDMASCHED_PEER_IP")

pytestmark = pytest.mark.skipif(
    ROLE not in ("a", "b") or not PEER,
    reason="two-VM test: runs inside tests/vm/run-in-vm.sh --hosts 2 "
    "(RDMASCHED_VM_ROLE, RDMASCHED_PEER_IP)",
)

COMMON = ["--transport", "verbs", "--iterations", "2000", "--rounds", "2", "--warmup", "100"]
COMMON += ["--perftest-iterations", "500", "--port", "18520"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmasched.cli", "bench", "latency", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_server_and_client_on_two_hosts() -> None:
    if ROLE == "a":
        r = cli(*COMMON, "--server")
        assert r.returncode == 0, r.stderr
        assert f"served {PEER}" in r.stderr
        return
    r = cli(*COMMON, "--client", str(PEER), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {x["name"]: x for x in doc["results"]}
    assert set(rows) == {"rdmasched-verbs", "rdmasched-verbs-c", "ib_write_lat"}
    assert rows["rdmasched-verbs"]["n"] == 2000 and rows["rdmasched-verbs-c"]["n"] == 2000
    assert doc["where"].startswith("two hosts") and PEER in doc["where"]
    assert doc["ratios_p50_median_of_rounds"]["rdmasched-verbs"]["ib_write_lat"] > 0
    assert doc["config"]["client"] == PEER and doc["version"]
