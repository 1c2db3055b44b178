"""Counts per task, in about a byte a task: the simulator's conservation records.

A run checks, task by task, that nothing completed twice and nothing was lost. At 100,000
nodes a traced job's co-located work is tens of millions of tasks, and a dict entry per task
(a tuple key, its ints, the slot: about 170 bytes) was most of the run's memory. The ids the
workloads make (`demo.taskid.task_id`: kind | node | sequence, the sequence dense from 1 on
each node) are counted in one bytearray per (kind, node) instead, indexed by the sequence;
any other id (a sync task's, one with a sparse sequence) goes to a plain dict.

A count stops at 255: any count above 1 is already a defect the checks report.

It imports only the task-id layout and where sync task ids begin.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from rdmasched.daemon.core import SYNC_ID_BASE
from rdmasched.demo.taskid import NODE_SHIFT, SEQ_MASK, task_node

#: a sequence past this goes to the dict (a bytearray grows to the largest sequence counted)
_DENSE_SEQ = 1 << 24


def _sparse(tid: int) -> bool:
    """Whether `tid` is counted in the dict: a sync task's id (its bits are not the
    layout's) or a sequence past `_DENSE_SEQ`."""
    return tid >= SYNC_ID_BASE or tid & SEQ_MASK >= _DENSE_SEQ


def _at_home(node: int, tid: int) -> bool:
    """Whether `tid` completed on the node that made it (the id's node field)."""
    return tid < SYNC_ID_BASE and task_node(tid) == node


class Tally(Mapping[int, int]):
    """task id -> how many times it was counted (`add`); a `Mapping` of the ids counted."""

    __slots__ = ("_dense", "_len", "_sparse")

    def __init__(self) -> None:
        self._dense: dict[int, bytearray] = {}  # id >> NODE_SHIFT (kind, node) -> counts
        self._sparse: dict[int, int] = {}
        self._len = 0

    def add(self, tid: int) -> None:
        if _sparse(tid):
            n = self._sparse.get(tid, 0)
            self._sparse[tid] = n + 1
        else:
            seq = tid & SEQ_MASK
            row = self._dense.get(tid >> NODE_SHIFT)
            if row is None:
                row = self._dense[tid >> NODE_SHIFT] = bytearray()
            if seq >= len(row):
                row.extend(bytes(max(seq + 1 - len(row), len(row))))  # (amortised growth)
            n = row[seq]
            if n < 255:
                row[seq] = n + 1
        if n == 0:
            self._len += 1

    def __getitem__(self, tid: int) -> int:
        if _sparse(tid):
            return self._sparse[tid]
        seq = tid & SEQ_MASK
        row = self._dense.get(tid >> NODE_SHIFT)
        n = row[seq] if row is not None and seq < len(row) else 0
        if n == 0:
            raise KeyError(tid)
        return n

    def __iter__(self) -> Iterator[int]:
        for prefix, row in self._dense.items():
            base = prefix << NODE_SHIFT
            for seq, n in enumerate(row):
                if n:
                    yield base | seq
        yield from self._sparse

    def __len__(self) -> int:
        return self._len


class Completions(Mapping[tuple[int, int], int]):
    """(node, task id) -> completions on that node. A task completed on the node that made
    it (the id's node field: nearly every one) costs a byte (`Tally`); one completed on
    another node (placed there, or sent back after a death) costs a dict entry."""

    __slots__ = ("_away", "_home")

    def __init__(self) -> None:
        self._home = Tally()
        self._away: dict[tuple[int, int], int] = {}

    def add(self, node: int, tid: int) -> None:
        if _at_home(node, tid):
            self._home.add(tid)
        else:
            k = (node, tid)
            self._away[k] = self._away.get(k, 0) + 1

    def __getitem__(self, key: tuple[int, int]) -> int:
        node, tid = key
        if _at_home(node, tid):
            return self._home[tid]
        return self._away[key]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for tid in self._home:
            yield task_node(tid), tid
        yield from self._away

    def __len__(self) -> int:
        return len(self._home) + len(self._away)
