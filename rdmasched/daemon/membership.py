"""Membership: incarnations of nodes, who is alive, and when a node must rejoin.

Pure decision logic with no threads, lanes or clock of its own: every input carries `now`
(nanoseconds on the node's monotonic clock) and every method returns the changes the node
must carry out. The rules and the argument for them are in docs/DAEMON.md ("Dead peers,
incarnations and rejoining"); in short:

* Every node runs as an **incarnation**, a number that grows: a process starts with one
  taken from the wall clock (so a restarted node has a larger one), and a node that finds
  it may have been declared dead takes the next one (`Rejoined`).
* A node's heartbeats carry, in their metadata, its incarnation, the incarnation of the
  receiver it knows as alive (`ack`), and the one it declared dead (`dead`).
* An incarnation ends once, for every node alike: when a node declares it dead after
  silence, or when a later incarnation of the same node is heard (`PeerGone`). Its tasks
  are then dropped wherever they are, and the tasks it held are placed again by their
  origins. Messages of an ended incarnation are ignored.
* A node that was stalled (its own loop did not run) for longer than a peer would wait
  before declaring it dead, or that hears it was declared dead, starts a new incarnation:
  it drops every task of another node it held, and places its own tasks held by a peer
  again only after that peer has acknowledged the new incarnation (`Replace`), so every
  COMPLETE the peer sent before is read first.

With a topology (docs/SCALE.md, "Liveness") a node watches only its links (its lanes) this
way. What it learns of other nodes, the **far** ones, comes as **news** on the heartbeats of
its links: `[node, incarnation, dead]` entries, each carried on `NEWS_REPEAT` rounds of
heartbeats by every node that learned something new from it (a flood over the links, one
heartbeat period per hop), at most `NEWS_MAX` per heartbeat. News only moves forward: a
later incarnation beats an earlier one, and at one incarnation "dead" beats "alive". A far
node that this node exchanges tasks with also gets a **notice** (a heartbeat with `"far"`
in its metadata, sent through relays, one per incarnation) so that each side knows which
incarnation of the other a DISPATCH was meant for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


class PeerGone(NamedTuple):
    """Incarnation `inc` of `peer` ended: stop sending to it (heartbeats aside), place
    again this node's tasks it held, drop its tasks held here."""

    peer: int
    inc: int
    why: str


class PeerJoined(NamedTuple):
    """`peer` is alive as incarnation `inc` (first heard, restarted or rejoined): send to
    it again (re-attach its lane if it is a new process) and answer with a heartbeat now."""

    peer: int
    inc: int
    #: an earlier incarnation of it was known (it restarted or rejoined)
    again: bool


class Rejoined(NamedTuple):
    """This node is a new incarnation: drop every task of another node held here, tell
    every peer at once (heartbeats), count peers as heard from now."""

    old: int
    new: int
    why: str


class Replace(NamedTuple):
    """`peer` acknowledged this node's new incarnation: place again this node's tasks it
    held (it dropped them when it learned of the new incarnation)."""

    peer: int


Change = PeerGone | PeerJoined | Rejoined | Replace

#: news entries one heartbeat carries, at most (the rest wait for the next heartbeats)
NEWS_MAX = 32
#: rounds of heartbeats a node carries a piece of news on, from when it learned it
NEWS_REPEAT = 2
#: far nodes this node keeps a view of, at most (beyond: the oldest it has no business with
#: are forgotten)
FAR_MAX = 1024
#: domain summaries of other leaves one heartbeat carries, besides the sender's own leaf's
SUMMARIES_PER_BEAT = 4


@dataclass(slots=True)
class PeerView:
    """What this node knows of one peer."""

    inc: int = 0  #: its incarnation as last heard (0: not heard yet)
    alive: bool = True  #: counted alive (peers in the config are, from the start)
    dead_inc: int = 0  #: the last of its incarnations this node declared ended (0: none)
    acked: bool = True  #: it has acknowledged this node's current incarnation


@dataclass(slots=True)
class FarView:
    """What this node knows of a node it has no link to (docs/SCALE.md, "Liveness")."""

    inc: int = 0  #: its incarnation as last learned (0: not known)
    alive: bool = True  #: not known to have ended
    dead_inc: int = 0  #: the last of its incarnations known to have ended (0: none)
    acked: int = 0  #: this node's incarnation it last acknowledged in a notice (0: none)
    told: int = 0  #: its incarnation this node last acknowledged to it in a notice


class Membership:
    """Incarnations and liveness of one node's view of the cluster (see the module doc).

    `inc` is this node's incarnation at start; `dead_after_ns` how long a peer waits for a
    message before declaring a node dead; `heartbeat_ns` the heartbeat period.
    """

    def __init__(
        self,
        me: int,
        peers: Iterable[int],
        *,
        inc: int,
        dead_after_ns: int,
        heartbeat_ns: int,
        now: int,
        gossip: bool = False,
    ) -> None:
        """`peers`: the nodes this one heartbeats (its links). `gossip`: spread deaths and
        new incarnations as news, and keep views of far nodes (with a topology)."""
        if inc <= 0:
            raise ValueError(f"an incarnation is > 0, not {inc}")
        if not 0 < heartbeat_ns < dead_after_ns:
            raise ValueError("need 0 < heartbeat period < dead_after")
        self.me = me
        self.inc = inc
        self.views: dict[int, PeerView] = {p: PeerView() for p in peers if p != me}
        self.dead_after_ns = dead_after_ns
        self.heartbeat_ns = heartbeat_ns
        #: a gap in this node's own running longer than this may have got it declared
        #: dead: its last heartbeat may be up to one period older than the gap's start
        self.stall_ns = dead_after_ns - heartbeat_ns
        self.last_tick_ns = now
        #: peers holding tasks of this node that wait for the peer's acknowledgement
        self.replace_pending: set[int] = set()
        self.rejoins = 0
        self.stale_ignored = 0
        self.gossip = gossip
        #: far nodes (no link), oldest first
        self.far: dict[int, FarView] = {}
        #: news to carry on the next heartbeats, oldest first: node -> [inc, dead, rounds left]
        self.news: dict[int, list[int]] = {}

    def _news(self, node: int, inc: int, dead: bool) -> None:
        if self.gossip:
            self.news.pop(node, None)
            self.news[node] = [inc, int(dead), NEWS_REPEAT]

    def news_out(self, consume: bool) -> list[list[int]]:
        """The news entries of the next heartbeat(s), at most `NEWS_MAX`, oldest first;
        `consume`: a round of heartbeats to every link carries them (counted)."""
        out: list[list[int]] = []
        for node, e in self.news.items():
            if len(out) == NEWS_MAX:
                break
            out.append([node, e[0], e[1]])
        if consume:
            for node, _, _ in out:
                e = self.news[node]
                e[2] -= 1
                if e[2] <= 0:
                    del self.news[node]
        return out

    # ---- what this node says ---------------------------------------------------------------
    def heartbeat_meta(self, peer: int) -> dict[str, Any]:
        """The metadata of this node's next heartbeat to `peer`."""
        v = self.views.get(peer)
        meta: dict[str, Any] = {"inc": self.inc}
        if v is not None:
            if v.alive and v.inc:
                meta["ack"] = v.inc
            if v.dead_inc:
                meta["dead"] = v.dead_inc
        return meta

    # ---- what this node hears --------------------------------------------------------------
    def accepts(self, peer: int) -> bool:
        """Whether a message (not a heartbeat) from `peer` is of a live incarnation."""
        v = self.views.get(peer)
        return v is None or v.alive

    def accepts_task_from(self, peer: int) -> bool:
        """Whether a DISPATCH of another node's task from `peer` was sent to this node's
        current incarnation: not if `peer` has not acknowledged it yet (it sent it to the
        previous one, and places it again itself when it learns of this one)."""
        v = self.views.get(peer)
        return v is None or (v.alive and v.acked)

    def on_heartbeat(self, peer: int, meta: Mapping[Any, Any] | None, now: int) -> list[Change]:
        """A heartbeat from `peer` with its metadata. Returns the changes; the caller
        drops the heartbeat (no sign of life) if `accepts(peer)` is false afterwards."""
        out: list[Change] = []
        if not meta:
            return out
        inc, ack, dead = meta.get("inc"), meta.get("ack", 0), meta.get("dead", 0)
        if type(inc) is not int or type(ack) is not int or type(dead) is not int or inc <= 0:
            return out  # not ours to read
        v = self.views.get(peer)
        if v is None:
            v = self.views[peer] = PeerView()
        if dead == self.inc:
            out.extend(self.rejoin(f"node {peer} declared incarnation {dead} dead", now))
        if inc < v.inc or inc <= v.dead_inc:
            self.stale_ignored += 1  # a message of an ended incarnation
            return out
        if inc > v.inc:
            again = v.inc != 0
            if again and v.alive:
                out.append(PeerGone(peer, v.inc, f"it is now incarnation {inc}"))
                v.dead_inc = v.inc
            if again:
                self._news(peer, inc, False)
            v.inc = inc
            v.alive = True
            out.append(PeerJoined(peer, inc, again))
        if ack == self.inc and not v.acked:
            v.acked = True
            if peer in self.replace_pending:
                self.replace_pending.discard(peer)
                out.append(Replace(peer))
        return out

    # ---- time --------------------------------------------------------------------------------
    def stalled(self, gap_ns: int, now: int) -> list[Change]:
        """This node did not run for `gap_ns` (its loop noticed): if a peer could have
        declared it dead meanwhile, rejoin as a new incarnation."""
        if gap_ns <= self.stall_ns:
            return []
        self.last_tick_ns = now
        return self.rejoin(f"this node did not run for {gap_ns / 1e6:.0f} ms", now)

    def tick(self, now: int, silent: Iterable[int]) -> list[Change]:
        """The heartbeat timer: `silent` are the peers heard from longer than
        `dead_after` ago (while this node listened). A tick that comes too late means
        this node was stalled: it rejoins instead of trusting its view."""
        gap = now - self.last_tick_ns - self.heartbeat_ns
        self.last_tick_ns = now
        if gap > self.stall_ns:
            return self.rejoin(f"its heartbeat timer ran {gap / 1e6:.0f} ms late", now)
        out: list[Change] = []
        for p in silent:
            v = self.views.get(p)
            if v is None or not v.alive:
                continue
            v.alive = False
            v.dead_inc = max(v.dead_inc, v.inc)
            self.replace_pending.discard(p)
            out.append(PeerGone(p, v.inc, "silent for too long"))
            if v.inc:
                self._news(p, v.inc, True)
        return out

    def gone(self, peer: int, why: str) -> list[Change]:
        """The transport says `peer` is gone (it closed its lane): its incarnation ended."""
        v = self.views.get(peer)
        if v is None or not v.alive:
            return []
        v.alive = False
        v.dead_inc = max(v.dead_inc, v.inc)
        self.replace_pending.discard(peer)
        if v.inc:
            self._news(peer, v.inc, True)
        return [PeerGone(peer, v.inc, why)]

    def rejoin(self, why: str, now: int) -> list[Change]:
        """Become a new incarnation (see `Rejoined`)."""
        old = self.inc
        self.inc += 1
        self.rejoins += 1
        self.last_tick_ns = now
        for p, v in self.views.items():
            v.acked = False
            if v.alive:
                self.replace_pending.add(p)
        self._news(self.me, self.inc, False)
        return [Rejoined(old, self.inc, why)]

    # ---- far nodes ----------------------------------------------------------------------
    def learn(self, node: int, inc: int, dead: bool, now: int, why: str = "") -> list[Change]:
        """News (or, with `why`, a notice or a summary) says incarnation `inc` of `node`
        is alive, or has ended (`dead`). Whatever is new here is acted on, and carried on
        as news (from a notice or a summary: only if an incarnation ended)."""
        spread = not why
        if inc <= 0:
            return []
        why = why or "news from the links"
        if node == self.me:
            if dead and inc == self.inc:
                return self.rejoin(f"incarnation {inc} was declared dead ({why})", now)
            return []
        v = self.views.get(node)
        if v is not None:  # a link: only its own heartbeats admit it; news may end it
            if inc <= v.dead_inc or inc < v.inc or (inc == v.inc and not dead):
                return []
            if not dead and not v.inc:  # its first incarnation: its heartbeat will say
                return []
            out: list[Change] = []
            if v.alive and v.inc:
                out.append(PeerGone(node, v.inc, f"incarnation {inc} is {why}"))
            v.alive = False
            v.dead_inc = max(v.dead_inc, v.inc, inc if dead else 0)
            self.replace_pending.discard(node)
            self._news(node, inc, dead)
            return out
        f = self.far.pop(node, None)
        if f is None:
            f = FarView()
        self.far[node] = f  # the most recently heard of, last
        if inc <= f.dead_inc or inc < f.inc or (inc == f.inc and not dead):
            return []
        out = []
        old, was_alive = f.inc, f.alive
        if dead:
            f.inc, f.alive, f.dead_inc = inc, False, inc
            if was_alive:
                out.append(PeerGone(node, inc, f"declared dead ({why})"))
        else:  # a later incarnation
            if was_alive and old:
                out.append(PeerGone(node, old, f"it is now incarnation {inc} ({why})"))
                f.dead_inc = max(f.dead_inc, old)
            f.inc, f.alive = inc, True
            out.append(PeerJoined(node, inc, bool(old) or not was_alive))
        if dead:
            self.replace_pending.discard(node)
        if spread or dead or old or not was_alive:
            self._news(node, inc, dead)
        return out

    def on_notice(self, peer: int, meta: Mapping[Any, Any], now: int) -> tuple[list[Change], bool]:
        """A far node's notice: `{"inc": its incarnation, "ack": this node's incarnation
        as it knows it, "far": 1}`. Returns the changes and whether to answer with a notice
        (it does not know this incarnation, or this node has not acknowledged its own)."""
        inc, ack = meta.get("inc"), meta.get("ack", 0)
        if type(inc) is not int or type(ack) is not int or inc <= 0:
            return [], False
        f = self.far.get(peer)
        if f is not None and (inc < f.inc or inc <= f.dead_inc):
            self.stale_ignored += 1  # a notice of an ended incarnation
            return [], False
        out = self.learn(peer, inc, False, now, "its notice")
        f = self.far[peer]
        f.acked = ack
        if ack == self.inc and peer in self.replace_pending:
            self.replace_pending.discard(peer)
            out.append(Replace(peer))
        return out, (f.told != inc or ack != self.inc)

    def far_view(self, node: int) -> FarView:
        f = self.far.get(node)
        if f is None:
            f = self.far[node] = FarView()
        return f

    def far_refuses(self, node: int) -> bool:
        """Whether a DISPATCH of its own task from far `node` may have been meant for an
        earlier incarnation of this node (it has not acknowledged this one in a notice)."""
        f = self.far.get(node)
        return f is None or f.acked != self.inc

    def prune(self, keep: Callable[[int], bool]) -> None:
        """Forget the oldest far views beyond `FAR_MAX`, except those `keep` names."""
        if len(self.far) <= FAR_MAX:
            return
        excess = len(self.far) - FAR_MAX
        for node in [n for n in self.far if not keep(n)][:excess]:
            del self.far[node]

    # ---- views --------------------------------------------------------------------------
    def is_dead(self, node: int) -> bool:
        """Known to have ended (a link declared dead, or a far node the news said so of)."""
        v = self.views.get(node)
        if v is not None:
            return not v.alive
        f = self.far.get(node)
        return f is not None and not f.alive

    def far_inc(self, node: int) -> int:
        """The incarnation of `node` as this node knows it (0: not known)."""
        v = self.views.get(node)
        if v is not None:
            return v.inc
        f = self.far.get(node)
        return 0 if f is None else f.inc

    def alive(self) -> list[int]:
        return sorted(p for p, v in self.views.items() if v.alive)

    def dead(self) -> list[int]:
        return sorted(p for p, v in self.views.items() if not v.alive)
