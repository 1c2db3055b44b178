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
    lost: list[int] | None = None,
) -> int | None:
    """Pick a peer by power-of-two choices on their load hints; None if there is none.

    Candidates are the peers in ``loads`` other than ``self_id`` and those in ``dead``,
    with a load below ``max_load`` when it is given.  If any candidate shares
    ``my_domain``, only those are considered.  Two distinct candidates are drawn at random
    and the one with the lower load wins (ties: the lower id); a lone candidate wins.
    ``lost``, if given, gets the peer that lost the draw appended (for the decision event).
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
    if (loads[a], a) > (loads[b], b):
        a, b = b, a
    if lost is not None:
        lost.append(b)
    return a


class _Peer:
    """One peer's record. ``held`` and ``stale`` are made on first use (None until a task
    is forwarded to the peer): most links never hold a task, and an empty dict and set
    cost about 280 bytes per link (26 KB per node at 51 links, docs/SIM.md "Speed")."""

    __slots__ = ("dead", "domain", "held", "last_ns", "load", "stale")

    def __init__(self, domain: str, now: int) -> None:
        self.domain = domain
        self.last_ns = now
        self.load: int | None = None
        #: forwarded tasks it holds, by key (None: none yet)
        self.held: dict[int, Task] | None = None
        #: keys of held tasks recorded before this node's last rejoin (``mark_stale``)
        self.stale: set[int] | None = None
        self.dead = False


class PeerTable:
    """Liveness, load hints and forwarded tasks of this node's peers.

    A peer is dead once nothing has been heard from it for more than ``dead_after_us``
    while this node was listening (``expired``), or when ``mark_dead`` says so; it is alive
    again after ``revive`` (the daemon's membership decides that, docs/DAEMON.md).
    ``hold()`` records a task this node forwarded to a peer, by ``task_key(origin, id)``;
    ``take()`` hands the records of a peer back, once, for placing elsewhere.
    """

    __slots__ = ("_clock", "_domains", "_far", "_peers", "_where", "dead_after_ns")

    def __init__(self, *, clock: Callable[[], int], dead_after_us: int) -> None:
        if dead_after_us <= 0:
            raise ValueError(f"dead_after_us must be > 0, not {dead_after_us}")
        self._clock = clock
        self.dead_after_ns = dead_after_us * 1000
        self._peers: dict[int, _Peer] = {}
        self._domains: dict[int, str] = {}
        #: task key -> the peer that holds it
        self._where: dict[int, int] = {}
        #: placement candidates out of this node's links: node -> load, from the domain
        #: summaries (``set_far``)
        self._far: dict[int, int] = {}

    def add(self, peer: int, domain: str = "") -> None:
        """Declare a peer from the cluster config; it counts as alive from now."""
        p = self._peers.get(peer)
        if p is None:
            self._peers[peer] = _Peer(domain, self._clock())
        else:
            p.domain = domain
        self._domains[peer] = domain

    def _get(self, peer: int) -> _Peer:
        p = self._peers.get(peer)
        if p is None:
            domain = self._domains.setdefault(peer, "")
            p = self._peers[peer] = _Peer(domain, self._clock())
        return p

    def known(self, peer: int) -> bool:
        """Whether ``peer`` has an entry here (a link, or a node that held a task of ours)."""
        return peer in self._peers

    def forget(self, peer: int) -> None:
        """Drop the entry of ``peer`` (a far node) if it holds nothing of this node."""
        p = self._peers.get(peer)
        if p is not None and not p.held:
            del self._peers[peer]
            if peer not in self._far:
                self._domains.pop(peer, None)

    def drop_far(self, node: int) -> None:
        """``node`` is no placement candidate any more (it died)."""
        if self._far.pop(node, None) is not None and node not in self._peers:
            self._domains.pop(node, None)

    def set_far(self, candidates: Mapping[int, tuple[int, str]]) -> None:
        """The placement candidates beyond this node's links, ``node -> (load, domain)``:
        the lightest node of each other domain, from its summary (docs/SCALE.md,
        "Placement"). Replaces the previous set."""
        for node in self._far:
            if node not in candidates and node not in self._peers:
                self._domains.pop(node, None)
        self._far = {n: load for n, (load, _) in candidates.items()}
        for n, (_, domain) in candidates.items():
            self._domains[n] = domain
            p = self._peers.get(n)
            if p is not None:
                p.domain = domain

    def seen(self, peer: int, load: int) -> bool:
        """Any message (heartbeat or other) from ``peer``, with the load hint it carried;
        True if the hint fell (or is its first): ``peer`` may have room it had not.

        An unknown peer is added (domain ""); a dead one is alive again (it restarted:
        the tasks it held were already handed back).  The daemon only calls this for
        messages of a peer's live incarnation."""
        p = self._get(peer)
        p.last_ns = self._clock()
        old = p.load
        p.load = load
        p.dead = False
        return old is None or load < old

    def revive(self, peer: int) -> None:
        """``peer`` is alive again (a new incarnation): heard from now, load unknown."""
        p = self._get(peer)
        p.dead = False
        p.last_ns = self._clock()

    def refresh(self) -> None:
        """Count every live peer as heard from now: this node was not listening (it was
        stalled), so their silence says nothing."""
        now = self._clock()
        for p in self._peers.values():
            if not p.dead:
                p.last_ns = max(p.last_ns, now)

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
        """Peers silent for more than ``dead_after_us``, or marked dead, by id."""
        now = self._clock()
        return sorted(k for k, p in self._peers.items() if self._is_dead(p, now))

    def is_dead(self, peer: int) -> bool:
        """Marked dead (``mark_dead``/``reap``), whatever its silence."""
        p = self._peers.get(peer)
        return p is not None and p.dead

    def expired(self, listened_ns: int | None = None) -> list[int]:
        """Peers not yet marked dead that were silent for more than ``dead_after_us`` up
        to ``listened_ns`` (default now): the last time this node read its lanes."""
        now = self._clock() if listened_ns is None else listened_ns
        return sorted(
            k for k, p in self._peers.items() if not p.dead and now - p.last_ns > self.dead_after_ns
        )

    def loads(self) -> dict[int, int]:
        """Last load hint of every live peer that has sent one, and the candidates out of
        this node's links with their domain's load (``set_far``)."""
        now = self._clock()
        out = {
            k: p.load
            for k, p in self._peers.items()
            if p.load is not None and not self._is_dead(p, now)
        }
        for k, load in self._far.items():
            if k not in out:
                p = self._peers.get(k)
                if p is None or not p.dead:
                    out[k] = load
        return out

    def hold(self, peer: int, task: Task) -> None:
        """Record that ``task`` was forwarded to ``peer``."""
        key = (task.origin << 64) | task.id
        old = self._where.get(key)
        if old is not None and old != peer:
            held = self._peers[old].held
            if held is not None:
                held.pop(key, None)
        p = self._get(peer)
        if p.held is None:
            p.held = {}
        p.held[key] = task
        self._where[key] = peer

    def holds(self, key: int) -> bool:
        """Whether some peer holds the task ``key``."""
        return key in self._where

    def holder(self, key: int) -> int | None:
        """The peer that holds the task ``key`` (``task_key(origin, id)``), or None."""
        return self._where.get(key)

    def release(self, peer: int, key: int) -> Task | None:
        """``peer`` reported task ``key`` complete, or handed it back: forget it (None if
        it did not hold it)."""
        p = self._peers.get(peer)
        if p is None or p.held is None:
            return None
        t = p.held.pop(key, None)
        if t is not None:
            del self._where[key]
            if p.stale is not None:
                p.stale.discard(key)
        return t

    def release_any(self, key: int) -> tuple[int, Task] | None:
        """Forget task ``key`` whichever peer holds it."""
        peer = self._where.get(key)
        if peer is None:
            return None
        t = self.release(peer, key)
        return None if t is None else (peer, t)

    def held(self, peer: int) -> list[Task]:
        """Tasks this node forwarded to ``peer`` that it has not completed."""
        p = self._peers.get(peer)
        return [] if p is None or p.held is None else list(p.held.values())

    def holders(self) -> list[int]:
        """The peers that hold tasks of this node, by id."""
        return sorted(k for k, p in self._peers.items() if p.held)

    def held_count(self) -> int:
        """Tasks of this node held by peers, all peers together."""
        return len(self._where)

    def take(self, peer: int) -> list[Task]:
        """The tasks ``peer`` holds, forgotten here (to be placed again)."""
        p = self._peers.get(peer)
        if p is None or p.held is None:
            return []
        tasks = list(p.held.values())
        for k in p.held:
            del self._where[k]
        p.held.clear()
        p.stale = None
        return tasks

    def mark_stale(self) -> None:
        """This node rejoined: the tasks held by peers now were sent to its previous
        incarnation (``take_stale`` hands them back, peer by peer)."""
        for p in self._peers.values():
            p.stale = set(p.held) if p.held else None

    def take_stale(self, peer: int) -> list[Task]:
        """The tasks ``peer`` held when this node last rejoined and still holds, forgotten
        here; tasks forwarded to it since stay."""
        p = self._peers.get(peer)
        if p is None or p.held is None or p.stale is None:
            return []
        held = p.held
        tasks = [held.pop(k) for k in sorted(p.stale) if k in held]
        for t in tasks:
            del self._where[(t.origin << 64) | t.id]
        p.stale = None
        return tasks

    def mark_dead(self, peer: int) -> None:
        """``peer`` is dead until ``revive``: no load hint, not a placement candidate."""
        p = self._get(peer)
        p.dead = True
        p.load = None

    def reap(self) -> list[tuple[int, list[Task]]]:
        """Peers that died since the last call, each with the tasks it held (by id)."""
        out: list[tuple[int, list[Task]]] = []
        for k in self.expired():
            self.mark_dead(k)
            out.append((k, self.take(k)))
        return out
