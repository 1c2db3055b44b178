"""Where the time of a message goes in the daemon: probes at the stage boundaries of the path.

A node's loop and driver call `probe.mark(point)` at fixed points of the message path, only
when a probe is set (`Node.probe`, `Loop.probe`; None by default, one attribute test per
message then). The points, in the order a PREEMPT passes them:

=====  =====================================  ==========================================
point  where                                  stage that ends here
=====  =====================================  ==========================================
0      the loop calls `LaneSet.wait`          (the loop's own work, timers, inbox)
1      `wait` returned with messages          poll + decode (in C: slots read, checked,
                                              Message objects made)
2      the driver takes one message           hand-off (loop to driver)
3      `NodeCore.receive` returned            core: decode of the fields, the decision
4      the preempt handler is entered         driver: effects carried out up to the handler
5      the message's effects are all done     after the handler: `preempted`, restart
6      the loop ran what the handlers asked   the inbox (calls the handlers posted)
       for (its inbox)
=====  =====================================  ==========================================

From point 6 the loop reads its clock (its stall check) and takes the next message of the
batch (the `Message` is made, point 2);
after the batch's last, it polls again (point 0).

Two probes use them:

* `StageClock` records, per PREEMPT, the clock at points 1, 2, 3, 4 beside the PREEMPT's
  trigger time (the sender's clock when it wrote the slot): `rdmasched bench preempt`
  prints the breakdown slot written -> polled -> core started -> decided -> handler.
* `StageCounter` turns callgrind's instruction counting on at the start of one stage and
  off at its end (`rdmasched bench stages` runs the path under valgrind once per stage):
  instructions per message that do not depend on the machine's noise.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

#: the points (see the table above)
POLL, POLLED, TAKEN, DECIDED, HANDLER, DONE, INBOX = range(7)
#: the stages a `StageCounter` can count, by the point they start at
STAGES = {
    "poll": POLL,
    "handoff": POLLED,
    "core": TAKEN,
    "driver": DECIDED,
    "after": HANDLER,
}


class Probe:
    """A probe that does nothing (the base: drivers call `mark` and `preempt_seen`)."""

    #: the driver calls `preempt_seen` with a PREEMPT's trigger stamp (an int made, a
    #: Python call: inside the core stage, so only a probe that uses it asks for it)
    wants_trigger = False

    def mark(self, point: int) -> None:
        """The path reached `point`."""

    def preempt_seen(self, trigger_ns: int) -> None:
        """The message just taken is a PREEMPT triggered at `trigger_ns`."""


class StageClock(Probe):
    """Per PREEMPT: trigger, polled, taken, decided, handler entered (ns), up to `keep`."""

    wants_trigger = True

    def __init__(self, clock: Callable[[], int], keep: int = 1_000_000) -> None:
        self.clock = clock
        self.keep = keep
        #: the five columns, one row per PREEMPT whose handler was entered
        self.trigger = array("q")
        self.polled = array("q")
        self.taken = array("q")
        self.decided = array("q")
        self.handler = array("q")
        self._polled = 0
        self._cur = [0, 0, 0, 0]  # trigger, taken, decided, pending

    def mark(self, point: int) -> None:
        if point == POLLED:
            self._polled = self.clock()
        elif point == TAKEN:
            self._cur[1] = self.clock()
            self._cur[3] = 0
        elif point == DECIDED:
            self._cur[2] = self.clock()
        elif point == HANDLER and self._cur[3] and len(self.trigger) < self.keep:
            now = self.clock()
            self.trigger.append(self._cur[0])
            self.polled.append(self._polled)
            self.taken.append(self._cur[1])
            self.decided.append(self._cur[2])
            self.handler.append(now)
            self._cur[3] = 0

    def preempt_seen(self, trigger_ns: int) -> None:
        self._cur[0] = trigger_ns
        self._cur[3] = 1

    def __len__(self) -> int:
        return len(self.trigger)

    def stages_ns(self) -> dict[str, list[int]]:
        """Each stage's durations (ns), one per recorded PREEMPT."""
        rows = range(len(self.trigger))
        t, p, k, d, h = self.trigger, self.polled, self.taken, self.decided, self.handler
        return {
            "written -> polled": [p[i] - t[i] for i in rows],
            "polled -> taken": [k[i] - p[i] for i in rows],
            "taken -> decided": [d[i] - k[i] for i in rows],
            "decided -> handler": [h[i] - d[i] for i in rows],
            "written -> handler": [h[i] - t[i] for i in rows],
        }


class AllocCounter(Probe):
    """Counts the blocks CPython's allocators hand out in each stage of the path (every
    object not taken from a free list, and the item array of a list or dict), summed over
    the messages, in C (rdmasched._bench.alloc_mark: a mark allocates nothing itself):
    `allocs()[point]` is what the stage that starts at `point` allocated (POLL: the poll of
    a batch; INBOX: taking the next message of the batch). `handler_entered()`, called
    first thing by a handler, ends the driver's stage for a kind other than PREEMPT (whose
    handler the driver marks, point 4). Counting must be on (`_bench.alloc_count_start`)."""

    def __init__(self) -> None:
        from rdmasched import _bench

        self._bench = _bench
        self.mark = _bench.alloc_mark  # type: ignore[method-assign]
        _bench.alloc_stages(reset=True)

    def handler_entered(self) -> None:
        self._bench.alloc_mark(HANDLER, DECIDED)

    def allocs(self, reset: bool = False) -> list[int]:
        return self._bench.alloc_stages(reset)


class StageCounter(Probe):
    """Counts one stage's instructions under callgrind (`--collect-atstart=no`): collection
    on at the stage's first point, off at the next point reached."""

    def __init__(self, stage: str) -> None:
        from rdmasched import _callgrind

        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        self.start = STAGES[stage]
        self._toggle = _callgrind.toggle
        self._on = False
        #: how many times the stage was counted
        self.count = 0

    def mark(self, point: int) -> None:
        if self._on:
            self._toggle()
            self._on = False
        elif point == self.start:
            self.count += 1
            self._on = True
            self._toggle()


__all__ = [
    "DECIDED",
    "DONE",
    "HANDLER",
    "INBOX",
    "POLL",
    "POLLED",
    "STAGES",
    "TAKEN",
    "AllocCounter",
    "Probe",
    "StageClock",
    "StageCounter",
]
