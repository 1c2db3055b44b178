"""Every ```python block of README.md and docs/*.md runs, verbatim (issue 7 item 7).

Each block is written to a file and run by a fresh interpreter (this tree's rdmasched on
PYTHONPATH), in a temporary directory holding a copy of every file in docs/examples/ (the
examples' `cluster.toml`, a one-node shm cluster; the docs say so). A block passes when it
exits 0 within the time limit and leaves no shared-memory segment behind (the examples'
own: the names in their text, or the fixture cluster's).

Each run's copy of the examples' `cluster.toml` names its own cluster (`example-<random>`,
`copy_examples`): another user of the host running the same examples, or another run of
these tests, holds other segments. The docs' file stays as written.

A block that cannot run on its own is marked, sparingly, by an HTML comment on the last
non-blank line before its fence, giving the reason (it is invisible in rendered Markdown):

    <!-- not-a-test: needs an RDMA device and a second node -->
    ```python

The blocks are collected from every Markdown file at test time, so blocks that other
changes add are tested too. Only ```python fences count (```text, ```toml, ``` are not code
to run).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.links import ShmLinks
from rdmasched.transport import shm

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "docs" / "examples"
NOT_A_TEST = re.compile(r"^<!--\s*not-a-test:\s*(\S.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
TIMEOUT_S = 120


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """(line of the fence, code, not-a-test reason or None) of each ```python block."""
    lines = path.read_text().splitlines()
    out: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1  # the closing fence
        if lang.lower() not in ("python", "py", "python3"):
            continue
        reason = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            mark = NOT_A_TEST.match(lines[j].strip())
            if mark:
                reason = mark.group(1)
        out.append((start + 1, "\n".join(body) + "\n", reason))
    return out


def collect() -> list[object]:
    params: list[object] = []
    for path in doc_files():
        for line, code, reason in python_blocks(path):
            rel = path.relative_to(ROOT)
            marks = [pytest.mark.skip(reason=f"not-a-test: {reason}")] if reason else []
            params.append(pytest.param(code, id=f"{rel}:{line}", marks=marks))
    return params


CLUSTER_NAME = re.compile(r'^(\[cluster\][^\[]*?^name\s*=\s*)"[^"]*"', re.M | re.S)


def copy_examples(dest: Path) -> str:
    """Copy every file of docs/examples/ into `dest`, the cluster's name in `cluster.toml`
    made this run's own; returns that name."""
    name = f"example-{uuid.uuid4().hex[:12]}"
    for f in FIXTURES.iterdir() if FIXTURES.is_dir() else ():
        if f.is_file():
            shutil.copy(f, dest / f.name)
    toml = dest / "cluster.toml"
    text, n = CLUSTER_NAME.subn(rf'\g<1>"{name}"', toml.read_text(), count=1)
    assert n == 1, f"no [cluster] name in {FIXTURES / 'cluster.toml'}"
    toml.write_text(text)
    return name


def _ours(segment: str, code: str, cluster: str) -> bool:
    """Whether a new segment is the example's, not a concurrent test's (the machine is
    shared): its name (past the common prefix) starts with a name from the example's text
    or this run's cluster, as a whole dot-separated part (so a name like "rdmasched" in the
    text does not claim every segment of the host)."""
    names = set(re.findall(r"[\"']([A-Za-z0-9_.-]{3,})[\"']", code))
    names.add(cluster)
    names.add(ShmLinks.bell_name(cluster, 0).split(".")[0])
    body = segment.removeprefix(shm.PREFIX)
    return any(body == n or body.startswith(f"{n}.") for n in names)


def test_the_collector_finds_blocks_and_honours_the_marker(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "a\n```python\nprint(1)\n```\n<!-- not-a-test: needs a GPU -->\n\n"
        "```python\nimport gpu\n```\n```text\nnot code\n```\n  ```python\n  x = 1\n  ```\n"
    )
    assert python_blocks(doc) == [
        (2, "print(1)\n", None),
        (7, "import gpu\n", "needs a GPU"),
        (13, "x = 1\n", None),
    ]
    assert len(collect()) >= 3  # README's and the docs' examples are all collected


def test_each_run_has_its_own_cluster_name(tmp_path: Path) -> None:
    """Two users of the host running the doc examples at once must not share a cluster
    (issue 20 item 16: a second user's run of the documented example failed 4 tests): each
    run's copy of docs/examples/ names its own cluster; the docs' file stays as written."""
    docs_text = (FIXTURES / "cluster.toml").read_text()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    name_a, name_b = copy_examples(a), copy_examples(b)
    docs_name = ClusterConfig.load(FIXTURES / "cluster.toml").name
    assert len({name_a, name_b, docs_name}) == 3
    assert ClusterConfig.load(a / "cluster.toml").name == name_a
    assert ClusterConfig.load(b / "cluster.toml").name == name_b
    assert (FIXTURES / "cluster.toml").read_text() == docs_text


@pytest.mark.parametrize("code", collect())
def test_doc_example_runs_verbatim(code: str, tmp_path: Path) -> None:
    cluster = copy_examples(tmp_path)
    script = tmp_path / "example.py"
    script.write_text(code)
    before = set(shm.list_segments())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    finally:
        leaked = [s for s in set(shm.list_segments()) - before if _ours(s, code, cluster)]
    for s in leaked:
        shm.ShmSegment.unlink_name(s)
    assert r.returncode == 0, f"the example failed:\n{code}\n--- stderr:\n{r.stderr}"
    assert not leaked, f"the example left shared-memory segments: {sorted(leaked)}"
