"""Where work goes when this node has no room: peer choice, spill-back, peer liveness.

Pure and clock-driven: the daemon feeds ``PeerTable`` with every message it receives from a
peer (each carries the sender's load hint) and asks it who is dead.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping

from rdmasched.scheduler.task import Task

#: how many times a task may be forwarded between peers before it must queue where it is
DEFAULT_MAX_HOPS = 2


def can_spill(hops: int, max_hops: int) -> bool:
    """The spill-back rule: a task that has made ``hops`` hops may be forwarded again
    only while ``hops < max_hops``; at the bound it is dispatched where it is."""
    return hops < max_hops


def choose_peer(
    loads: Mapping[int, int],
    domains: Mapping[int, str],
    my_domain: str,
    rng: random.Random,
    *,
    self_id: int | None = None,
    dead: Collection[int] = (),
    max_load: int | None = None,
) -> int | None:
    """Pick a peer by power-of-two choices on their load hints; None if there is none.

    Candidates are the peers in ``loads`` other than ``self_id`` and those in ``dead``,
    with a load below ``max_load`` when it is given.  If any candidate shares
    ``my_domain``, only those are considered.  Two distinct candidates are drawn at random
    and the one with the lower load wins (ties: the lower id); a lone candidate wins.
    """
    same: list[int] = []
    other: list[int] = []
    for peer, load in loads.items():
        if peer == self_id or peer in dead or (max_load is not None and load >= max_load):
            continue
        (same if domains.get(peer) == my_domain else other).append(peer)
    pool = same or other
    if not pool:
        return None
    if len(pool) == 1:
        return pool[0]
    pool.sort()  # the draw depends on the rng only, not on the mapping's order
    a, b = rng.sample(pool, 2)
    return a if (loads[a], a) <= (loads[b], b) else b


class _Peer:
    __slots__ = ("dead", "domain", "held", "last_ns", "load")

    def __init__(self, domain: str, now: int) -> None:
        self.domain = domain
        self.last_ns = now
        self.load: int | None = None
        self.held: dict[int, Task] = {}
        self.dead = False


class PeerTable:
    """Liveness, load hints and forwarded tasks of this node's peers.

    A peer is dead once nothing has been heard from it for more than ``dead_after_us``.
    ``hold()`` records a task this node forwarded to a peer; ``reap()`` hands back, once,
    the tasks held by peers that have died since the last call, for dispatch elsewhere.
    """

    __slots__ = ("_clock", "_domains", "_peers", "dead_after_ns")

    def __init__(self, *, clock: Callable[[], int], dead_after_us: int) -> None:
        if dead_after_us <= 0:
            raise ValueError(f"dead_after_us must be > 0, not {dead_after_us}")
        self._clock = clock
        self.dead_after_ns = dead_after_us * 1000
        self._peers: dict[int, _Peer] = {}
        self._domains: dict[int, str] = {}

    def add(self, peer: int, domain: str = "") -> None:
        """Declare a peer from the cluster config; it counts as alive from now."""
        p = self._peers.get(peer)
        if p is None:
            self._peers[peer] = _Peer(domain, self._clock())
        else:
            p.domain = domain
        self._domains[peer] = domain

    def seen(self, peer: int, load: int) -> None:
        """Any message (heartbeat or other) from ``peer``, with the load hint it carried.

        An unknown peer is added (domain ""); a dead one is alive again (it restarted:
        the tasks it held were already handed back)."""
        now = self._clock()
        p = self._peers.get(peer)
        if p is None:
            p = self._peers[peer] = _Peer("", now)
            self._domains[peer] = ""
        p.last_ns = now
        p.load = load
        p.dead = False

    @property
    def domains(self) -> Mapping[int, str]:
        """Peer -> topology domain."""
        return self._domains

    def _is_dead(self, p: _Peer, now: int) -> bool:
        return p.dead or now - p.last_ns > self.dead_after_ns

    def alive(self) -> list[int]:
        """Peers heard from within ``dead_after_us``, by id."""
        now = self._clock()
        return sorted(k for k, p in self._peers.items() if not self._is_dead(p, now))

    def dead(self) -> list[int]:
        """Peers silent for more than ``dead_after_us``, by id."""
        now = self._clock()
        return sorted(k for k, p in self._peers.items() if self._is_dead(p, now))

    def loads(self) -> dict[int, int]:
        """Last load hint of every live peer that has sent one."""
        now = self._clock()
        return {
            k: p.load
            for k, p in self._peers.items()
            if p.load is not None and not self._is_dead(p, now)
        }

    def hold(self, peer: int, task: Task) -> None:
        """Record that ``task`` was forwarded to ``peer``."""
        p = self._peers.get(peer)
        if p is None:
            p = self._peers[peer] = _Peer("", self._clock())
            self._domains[peer] = ""
        p.held[task.id] = task

    def release(self, peer: int, task_id: int) -> Task | None:
        """``peer`` reported ``task_id`` complete: forget it (None if it did not hold it)."""
        p = self._peers.get(peer)
        return None if p is None else p.held.pop(task_id, None)

    def release_any(self, task_id: int) -> tuple[int, Task] | None:
        """Forget ``task_id`` whichever peer holds it: a task that a peer spilled on to a
        third node completes there, not on the peer it was forwarded to."""
        for k, p in self._peers.items():
            t = p.held.pop(task_id, None)
            if t is not None:
                return k, t
        return None

    def held(self, peer: int) -> list[Task]:
        """Tasks this node forwarded to ``peer`` that it has not completed."""
        p = self._peers.get(peer)
        return [] if p is None else list(p.held.values())

    def reap(self) -> list[tuple[int, list[Task]]]:
        """Peers that died since the last call, each with the tasks it held (by id)."""
        now = self._clock()
        out: list[tuple[int, list[Task]]] = []
        for k in sorted(self._peers):
            p = self._peers[k]
            if not p.dead and now - p.last_ns > self.dead_after_ns:
                p.dead = True
                p.load = None
                tasks = list(p.held.values())
                p.held.clear()
                out.append((k, tasks))
        return out
