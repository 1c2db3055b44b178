"""Pure parsing of the freezer (issue 10 item 2): /proc/self/mounts, /proc/<pid>/cgroup,
/proc/<pid>/stat, cgroup.events; the arguments of `python -m rdmasched.bench.freeze`."""

from __future__ import annotations

import pytest

from rdmasched.bench import freeze as bench
from rdmasched.errors import ArgumentError
from rdmasched.integrations import freeze

MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
cgroup2 /mnt/with\\040space cgroup2 ro,relatime 0 0
"""


def test_cgroup2_mounts_are_found_beside_v1_and_unescaped() -> None:
    assert freeze.cgroup2_mounts(MOUNTS) == [
        ("/sys/fs/cgroup/unified", False),
        ("/mnt/with space", True),
    ]
    assert freeze.cgroup2_mounts("proc /proc proc rw 0 0\n") == []
    assert freeze.cgroup2_mounts("") == []


def test_cgroup2_path_is_the_zero_line() -> None:
    text = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/work.slice/x\n"
    assert freeze.cgroup2_path(text) == "/work.slice/x"
    assert freeze.cgroup2_path("4:memory:/a\n") is None
    assert freeze.cgroup2_path("0::/\n") == "/"


def test_stat_with_spaces_and_parens_in_the_name() -> None:
    fields = ["S", "1", "2", "3", "0", "-1", "4194560"] + ["0"] * 4 + ["7", "5"]
    fields += ["0", "0", "20", "0", "1", "0", "12345", "0", "0"]
    st = freeze.parse_stat("42 (a) (b c) " + " ".join(fields))
    assert (st.pid, st.comm, st.state, st.ppid, st.pgrp, st.session) == (
        42,
        "a) (b c",
        "S",
        1,
        2,
        3,
    )
    assert (st.utime, st.stime, st.starttime) == (7, 5, 12345)
    assert st.flags == 4194560 and not st.flags & freeze.PF_KTHREAD
    for bad in ("", "42 no parens", "42 (x) S 1"):
        with pytest.raises(ValueError):
            freeze.parse_stat(bad)


def test_events() -> None:
    assert freeze.parse_events("populated 1\nfrozen 0\n") == {"populated": 1, "frozen": 0}
    assert freeze.parse_events("") == {}


def test_bench_arguments_have_defaults_and_one_line_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = bench.build_parser()
    help_text = p.format_help()
    for opt in ("--repetitions", "--workers", "--hold-ms", "--mechanism", "--json"):
        assert opt in help_text
    assert "default" in help_text
    a = p.parse_args([])
    assert a.mechanism is None and not a.json  # both, cgroup where usable
    for argv, what in (
        (["--repetitions", "0"], "--repetitions"),
        (["--workers", "x"], "--workers"),
        (["--hold-ms", "-1"], "--hold-ms"),
        (["--mechanism", "freezer"], "--mechanism"),
    ):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and what in err, err
    with pytest.raises(ArgumentError):
        bench.run(repetitions=0)
