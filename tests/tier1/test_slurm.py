"""Slurm's formats (rdmasched/slurm.py): a topology.conf of many hosts parses in linear time,
and its lines split into words as a POSIX shell (shlex) splits them.

The hostlist and topology.conf rules themselves are tested in test_topology.py."""

from __future__ import annotations

import shlex
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmasched.errors import ConfigError
from rdmasched.slurm import parse_slurm, split_words

HOSTS = 200_000
#: parsing HOSTS names took 64 s when a line was split by shlex (quadratic in the line's
#: length: issue 20, item 15); linear, it takes about a second. The bound is generous, for a
#: loaded machine, and still far below the quadratic time.
BOUND_S = 10.0


def _timed(text: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    switches = parse_slurm(text, "big.conf")
    return time.perf_counter() - t0, sum(len(s.nodes) for s in switches)


def test_a_line_of_200000_host_names_parses_in_linear_time() -> None:
    names = ",".join(f"host{i:06d}" for i in range(HOSTS))
    took, n = _timed(f"SwitchName=leaf1 Nodes={names}\n")
    assert n == HOSTS
    assert took < BOUND_S, f"{HOSTS} names took {took:.1f} s"


def test_200000_continued_lines_parse_in_linear_time() -> None:
    # a continuation joins the next line with a space, so a hostlist cannot be split over
    # lines: 200,000 blank continued lines between the two keys
    text = "SwitchName=leaf1 \\\n" + " \\\n" * HOSTS + f"Nodes=host[000000-{HOSTS - 1}]\n"
    took, n = _timed(text)
    assert n == HOSTS
    assert took < BOUND_S, f"{HOSTS} continued lines took {took:.1f} s"


_CHARS = st.sampled_from(["a", "b", "=", ",", " ", "\t", "'", '"', "\\", "é", "\r", "#"])


@given(st.lists(_CHARS, max_size=30).map("".join))
def test_words_split_as_shlex_splits_them(line: str) -> None:
    try:
        want: list[str] | str = shlex.split(line, posix=True)
    except ValueError as exc:
        want = str(exc)
    try:
        got: list[str] | str = split_words(line)
    except ValueError as exc:
        got = str(exc)
    assert got == want


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('SwitchName=s1 Nodes="n[1-2]"', ["SwitchName=s1", "Nodes=n[1-2]"]),
        ("a '' b", ["a", "", "b"]),
        (r'"x\"y" \  z', ['x"y', " ", "z"]),
        (r'"a\b"', [r"a\b"]),
    ],
)
def test_quotes_and_escapes(line: str, words: list[str]) -> None:
    assert split_words(line) == words


@pytest.mark.parametrize(("line", "why"), [("SwitchName='s1", "No closing"), ("a \\", "No esc")])
def test_an_open_quote_or_escape_names_the_line(line: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"t\.conf:2: {why}"):
        parse_slurm(f"# c\n{line}\n", "t.conf")
