"""scripts/setup_stamp.py: what decides whether scripts/setup.sh may skip pip and the build
(issue 7 item 11: every run of scripts/main.sh rebuilt for 1.5 minutes)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("setup_stamp", ROOT / "scripts/setup_stamp.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the checkout's set-up inputs, plus files that are not inputs."""
    st = load()
    for p in st.inputs(ROOT):
        dst = tmp_path / p.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dst)
    (tmp_path / "README.md").write_text("docs\n")
    (tmp_path / "rdmasched/cli.py").write_text("# plain Python, installed editable\n")
    return tmp_path


def test_the_inputs_are_what_the_build_reads() -> None:
    names = {str(p.relative_to(ROOT)) for p in load().inputs(ROOT)}
    assert {
        "scripts/setup.sh",
        "setup.py",
        "pyproject.toml",
        "rdmasched/scheduler/core.py",
    } <= names
    assert "cython/rdmasched/_ring.pyx" in names and "cython/rdmasched/_wire.pxd" in names
    assert not any(n.endswith((".c", ".so")) for n in names)


def test_nothing_changed_same_stamp(tree: Path) -> None:
    st = load()
    assert st.stamp(tree) == st.stamp(tree)


@pytest.mark.parametrize(
    "change",
    [
        "cython/rdmasched/_ring.pyx",
        "cython/rdmasched/_wire.pxd",
        "rdmasched/scheduler/core.py",
        "setup.py",
        "pyproject.toml",
        "scripts/setup.sh",  # its Debian package list
    ],
)
def test_an_input_changed_new_stamp(tree: Path, change: str) -> None:
    st = load()
    before = st.stamp(tree)
    with open(tree / change, "a") as f:
        f.write("\n# changed\n")
    assert st.stamp(tree) != before


def test_a_new_cython_source_new_stamp(tree: Path) -> None:
    st = load()
    before = st.stamp(tree)
    (tree / "cython/rdmasched/_new.pyx").write_text("x = 1\n")
    assert st.stamp(tree) != before


def test_other_files_and_build_outputs_keep_the_stamp(tree: Path) -> None:
    st = load()
    before = st.stamp(tree)
    (tree / "README.md").write_text("other docs\n")
    (tree / "rdmasched/cli.py").write_text("# edited\n")
    (tree / "cython/rdmasched/_ring.c").write_text("/* generated */\n")
    (tree / "cython/rdmasched/_ring.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    assert st.stamp(tree) == before


def test_another_python_new_stamp(tree: Path) -> None:
    st = load()
    assert st.stamp(tree, python="/usr/bin/python3") != st.stamp(tree, python="/opt/py/bin/python")


def test_check_and_write(tree: Path, tmp_path: Path) -> None:
    st = load()
    stamp_file = tmp_path / "stamp"
    assert st.main(["check", str(stamp_file)], tree) == 1  # no stamp yet: set up
    assert st.main(["write", str(stamp_file)], tree) == 0
    assert st.main(["check", str(stamp_file)], tree) == 0  # nothing changed: skip
    (tree / "cython/rdmasched/_shm.pyx").write_text("changed\n")
    assert st.main(["check", str(stamp_file)], tree) == 1
    assert st.main(["bogus"], tree) == 2


def test_setup_sh_skips_only_on_a_matching_stamp_and_says_everything_on_stderr() -> None:
    text = (ROOT / "scripts/setup.sh").read_text()
    assert "exec 1>&2" in text
    assert 'setup_stamp.py check "$STAMP"' in text and 'setup_stamp.py write "$STAMP"' in text
    assert text.index("setup_stamp.py check") < text.index("pip install")


def test_every_python_source_setup_py_compiles_is_an_input_with_its_pxd() -> None:
    """setup.py compiles some plain-Python sources (the scheduler, the node core) with a
    .pxd beside each: a change to one must trigger the build (issue 12 item 2)."""
    import re

    names = {str(p.relative_to(ROOT)) for p in load().inputs(ROOT)}
    compiled = re.findall(r'"(rdmasched/[\w/]+\.py)"', (ROOT / "setup.py").read_text())
    assert "rdmasched/daemon/core.py" in compiled
    for src in compiled:
        assert src in names, src
        pxd = src[:-3] + ".pxd"
        if (ROOT / pxd).exists():
            assert pxd in names, pxd
