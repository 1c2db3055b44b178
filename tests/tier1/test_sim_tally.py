"""The simulator's conservation records (rdmasched/sim/tally.py) count as a dict would."""

from __future__ import annotations

import random

import pytest

from rdmasched.demo.taskid import KIND_BACKGROUND, KIND_COMPUTE, SEQ_MASK, task_id, task_node
from rdmasched.sim.tally import Completions, Tally


def _ids(rng: random.Random, k: int) -> list[int]:
    out = []
    for _ in range(k):
        r = rng.random()
        if r < 0.05:
            out.append((1 << 63) | rng.randrange(1 << 40))  # a sync task's id
        elif r < 0.1:
            out.append(task_id(KIND_COMPUTE, rng.randrange(3), rng.randrange(1 << 30, SEQ_MASK)))
        else:
            kind = rng.choice((KIND_COMPUTE, KIND_BACKGROUND))
            out.append(task_id(kind, rng.randrange(5), rng.randrange(1, 300)))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_a_tally_counts_every_id_as_a_dict_does(seed: int) -> None:
    rng = random.Random(seed)
    t, model = Tally(), dict[int, int]()
    for tid in _ids(rng, 2_000):
        t.add(tid)
        model[tid] = model.get(tid, 0) + 1
    assert dict(t) == model and len(t) == len(model)
    for tid in _ids(rng, 200):
        assert t.get(tid) == model.get(tid)
        assert (tid in t) == (tid in model)


def test_completions_key_the_completing_node_as_a_dict_does() -> None:
    rng = random.Random(7)
    c, model = Completions(), dict[tuple[int, int], int]()
    for tid in _ids(rng, 3_000):
        node = task_node(tid) if rng.random() < 0.8 else rng.randrange(5)  # mostly at home
        c.add(node, tid)
        model[node, tid] = model.get((node, tid), 0) + 1
    assert dict(c) == model and len(c) == len(model)
    some = next(iter(model))
    assert c[some] == model[some]
    with pytest.raises(KeyError):
        c[(99, some[1])]


def test_a_count_stops_at_255_and_still_reads_more_than_once() -> None:
    t = Tally()
    tid = task_id(KIND_BACKGROUND, 1, 1)
    for _ in range(300):
        t.add(tid)
    assert t[tid] == 255 and len(t) == 1
