"""A host model for the simulator: N node processes sharing the CPUs of one host, each a
sleeping loop that a message or a timer wakes up (docs/SIM.md, "Calibration").

Off by default: the simulator's headline gives every node its own CPU, as a real cluster has.
`rdmasched demo` runs N node processes (and, for the central baseline, the coordinator) on
this host's few CPUs. With `SimConfig.host_model`, every node (and the coordinator) is one
process of this model:

- **A CPU per turn (a run queue).** The host has `cpus` CPUs and one first-come run queue.
  A process that has work (a message, a timer due, a call its handlers posted) and is not on
  a CPU waits in the queue; on a CPU it handles what is queued one item at a time, each
  costing CPU time, and keeps the CPU until its queue is empty and its spin is over, or
  until its slice is over while another waits (below). A turn is not cut into shares: the
  nodes' turns are tens of us, far below the kernel's time slice.
- **The real loop's spin and sleep** (rdmasched/daemon/loop.py, `LaneSet.wait`): after its
  last item a process spins `spin_us` on its CPU, busy (the demo's nodes and coordinator
  spin 50 us, `DemoConfig.spin_us`); work that comes while it spins is handled at once. The
  spin gives way (`spin_gives_way`, as `rs_spin_step` does since commit fd92b8d): once it is
  `SPIN_PAUSE_NS` old, a process waiting for a CPU with work gets the spinner's, and the
  spinner waits in the queue for the rest of its spin (it sleeps if the spin ends there,
  and handles what came meanwhile at its turn). Then it sleeps and gives the CPU to the
  next process in the queue. Work for a sleeping process
  wakes it: a message through the doorbell (futex), a timer when the futex wait times out.
  The wake-up takes a latency drawn from a distribution measured on this host
  (`measure_wakeups`, recorded in `WAKE_MSG_US` and `WAKE_TIMER_US` with the command that
  printed them); then the process joins the run queue.
- **What an item costs.** A message: `msg_cpu_ns` (the Python loop's dispatch, decoding and
  the handler around the core) plus the endpoint's own cost (the link model's `cpu_ns`, or
  the central coordinator's calls into its node cores); a timer: `timer_cpu_ns`; a call a
  handler posted (`Node.complete`, `Node.dispatch`, `Node.sync_ready` run on the loop's
  inbox after the handler: rdmasched/daemon/node.py `_call`): `post_cpu_ns`; a turn on a CPU
  that last ran another process: `switch_cpu_ns`. A pass of the loop (`Loop.run`: the
  outbox, the timers' check, the wait's return with what the lanes hold, up to 256) costs
  `pass_cpu_ns` once for the messages and timers queued when it begins; what comes during
  a pass waits for the next. A turn that comes after more than `cache_turns` turns of
  other processes since the process's own last one finds its working set gone from the
  caches and costs `cold_cpu_ns` more (scripts/ring_turns.py measures such a cliff here).
  A turn that has lasted `slice_ns` while another process waits for a CPU yields at its
  next item and goes to the back of the run queue, as the kernel preempts a process that
  has run its slice (the real coordinator's long batches are cut so: thousands of
  involuntary switches a run, `rdmasched demo --json`'s `host`); the short turns of the
  nodes never last that long.
  These eight and `wake_keep_pct` (the
  measured wake-ups are drawn up to that percentile) are the model's free parameters
  (FREE): `rdmasched sim --calibrate --host-model --fit-sizes` fits them on real runs of
  some sizes and scores the others.

A handler runs at the start of its item (its clock reads then) and what it sends leaves at
the item's end, as the engine's `Endpoint` does. Draws come from one `random.Random` seeded
from the run's seed: a run is deterministic.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from rdmasched import _wire
from rdmasched._ring import SPIN_PAUSE_NS
from rdmasched.daemon.core import NodeCore
from rdmasched.errors import ArgumentError
from rdmasched.sim.drivers import CoreNode, Ledger, Shaped, SimLoop
from rdmasched.sim.engine import Endpoint, Engine, Network

US = 1_000

#: A sleeping loop woken by a message (the doorbell's futex wake, the wait's return, the
#: drain and the Python dispatch to the handler), us: the 0, 1, 2, ..., 100th percentiles
#: of `measure_wakeups(1000)` on this project's 2-vCPU VM (AMD EPYC), 2026-12-04 22:13 UTC,
#: load average 1.0, measured by `rdmasched sim --calibrate --host-model "" --calibrate-rounds
#: 5` just before the real runs the defaults below were fitted on (their file,
#: docs/figures/calibration-real-2026-12-04c.json, keeps every percentile): 1,000 messages
#: one every 1-3 ms (the receiver asleep each time). `rdmasched sim --measure-wakeups`
#: measures them again.
WAKE_MSG_US: tuple[float, ...] = (
    7.1, 7.5, 7.7, 7.8, 7.9, 8.1, 8.2, 8.3, 8.4, 8.5, 8.6, 8.6, 8.7, 8.8, 8.9, 9.0, 9.1,
    9.2, 9.3, 9.4, 9.5, 9.6, 9.7, 9.9, 10.0, 10.1, 10.2, 10.3, 10.5, 10.6, 10.7, 11.0, 11.1,
    11.3, 11.5, 11.7, 11.9, 12.1, 12.3, 12.6, 12.7, 12.9, 13.0, 13.3, 13.4, 13.6, 13.7,
    13.8, 14.0, 14.1, 14.2, 14.2, 14.3, 14.4, 14.5, 14.6, 14.7, 14.8, 14.9, 15.1, 15.3,
    15.4, 15.5, 15.6, 15.7, 15.9, 16.1, 16.2, 16.4, 16.7, 16.8, 17.0, 17.4, 18.0, 18.4,
    19.0, 19.7, 20.7, 21.2, 21.5, 21.6, 21.9, 22.1, 22.5, 22.8, 23.1, 24.2, 25.7, 26.6,
    27.0, 27.4, 27.7, 28.0, 28.4, 29.2, 30.8, 40.7, 55.0, 69.2, 82.0, 1855.6,
)  # fmt: skip
#: A sleeping loop woken by its own timer (the futex wait's timeout, with the thread's timer
#: slack), the delay past the timer's due time to its callback, us: the same percentiles,
#: same run, 1,000 timers 0.5-3 ms ahead.
WAKE_TIMER_US: tuple[float, ...] = (
    71.5, 73.4, 73.8, 74.1, 74.4, 74.6, 74.8, 75.1, 75.2, 75.4, 75.7, 75.7, 75.8, 76.0,
    76.1, 76.3, 76.4, 76.5, 76.6, 76.8, 77.0, 77.1, 77.3, 77.4, 77.5, 77.6, 77.7, 77.9,
    78.0, 78.3, 78.4, 78.7, 78.8, 79.0, 79.4, 79.5, 79.8, 80.0, 80.2, 80.3, 80.6, 80.8,
    81.0, 81.3, 82.0, 82.3, 82.8, 83.4, 84.4, 84.7, 85.8, 87.1, 88.8, 90.6, 91.5, 92.9,
    94.6, 95.7, 96.3, 97.0, 97.7, 98.5, 99.1, 99.9, 100.7, 101.5, 101.8, 102.8, 103.9,
    104.3, 105.7, 107.3, 108.3, 108.7, 109.6, 110.8, 111.8, 112.5, 113.3, 113.8, 114.3,
    114.8, 115.6, 116.3, 117.4, 118.1, 118.5, 119.0, 119.3, 119.8, 120.6, 121.0, 121.4,
    122.4, 123.1, 124.4, 125.3, 127.4, 131.3, 166.2, 907.9,
)  # fmt: skip

#: the free parameters' defaults: fitted on the real runs at 4 and 32 nodes of
#: docs/figures/calibration-real-2026-12-04c.json (5 interleaved rounds, their medians; the
#: spin giving way) by `rdmasched sim --calibrate --host-model "" --fit-sizes 4,32
#: --calibrate-real FILE`, from the defaults fitted before on the runs before the spin gave
#: way (docs/SIM.md, "Calibration", gives the scores on 8 and 16 nodes and on a second set)
MSG_CPU_NS = 2_000
TIMER_CPU_NS = 10_000
POST_CPU_NS = 10_000
SWITCH_CPU_NS = 10_000
PASS_CPU_NS = 0
COLD_CPU_NS = 5_000
CACHE_TURNS = 28
SLICE_NS = 0
WAKE_KEEP_PCT = 100.0

#: the keys `--host-model K=V,...` takes, and what each sets
SPEC_KEYS = {
    "cpus": "CPUs of the host",
    "spin_us": "a loop's spin after its last item, us",
    "spin_gives_way": "1: the spin yields its CPU to a waiting process after 10 us (the loop "
    "since fd92b8d); 0: it holds the CPU (the loop before)",
    "msg_us": "CPU per message handled, us (besides the link model's cpu_ns)",
    "timer_us": "CPU per timer handled, us",
    "post_us": "CPU per call posted to the loop's inbox, us",
    "switch_us": "CPU per turn on a CPU that last ran another process, us",
    "pass_us": "CPU per pass of a loop, once for what was queued when it began, us",
    "cold_us": "CPU a turn costs more when its caches went cold (see cache_turns), us",
    "cache_turns": "a turn is cold after more than this many turns of others (0: never)",
    "slice_us": "a turn this long yields to a process waiting for a CPU (0: never), us",
    "wake_pct": "draw wake-ups from their percentiles up to this one (50-100)",
    "wake": "'recorded' (WAKE_MSG_US, WAKE_TIMER_US) or 'none' (wake-ups take no time)",
}


#: the free parameters: their `--host-model` key -> (HostModel field, its unit in the key's)
FREE = {
    "msg_us": ("msg_cpu_ns", US),
    "timer_us": ("timer_cpu_ns", US),
    "post_us": ("post_cpu_ns", US),
    "switch_us": ("switch_cpu_ns", US),
    "pass_us": ("pass_cpu_ns", US),
    "cold_us": ("cold_cpu_ns", US),
    "cache_turns": ("cache_turns", 1),
    "slice_us": ("slice_ns", US),
    "wake_pct": ("wake_keep_pct", 1),
}


@dataclass(frozen=True)
class HostModel:
    """One host's CPUs and its processes' loops (module docstring)."""

    cpus: int = 2
    spin_us: float = 50.0
    #: the loop's spin gives its CPU to a process waiting for one after `SPIN_PAUSE_NS`
    #: (`rs_spin_step`, since commit fd92b8d); off: every poll a pause, the CPU held for the
    #: whole spin (the loop before; the real runs recorded before it)
    spin_gives_way: bool = True
    msg_cpu_ns: int = MSG_CPU_NS
    timer_cpu_ns: int = TIMER_CPU_NS
    post_cpu_ns: int = POST_CPU_NS
    #: CPU a turn costs on a CPU that last ran another process (the context switch and the
    #: caches refilled)
    switch_cpu_ns: int = SWITCH_CPU_NS
    #: CPU one pass of the loop costs, once for the items queued when it begins
    pass_cpu_ns: int = PASS_CPU_NS
    #: CPU a turn costs besides the switch when more than `cache_turns` turns of other
    #: processes came since its own last turn (its working set evicted); 0: never
    cold_cpu_ns: int = COLD_CPU_NS
    cache_turns: int = CACHE_TURNS
    #: a turn this long yields to a process waiting for a CPU; 0: never
    slice_ns: int = SLICE_NS
    #: wake-up latency percentiles, us (0th..100th, evenly spaced); () takes no time
    wake_msg_us: tuple[float, ...] = WAKE_MSG_US
    wake_timer_us: tuple[float, ...] = WAKE_TIMER_US
    #: draw the wake-ups from their percentiles up to this one only: the measured tail
    #: above it is other work on the host when it was measured, not the loop's
    wake_keep_pct: float = WAKE_KEEP_PCT

    def check(self) -> None:
        if self.cpus < 1:
            raise ArgumentError(f"host model: cpus must be >= 1, not {self.cpus}")
        if not 50 <= self.wake_keep_pct <= 100:
            raise ArgumentError(
                f"host model: wake_pct must be in 50..100, not {self.wake_keep_pct}"
            )
        if not (math.isfinite(self.spin_us) and self.spin_us >= 0):
            raise ArgumentError(f"host model: spin_us must be >= 0, not {self.spin_us}")
        for name, _ in FREE.values():
            if getattr(self, name) < 0:
                raise ArgumentError(f"host model: {name} must be >= 0")
        for name in ("wake_msg_us", "wake_timer_us"):
            q = getattr(self, name)
            if q and (len(q) < 2 or any(not (0 <= a <= b) for a, b in itertools.pairwise(q))):
                raise ArgumentError(
                    f"host model: {name} must be >= 2 ascending percentiles >= 0 (or none)"
                )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["wake_msg_us"] = list(self.wake_msg_us)
        d["wake_timer_us"] = list(self.wake_timer_us)
        return d

    def with_free(self, key: str, us: float) -> HostModel:
        """This model with free parameter `key` (FREE's keys) set to `us` (in the key's
        unit: microseconds, or a percentile)."""
        name, unit = FREE[key]
        kw: dict[str, Any]
        if not isinstance(getattr(self, name), int):  # a percentile
            kw = {name: float(us)}
        elif unit == 1 and us != int(us):  # a count
            raise ArgumentError(f"host model: {key} must be a whole number, not {us}")
        else:
            kw = {name: round(us * unit)}
        return replace(self, **kw)

    def free(self) -> dict[str, float]:
        """The fitted parameters, in their keys' units (FREE)."""
        return {
            key: getattr(self, name) / unit if unit != 1 else getattr(self, name)
            for key, (name, unit) in FREE.items()
        }


def parse_spec(text: str, base: HostModel | None = None) -> HostModel:
    """`--host-model` text: '' (the defaults) or K=V pairs, comma-separated (SPEC_KEYS)."""
    hm = base or HostModel()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SPEC_KEYS:
            raise ArgumentError(
                f"--host-model {part!r}: K=V pairs with K one of {', '.join(SPEC_KEYS)}"
            )
        value = value.strip()
        if key == "wake":
            if value == "recorded":
                hm = replace(hm, wake_msg_us=WAKE_MSG_US, wake_timer_us=WAKE_TIMER_US)
            elif value == "none":
                hm = replace(hm, wake_msg_us=(), wake_timer_us=())
            else:
                raise ArgumentError(f"--host-model wake={value!r}: 'recorded' or 'none'")
            continue
        try:
            v = float(value)
        except ValueError:
            v = -1.0
        if not (math.isfinite(v) and v >= 0) or (key == "cpus" and (v < 1 or v != int(v))):
            raise ArgumentError(f"--host-model {key}={value!r}: not a valid number")
        if key == "spin_gives_way" and v not in (0, 1):
            raise ArgumentError(f"--host-model {key}={value!r}: 0 or 1")
        if key == "cpus":
            hm = replace(hm, cpus=int(v))
        elif key == "spin_gives_way":
            hm = replace(hm, spin_gives_way=bool(v))
        elif key == "spin_us":
            hm = replace(hm, spin_us=v)
        else:
            hm = hm.with_free(key, v)
    hm.check()
    return hm


def draw(quantiles: Sequence[float], u: float) -> float:
    """The value at probability `u` (0..1) of a distribution given by evenly spaced
    percentiles (its inverse CDF, linear between them); 0 without percentiles."""
    if not quantiles:
        return 0.0
    x = u * (len(quantiles) - 1)
    i = min(int(x), len(quantiles) - 2)
    return quantiles[i] + (x - i) * (quantiles[i + 1] - quantiles[i])


def _kept(q: tuple[float, ...], pct: float) -> tuple[float, ...]:
    """Evenly spaced percentiles `q` (0th..100th) up to the `pct`-th (the draws' range)."""
    if not q or pct >= 100:
        return q
    return q[: max(2, int(pct / 100 * (len(q) - 1)) + 1)]


#: a process's states
SLEEP, WAKING, READY, RUN, SPIN = range(5)
#: kinds of item
MSG, TIMER, POST = range(3)


class Host:
    """The CPUs and the run queue of one host, and its processes (`HostEndpoint`)."""

    def __init__(self, engine: Engine, model: HostModel, seed: int) -> None:
        model.check()
        self.engine = engine
        self.model = model
        self.rng = random.Random(f"host-model/{seed}")
        #: the free CPUs, each as the process it ran last (-1: none yet)
        self.free_cpus: list[int] = [-1] * model.cpus
        self.runq: deque[HostEndpoint] = deque()
        #: the processes spinning on a CPU, in the order they began (node -> process); those
        #: due to give way are marked `giving` (one for each process waiting with work)
        self.spinning: dict[int, HostEndpoint] = {}
        self.spin_ns = round(model.spin_us * US)
        self.item_ns = (model.msg_cpu_ns, model.timer_cpu_ns, model.post_cpu_ns)
        self.wake_q = (_kept(model.wake_msg_us, model.wake_keep_pct),
                       _kept(model.wake_timer_us, model.wake_keep_pct))  # fmt: skip
        #: figures: CPU time by use, wake-ups, time waited in the run queue
        self.handle_ns = 0
        self.spun_ns = 0
        self.wakeups = 0
        self.wake_ns = 0
        self.queued_ns = 0
        self.turns = 0
        self.switches = 0
        self.passes = 0
        self.cold_turns = 0
        self.preemptions = 0
        self.give_ways = 0

    # ---- the drivers' classes, bound to this host ------------------------------------------
    def endpoint(
        self,
        engine: Engine,
        node: int,
        cpu_ns: int,
        handler: Callable[[_wire.Message, int], None],
        period_ns: int = 0,
        cost: Callable[[_wire.Message], int] | None = None,
    ) -> HostEndpoint:
        ep = HostEndpoint(engine, node, cpu_ns, handler, period_ns, cost)
        ep.host = self
        return ep

    def node(
        self, engine: Engine, net: Network, me: int, core: NodeCore, cpu_ns: int, ledger: Ledger
    ) -> HostCoreNode:
        return HostCoreNode(self, engine, net, me, core, cpu_ns, ledger)

    # ---- the run queue ---------------------------------------------------------------------
    def wake_ns_for(self, kind: int) -> int:
        q = self.wake_q[1] if kind == TIMER else self.wake_q[0]
        return round(draw(q, self.rng.random()) * US)

    def want_cpu(self, p: HostEndpoint) -> None:
        """`p` is runnable: on a free CPU now (the one it ran on last, if free), else at the
        back of the run queue."""
        free = self.free_cpus
        if free:
            last = free.pop(free.index(p.node)) if p.node in free else free.pop()
            p.on_cpu(last)
        else:
            p.state = READY
            p.since = self.engine.now
            self.runq.append(p)
            self.offer()

    def offer(self) -> None:
        """Processes wait for a CPU: as many spinners as they are give theirs, each once its
        spin is `SPIN_PAUSE_NS` old (`spin_gives_way`; the real spin's `sched_yield`)."""
        if not self.model.spin_gives_way:
            return
        need = self.waiting_with_work() - sum(ep.giving for ep in self.spinning.values())
        now = self.engine.now
        for ep in self.spinning.values():
            if need <= 0:
                break
            if not ep.giving:
                ep.giving = True
                need -= 1
                self.engine.at(max(now, ep.spin_began + SPIN_PAUSE_NS), ep.give_way, ep.spin_token)

    def waiting_with_work(self) -> int:
        """The processes in the run queue that have work: not a spinner that gave way and
        waits only to spin on (giving way to it would gain nothing)."""
        return sum(1 for p in self.runq if p.items or p.posts)

    def release(self, last: int) -> None:
        """Process `last` went to sleep: its CPU to the first one waiting."""
        if self.runq:
            p = self.runq.popleft()
            self.queued_ns += self.engine.now - p.since
            p.on_cpu(last)
        else:
            self.free_cpus.append(last)

    def figures(self, span_ns: int) -> dict[str, Any]:
        cap = max(1, span_ns) * self.model.cpus
        return {
            **self.model.as_dict(),
            "cpu_ms": (self.handle_ns + self.spun_ns) / 1e6,
            "cpu_busy_pct": 100.0 * (self.handle_ns + self.spun_ns) / cap,
            "cpu_handling_pct": 100.0 * self.handle_ns / cap,
            "cpu_spinning_pct": 100.0 * self.spun_ns / cap,
            "wakeups": self.wakeups,
            "wake_mean_us": self.wake_ns / self.wakeups / US if self.wakeups else None,
            "runq_wait_mean_us": self.queued_ns / self.turns / US if self.turns else None,
            "turns": self.turns,
            "switches": self.switches,
            "passes": self.passes,
            "cold_turns": self.cold_turns,
            "preemptions": self.preemptions,
            "give_ways": self.give_ways,
        }


class HostEndpoint(Endpoint):
    """A node's (or the coordinator's) process under the host model: its loop sleeps,
    wakes, waits for a CPU, handles its items one at a time and spins (module docstring)."""

    __slots__ = (
        "giving", "host", "items", "last_turn", "left", "posts", "since", "spin_began",
        "spin_end", "spin_token", "state", "turn_start",
    )  # fmt: skip

    def __init__(
        self,
        engine: Engine,
        node: int,
        cpu_ns: int,
        handler: Callable[[_wire.Message, int], None],
        period_ns: int = 0,
        cost: Callable[[_wire.Message], int] | None = None,
    ) -> None:
        super().__init__(engine, node, cpu_ns, handler, period_ns, cost)
        self.host: Host
        self.items: deque[tuple[int, Any, Any]] = deque()
        #: calls posted by the handlers: run before the next item, in order (the loop drains
        #: its inbox after every message and timer)
        self.posts: deque[tuple[int, Any, Any]] = deque()
        self.state = SLEEP
        self.since = 0
        self.spin_token = 0
        #: when its spin began and ends (0: no spin under way), and whether it is due to give
        #: its CPU to a waiting process (`Host.offer`)
        self.spin_began = 0
        self.spin_end = 0
        self.giving = False
        #: items of the current pass not yet taken (0: the next item begins a pass)
        self.left = 0
        #: the host's turn count at this process's last turn (-1: none yet)
        self.last_turn = -1
        #: when its turn on a CPU began
        self.turn_start = 0

    # ---- work in: a message, a timer due, a posted call --------------------------------------
    def arrive(self, m: _wire.Message, writer: int) -> None:
        if self.alive:
            self._push(MSG, m, writer)

    def fire(self, fn: Callable[..., None], *args: Any) -> None:
        """A timer of this process is due: run `fn(*args)` on its loop."""
        if self.alive:
            self._push(TIMER, fn, args)

    def post(self, fn: Callable[..., None], *args: Any) -> None:
        """A call queued on this process's loop inbox (run after the current item)."""
        if self.alive:
            self._push(POST, fn, args)

    def _push(self, kind: int, a: Any, b: Any) -> None:
        (self.posts if kind == POST else self.items).append((kind, a, b))
        st = self.state
        if st == SLEEP:
            host = self.host
            lat = host.wake_ns_for(kind)
            host.wakeups += 1
            host.wake_ns += lat
            self.state = WAKING
            if lat:
                self.engine.at(self.engine.now + lat, self._woken)
            else:
                self._woken()
        elif st == SPIN:  # spinning: handled at once, on the CPU it holds
            self._stop_spin()
            self.spin_token += 1
            self.state = RUN
            self._next()
        # WAKING, READY: queued for its turn (a spinner that gave way too); RUN: after the
        # current item

    def _woken(self) -> None:
        self.host.want_cpu(self)

    # ---- on a CPU ----------------------------------------------------------------------------
    def on_cpu(self, last: int) -> None:
        """A turn on a CPU that last ran process `last`."""
        host = self.host
        model = host.model
        others = host.turns - self.last_turn if self.last_turn >= 0 else None
        self.last_turn = host.turns = host.turns + 1
        self.state = RUN
        self.turn_start = self.engine.now
        cost = 0
        if last != self.node and model.switch_cpu_ns:
            host.switches += 1
            cost = model.switch_cpu_ns
        if model.cold_cpu_ns and (others is None or others > model.cache_turns):
            host.cold_turns += 1
            cost += model.cold_cpu_ns
        if cost:
            host.handle_ns += cost
            self.engine.at(self.engine.now + cost, self._next)
        else:
            self._next()

    def _next(self) -> None:
        """Handle the next item (it costs CPU from now), or spin when none is left."""
        engine = self.engine
        now = engine.now
        if not self.alive:
            self.items.clear()
            self.posts.clear()
            self.left = 0
        host = self.host
        if (
            host.runq
            and host.model.slice_ns
            and (self.items or self.posts)
            and now - self.turn_start >= host.model.slice_ns
        ):  # its slice is over and another waits: to the back of the queue, items kept
            host.preemptions += 1
            self.state = READY
            self.since = now
            host.runq.append(self)
            host.release(self.node)
            return
        if self.posts or self.items:
            self.spin_end = 0  # work: the next spin is a new one
        if self.posts:
            kind, a, b = self.posts.popleft()
        elif self.items:
            if not self.left:  # a pass begins: it takes what is queued now
                self.left = len(self.items)
                host.passes += 1
                if host.model.pass_cpu_ns:
                    host.handle_ns += host.model.pass_cpu_ns
                    engine.at(now + host.model.pass_cpu_ns, self._next)
                    return
            self.left -= 1
            kind, a, b = self.items.popleft()
        else:
            self.state = SPIN
            self.since = now
            if self.spin_end <= now:  # a new spin (else the rest of one that gave way)
                self.spin_began = now
                self.spin_end = now + host.spin_ns
                self.spin_token += 1
                engine.at(self.spin_end, self._spin_over, self.spin_token)
            host.spinning[self.node] = self
            if host.runq:
                host.offer()
            return
        cost = host.item_ns[kind]
        if kind == MSG:
            cost += self.cpu_ns if self.cost is None else self.cost(a)
            self.handled += 1
        host.handle_ns += cost
        self.busy_until = now + cost  # what the handler sends leaves at its item's end
        if kind == MSG:
            self.handler(a, b)
        else:
            a(*b)
        engine.at(now + cost, self._next)

    def _stop_spin(self) -> None:
        """It stops spinning on its CPU (work came, its spin ended, it gives way)."""
        host = self.host
        host.spun_ns += self.engine.now - self.since
        del host.spinning[self.node]
        self.giving = False

    def give_way(self, token: int) -> None:
        """Its spin yields the CPU to the first process waiting (`Host.offer`) and waits
        in the run queue for the rest of the spin."""
        if token != self.spin_token or self.state != SPIN or not self.giving:
            return  # work came, or its spin ended, since it was asked
        host = self.host
        self._stop_spin()
        if not host.waiting_with_work():  # nobody with work waits any more: it spins on
            host.spinning[self.node] = self
            self.since = self.engine.now
            return
        host.give_ways += 1
        self.state = READY
        self.since = self.engine.now
        host.runq.append(self)
        host.release(self.node)

    def _spin_over(self, token: int) -> None:
        if token != self.spin_token:
            return  # work came while it spun
        host = self.host
        if self.state == SPIN:
            self._stop_spin()
            self.spin_end = 0
            self.state = SLEEP
            host.release(self.node)
        elif self.state == READY and not (self.items or self.posts):
            # its spin ended while it waited in the queue after giving way: it sleeps
            host.runq.remove(self)
            self.spin_end = 0
            self.state = SLEEP


class HostCoreNode(CoreNode):
    """A node under rdmasched as one process of the host: its timers wake its loop, and what
    its workload asks the node (`Node.dispatch`, `sync_ready`, `complete`) is posted to the
    loop's inbox, as the threaded `Node` posts it."""

    def __init__(
        self,
        host: Host,
        engine: Engine,
        net: Network,
        me: int,
        core: NodeCore,
        cpu_ns: int,
        ledger: Ledger,
    ) -> None:
        super().__init__(engine, net, me, core, cpu_ns, ledger)
        self.hep = host.endpoint(engine, me, cpu_ns, self.on_message)
        self.ep = self.hep
        net.endpoints[me] = self.hep

    def tick(self) -> None:
        self.hep.fire(CoreNode.tick, self)

    def wake(self) -> None:
        self.hep.fire(CoreNode.wake, self)

    def submit_local(self, task: Any) -> None:
        self.hep.post(CoreNode.submit_local, self, task)

    def sync_ready(self, step: int, group: int = 1) -> None:
        self.hep.post(CoreNode.sync_ready, self, step, group)

    def complete(self, task: Any, runtime_ns: int) -> None:
        self.hep.post(CoreNode.complete, self, task, runtime_ns)


class HostShaped(Shaped):
    """The workload's backend under the host model: its timers (a task's end) are timers of
    the node's loop."""

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        ep = self.ep
        assert isinstance(ep, HostEndpoint)
        self.engine.at(self.engine.now + delay_ns, ep.fire, fn)


class HostSimLoop(SimLoop):
    """The central baseline's loop shim under the host model: its timers wake its process."""

    def call_later(self, delay_ns: int, fn: Callable[[], None]) -> None:
        ep = self._ep()
        assert isinstance(ep, HostEndpoint)
        self.engine.at(self.engine.now + delay_ns, ep.fire, fn)


# ---- measuring the wake-ups ------------------------------------------------------------------
def measure_wakeups(
    samples: int = 1000, spin_us: int = 50, gap_ms: tuple[float, float] = (1.0, 3.0)
) -> dict[str, Any]:
    """A sleeping loop's wake-up on this host, measured with the real loop and lanes: a
    receiver process runs `Loop.run` on shm lanes (spinning `spin_us` after each message,
    as the demo's nodes do); the sender writes a message stamped with the monotonic clock
    every `gap_ms` (uniform), long after the receiver's spin ended, and the receiver's
    handler records clock - stamp. Then the receiver sets `samples` timers, each 0.5-3 ms
    ahead from a timer's callback (its loop asleep in between), and records how late each
    callback ran. Returns both samples' percentiles (0, 1, ..., 100), us, and their p50/p99."""
    import multiprocessing as mp
    import os
    import time
    import uuid

    from rdmasched.daemon.links import ShmLinks
    from rdmasched.daemon.loop import Loop
    from rdmasched.demo.runner import remove_segments
    from rdmasched.wire import Kind

    ctx = mp.get_context("fork")
    name = f"wake{os.getpid() % 10000}{uuid.uuid4().hex[:6]}"
    r, w = ctx.Pipe(duplex=False)

    def receiver() -> None:
        links = ShmLinks(name, 1, [0])
        loop = Loop(links, spin_us=spin_us)
        msg_lat: list[int] = []
        timer_lat: list[int] = []
        rng = random.Random(2)

        def on_message(m: Any, peer: int) -> None:
            msg_lat.append(time.monotonic_ns() - m.arg0)
            if len(msg_lat) == samples:
                loop.call_later(5_000_000, timer)

        due = [0]

        def timer() -> None:
            now = time.monotonic_ns()
            if due[0]:
                timer_lat.append(now - due[0])
            if len(timer_lat) < samples:
                d = int(rng.uniform(0.5, 3.0) * 1e6)
                due[0] = now + d
                loop.call_at(due[0], timer)

        loop.run(on_message, until=lambda: len(timer_lat) >= samples)
        w.send((msg_lat, timer_lat))
        links.close()

    p = ctx.Process(target=receiver, daemon=True)
    p.start()
    try:
        links = ShmLinks(name, 0, [1])
        try:
            loop = Loop(links, spin_us=0)
            rng = random.Random(1)
            for _ in range(samples):
                time.sleep(rng.uniform(*gap_ms) / 1e3)
                loop.send(1, int(Kind.HEARTBEAT), arg0=time.monotonic_ns())
            if not r.poll(samples * 0.004 + 30):
                raise RuntimeError("the wake-up receiver did not report")
            msg_lat, timer_lat = r.recv()
        finally:
            links.close()
    finally:
        p.join(5)
        if p.is_alive():
            p.kill()
        remove_segments(name, 2)
    out: dict[str, Any] = {"samples": samples, "spin_us": spin_us, "gap_ms": list(gap_ms)}
    for key, xs in (("message", msg_lat), ("timer", timer_lat)):
        s = sorted(xs)
        out[key] = {
            "percentiles_us": [round(s[k * (len(s) - 1) // 100] / US, 1) for k in range(101)],
            "p50_us": round(s[len(s) // 2] / US, 1),
            "p99_us": round(s[min(len(s) - 1, len(s) * 99 // 100)] / US, 1),
            "mean_us": round(sum(s) / len(s) / US, 1),
        }  # fmt: skip
    return out
