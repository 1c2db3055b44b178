"""Python objects allocated per message on the daemon's path, per kind (issue 12 item 2):
the blocks CPython's allocators hand out between the lane's poll and the handler's first
line, counted by `rdmasched._bench.alloc_count` with an `AllocCounter` probe
(rdmasched/daemon/probe.py). A count of allocations does not depend on the machine's load:
it is the same from run to run, so a test can bound it (tests/tier2/test_alloc.py) where it
could not bound a time.

The path is the real one, as in `rdmasched bench stages`: two `Node`s in one process over
shm; node 0 writes N messages of one kind into node 1's lane, node 1's loop (`Node.run`)
takes them, and each reaches a handler:

* PREEMPT: of node 1's running task; the preempt handler returns, the task starts again.
* DISPATCH: a task of node 0's to node 1, started there; the dispatch handler completes it
  (after the message, from the loop's inbox), which frees the slot for the next.
* COMPLETE: node 0 dispatched N tasks to node 1, which completed each (N COMPLETEs in node
  0's lane); node 0 takes them: the complete handler.
* SYNC_READY: group {0, 1}; node 1 reached steps 0..N-1 first, then node 0's SYNC_READYs
  for them come in, each releasing its step: the sync handler.

`python -m rdmasched.bench.allocs [N]` prints the counts of every kind as JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rdmasched.bench.stages import open_pair
from rdmasched.daemon.probe import (
    DECIDED,
    DONE,
    HANDLER,
    INBOX,
    POLL,
    POLLED,
    TAKEN,
    AllocCounter,
)

KINDS = ("PREEMPT", "DISPATCH", "COMPLETE", "SYNC_READY")


def _pending(node: Any) -> None:
    assert node.loop is not None
    node.loop.run_pending()


def count(kind: str, n: int) -> dict[str, Any]:
    """Allocations per message of `kind` on its path (see the module text); `n` messages
    after `n // 4` of warm-up (caches, free lists, the first growth of tables)."""
    from rdmasched import _bench

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
    warm = n // 4
    total = warm + n
    a, b = open_pair(total)
    probe = AllocCounter()
    seen = [0]

    def entered() -> None:
        probe.handler_entered()
        seen[0] += 1

    rx = b
    try:
        if kind == "PREEMPT":
            b.on_dispatch(lambda task, slot: None)

            def stop(task: Any, slot: int, cancel: bool) -> int:
                entered()
                return int(task.progress_ns + 1)

            b.on_preempt(stop)
            b.dispatch(1, job=1, priority=10, cost_ns=10**12)
            _pending(b)

            def produce(lo: int, hi: int) -> None:
                for _ in range(lo, hi):
                    a.preempt(1, node=1)

        elif kind == "DISPATCH":

            def start(task: Any, slot: int) -> None:
                entered()
                b.complete(task.id, origin=task.origin)

            b.on_dispatch(start)

            def produce(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    a.dispatch(i, to=1, priority=10)

        elif kind == "COMPLETE":
            started = [0]

            def run(task: Any, slot: int) -> None:
                started[0] += 1
                b.complete(task.id, origin=task.origin)

            b.on_dispatch(run)
            a.on_complete(lambda task_id, node: entered())
            rx = a

            def produce(lo: int, hi: int) -> None:
                for i in range(lo, hi):
                    a.dispatch(i, to=1, priority=10)
                    _pending(a)
                    b.run(until=lambda i=i: started[0] > i)

        else:  # SYNC_READY
            b.on_sync(lambda task, slot: entered())
            for x in (a, b):
                x.define_group(1, [0, 1])

            def produce(lo: int, hi: int) -> None:
                for step in range(lo, hi):
                    b.sync_ready(1, step)
                _pending(b)
                for step in range(lo, hi):
                    a.sync_ready(1, step)

        produce(0, warm)
        _pending(a)
        rx.run(until=lambda: seen[0] >= warm)
        produce(warm, total)
        _pending(a)
        _bench.alloc_count_start()
        try:
            probe.allocs(reset=True)
            seen[0] = 0
            rx.probe = probe
            rx.run(until=lambda: seen[0] >= n)
            rx.probe = None
            allocs = probe.allocs(reset=True)
        finally:
            _bench.alloc_count_stop()
    finally:
        b.stop()
        a.stop()
    got = seen[0]
    if got != n:
        raise RuntimeError(f"{kind}: {got} handlers entered for {n} messages")
    per = [x / n for x in allocs]
    return {
        "kind": kind,
        "messages": got,
        # from the lane's poll to the handler's first line
        "path": per[POLL] + per[POLLED] + per[INBOX] + per[TAKEN] + per[DECIDED],
        "stages": {
            "poll": per[POLL],
            # the batch's first message from the poll, the others from the previous one's
            "take": per[POLLED] + per[INBOX],
            "core": per[TAKEN],
            "driver": per[DECIDED],
            # not on the path: the handler and what follows it, the loop's inbox
            "after": per[HANDLER],
            "inbox": per[DONE],
        },
    }


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 2000
    print(json.dumps({k: count(k, n) for k in KINDS}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
