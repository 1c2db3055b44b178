"""Slurm's formats (rdmasched/slurm.py): a topology.conf of many hosts parses in linear time.

The hostlist and topology.conf rules themselves are tested in test_topology.py."""

from __future__ import annotations

import time

from rdmasched.slurm import parse_slurm

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
