"""Hierarchical sync, sans-IO: a group's SYNC_READYs combined per leaf, pod and cluster, and
the release sent back down (docs/SCALE.md, "Hierarchical sync", is the contract).

`SyncGroups` holds one node's view of its sync groups. The node core (core.py) drives it:
`define` / `ready` (this node reached a step) / `receive` (a SYNC_READY) / `node_gone` and
`node_back` (the membership's verdicts), and carries out what each returns, in order:

* `SendSync(dst, message)`: send the SYNC_READY `message` to node `dst` (through
  `NodeCore._send`, so relaying applies);
* `Release(group, step, trigger_ns)`: release the step here (the scheduler's `release`),
  at most once per (group, step) on this node;
* `Reject(reason, detail)`: an input refused (counted by the core).

**With a topology**, every group is a tree of domains: its members in leaves, the leaves in
pods, the pods in the cluster. The combiner of a domain is its first live member in the
group's order: by rail (rotated by the group id, so that different groups use different
rails), then leaf, then id. So the combiner of a pod is also the combiner of its own leaf,
the root is the combiner of its pod, and all combiners sit on one rail plane where they can.
A member sends its readiness to its leaf's combiner; a combiner whose domain is complete
(every live child ready) sends one combined readiness to the combiner of the parent domain;
the root releases and sends the release to the combiners below it, which pass it on. That is
2 (N - 1) messages per step for N members, and 3 levels up and 3 down.

**Without a topology** (the full mesh: tests, small clusters, the central baseline) every
member sends its readiness to every member and each counts for itself: N (N - 1) messages,
one hop. A member declared dead is no longer waited for, in both schemes.

Failures: a combiner's death changes the combiner of its domains to the next live member;
every node re-sends what it had reported to a combiner that changed (its own readiness,
its domains' combined readiness, and the last step it released, as a RELEASE). Readiness
for a step already released here is answered with that RELEASE; a RELEASE for a step
already released here is counted (`late`) and ignored. A member that comes back (it was
declared dead) is sent every remembered release, in order, by the nodes it is a new child
or parent of: it missed each step released while it was away. A step reported up and not
released for a while (`tick`) is reported again: a release lost in a relay that died
before its route heard of it comes back as the answer. Readiness and releases are facts
about (group, step), so a repeated one changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from rdmasched import messages as msg
from rdmasched.errors import ConfigError
from rdmasched.topology import Topology

#: SYNC_READY flag: combined readiness: the sender's leaf (with POD: its pod) is complete
COMBINED = 0x10
#: SYNC_READY flag, with COMBINED: the domain is the sender's pod, not its leaf
POD = 0x20
#: SYNC_READY flag: the step is released (the root saw every live member ready)
RELEASE = 0x40
#: every SYNC_READY flag this module defines
FLAGS = COMBINED | POD | RELEASE
#: released steps remembered per group, to answer readiness that comes after the release
HISTORY = 64

_MEMBER, _LEAF, _POD, _ROOT = -1, 0, 1, 2
_Domain = tuple[int, int]  # (level, index): (0, leaf), (1, pod), (2, 0)
_ROOT_DOMAIN: _Domain = (_ROOT, 0)
_VALID = frozenset({0, COMBINED, COMBINED | POD, RELEASE})


class SendSync(NamedTuple):
    """Send `message` to node `dst`."""

    dst: int
    message: msg.SyncReady


class Release(NamedTuple):
    """Release step `step` of `group` here; `trigger_ns`: when its last member was ready."""

    group: int
    step: int
    trigger_ns: int


class Reject(NamedTuple):
    """An input refused: count it under `reason`."""

    reason: str
    detail: str


SyncOut = SendSync | Release | Reject


class _Step:
    """What this node knows of one pending step."""

    __slots__ = ("age", "by", "done", "last", "mine", "ready", "up")

    def __init__(self) -> None:
        self.mine: int | None = None  # this node's own readiness time
        self.last = 0  # the time carried by the readiness recorded last
        self.ready: dict[int, int] = {}  # member -> readiness time (as its leaf's combiner)
        self.done: dict[_Domain, int] = {}  # domain known complete -> its latest readiness
        self.up: dict[int, int] = {}  # level this node reported at -> the node it went to
        #: the combiners that reported a domain complete here: the release goes back to
        #: them even if this node's view still names another (a death it has not heard of)
        self.by: set[int] = set()
        #: heartbeat periods since its reports went up (`SyncGroups.tick`)
        self.age = 0


class _Layout:
    """The tree of one group: a pure function of (group id, members, topology), so it is
    built once per process and shared by every node core there that defines the group
    (`_layout`). Its domains' first members (`first`) are their combiners while no member
    is dead. Nothing in it changes after it is built; what a node has seen (deaths, steps)
    is in that node's `_Group`."""

    __slots__ = (
        "first",
        "id",
        "leaf_of",
        "leaves",
        "members",
        "order",
        "pod_of",
        "pod_order",
        "pods",
    )

    def __init__(self, gid: int, members: frozenset[int], topology: Topology | None) -> None:
        self.id = gid
        self.members = members
        self.leaf_of: dict[int, int] = {}
        self.pod_of: dict[int, int] = {}
        self.order: tuple[int, ...] = tuple(sorted(members))
        self.leaves: dict[int, tuple[int, ...]] = {}  # leaf -> its members, in order
        self.pods: dict[int, tuple[int, ...]] = {}  # pod -> its leaves
        self.pod_order: dict[int, tuple[int, ...]] = {}  # pod -> its members, in order
        #: domain -> its first member in the group's order (its combiner if none is dead)
        self.first: dict[_Domain, int] = {}
        if topology is None:
            if self.order:
                self.first[_ROOT_DOMAIN] = self.order[0]
            return
        n = len(topology)
        bad = sorted(m for m in members if not 0 <= m < n)
        if bad:
            raise ValueError(f"group {gid}: members {bad} are not in the topology")
        rails = topology.rails
        node_leaf, leaf_pod, leaf_start = topology.node_leaf, topology.leaf_pod, topology.leaf_start
        leaf_of, pod_of = self.leaf_of, self.pod_of
        for m in members:
            x = node_leaf[m]
            leaf_of[m] = x
            pod_of[m] = leaf_pod[x]

        def key(m: int) -> tuple[int, int, int]:
            x = leaf_of[m]
            return ((m - leaf_start[x] - gid) % rails, x, m)

        self.order = tuple(sorted(members, key=key))
        leaves: dict[int, list[int]] = {}
        pods: dict[int, list[int]] = {}
        pod_order: dict[int, list[int]] = {}
        first = self.first
        for m in self.order:
            x, p = leaf_of[m], pod_of[m]
            if x not in leaves:
                leaves[x] = []
                pods.setdefault(p, []).append(x)
                first[_LEAF, x] = m
            leaves[x].append(m)
            if p not in pod_order:
                pod_order[p] = []
                first[_POD, p] = m
            pod_order[p].append(m)
        if self.order:
            first[_ROOT_DOMAIN] = self.order[0]
        self.leaves = {x: tuple(v) for x, v in leaves.items()}
        self.pods = {p: tuple(v) for p, v in pods.items()}
        self.pod_order = {p: tuple(v) for p, v in pod_order.items()}

    def in_domain(self, d: _Domain) -> tuple[int, ...]:
        """The members of domain `d`, in the group's order."""
        level, idx = d
        if level == _LEAF:
            return self.leaves.get(idx, ())
        if level == _POD:
            return self.pod_order.get(idx, ())
        return self.order


#: layouts of groups without a topology (a full mesh), shared the same way; bounded
_MESH_LAYOUTS: dict[tuple[int, frozenset[int]], _Layout] = {}
_MESH_LAYOUTS_MAX = 256


def _layout(gid: int, members: frozenset[int], topology: Topology | None) -> _Layout:
    """The layout of group `gid` over `members` in `topology`, built on first use. With a
    topology it is kept in the topology's cache (`Topology.shared`): it lives as long as
    the topology, and every core holding that topology gets the same object."""
    key = (gid, members)
    if topology is not None:
        return topology.shared(("sync-layout", key), lambda: _Layout(gid, members, topology))
    got = _MESH_LAYOUTS.get(key)
    if got is None:
        if len(_MESH_LAYOUTS) >= _MESH_LAYOUTS_MAX:
            _MESH_LAYOUTS.clear()
        got = _MESH_LAYOUTS[key] = _Layout(gid, members, None)
    return got


class _Group:
    """One node's view of one group: the shared layout, and this node's own state."""

    __slots__ = ("_comb", "dead", "history", "id", "layout", "members", "released", "steps")

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
        self.id = layout.id
        self.members = layout.members
        self.dead: set[int] = set()  # members declared dead, as this node knows
        self.released = -1
        self.history: dict[int, int] = {}  # released step -> trigger (the last HISTORY)
        self.steps: dict[int, _Step] = {}
        #: domain -> its combiner in this node's view (-1: no live member), computed when
        #: first asked for since the last change of `dead` (only while some member is dead)
        self._comb: dict[_Domain, int] = {}

    def comb(self, d: _Domain) -> int:
        """The combiner of domain `d`: its first live member in the group's order (-1:
        none live, or not a domain of the group)."""
        if not self.dead:
            return self.layout.first.get(d, -1)
        got = self._comb.get(d)
        if got is None:
            got = -1
            dead = self.dead
            for m in self.layout.in_domain(d):
                if m not in dead:
                    got = m
                    break
            self._comb[d] = got
        return got

    def view(self) -> None:
        """`dead` changed: combiners are computed again as they are asked for."""
        self._comb.clear()

    def domain(self, node: int, level: int) -> _Domain:
        if level == _LEAF:
            return (_LEAF, self.layout.leaf_of[node])
        if level == _POD:
            return (_POD, self.layout.pod_of[node])
        return _ROOT_DOMAIN


def on_route(topology: Topology, a: int, b: int, node: int, dead: Iterable[int] = ()) -> bool:
    """Whether `node` relays between `a` and `b`, either way: on their routes, or on the
    routes around the nodes `dead` (where a message went while those were known dead;
    docs/PROTOCOL.md section 10). The one test of "a message may be lost with `node`"."""
    try:
        if node in topology.path(a, b)[1:-1] or node in topology.path(b, a)[1:-1]:
            return True
        dead = frozenset(dead)
        if not dead:
            return False
        return (
            node in topology.path(a, b, dead=dead)[1:-1]
            or node in topology.path(b, a, dead=dead)[1:-1]
        )
    except (ConfigError, IndexError, ValueError):
        return False


class SyncGroups:
    """One node's sync groups (see the module doc). `topology` None: all-to-all."""

    def __init__(self, me: int, topology: Topology | None) -> None:
        self.me = me
        self.topology = topology
        self.groups: dict[int, _Group] = {}
        #: nodes declared dead (kept for groups defined later)
        self.dead: set[int] = set()
        #: reports re-sent because the combiner they went to changed
        self.resent = 0
        #: RELEASEs for a step already released here: counted, not acted on
        self.late = 0
        #: readiness for a step already released here (answered with the RELEASE in a tree)
        self.stale = 0
        #: steps released here
        self.releases = 0

    # ---- inputs ------------------------------------------------------------------------
    def define(self, group: int, members: Iterable[int]) -> list[SyncOut]:
        mem = frozenset(members)
        if group in self.groups:
            raise ValueError(f"group {group} is already defined")
        g = _Group(_layout(group, mem, self.topology))
        g.dead = {m for m in self.dead if m in mem}
        self.groups[group] = g
        return []

    def ready(self, group: int, step: int, now: int) -> list[SyncOut]:
        """This node reached `step` of `group`."""
        g = self.groups[group]
        me = self.me
        if me not in g.members:
            return [Reject("unknown-member", f"node {me} is not in group {group}")]
        if step <= g.released:
            return [Reject("stale-step", f"group {group} step {step}: {g.released} released")]
        st = self._step(g, step)
        if st.mine is not None:
            return []  # a repeated report changes nothing
        st.mine = st.last = now
        out: list[SyncOut] = []
        if self.topology is None:
            st.ready[me] = now
            m = msg.SyncReady(group, step, me, sent_ns=now, job=group)
            out += [SendSync(p, m) for p in g.layout.order if p != me and p not in g.dead]
        self._advance(g, step, out)
        return out

    def receive(self, group: int, flags: int, step: int, sent_ns: int, node: int) -> list[SyncOut]:
        """A SYNC_READY of `group` (defined here): `flags`, arg0 `step`, arg1 `sent_ns`,
        arg2 `node` (the member, or with flags the sender)."""
        g = self.groups[group]
        out: list[SyncOut] = []
        if flags not in _VALID:
            return [Reject("bad-flags", f"SYNC_READY of group {group} with flags {flags:#x}")]
        if node not in g.members:
            return [Reject("unknown-member", f"node {node} is not in group {group}")]
        if flags & RELEASE:
            self._release(g, step, sent_ns, node, out)
            return out
        tree = self.topology is not None
        if flags and not tree:
            return [Reject("bad-flags", f"combined readiness for group {group}, not a tree here")]
        if step <= g.released:
            self.stale += 1
            trigger = g.history.get(step)
            if tree and trigger is not None:  # it missed the release: answer with it
                out.append(SendSync(node, self._release_msg(g, step, trigger)))
            return out
        st = self._step(g, step)
        if flags:
            d = g.domain(node, _POD if flags & POD else _LEAF)
            if d in st.done:
                return out  # a repeated report changes nothing
            st.done[d] = st.last = sent_ns
            st.by.add(node)
        else:
            if node in st.ready:
                return out
            st.ready[node] = st.last = sent_ns
        self._advance(g, step, out)
        return out

    def tick(self, every: int) -> list[SyncOut]:
        """A heartbeat period passed. In a tree, a step this node reported up and has not
        seen released for `every` periods is reported again: its RELEASE (or the report)
        may have been lost in a relay that died before the nodes on the route heard of it,
        and a readiness for a released step is answered with its RELEASE. Once per
        `every` periods per pending step (a repeated report changes nothing)."""
        out: list[SyncOut] = []
        if self.topology is None:
            return out
        for g in self.groups.values():
            if not g.steps:
                continue
            for step in sorted(g.steps):
                st = g.steps[step]
                if not st.up:
                    continue
                st.age += 1
                if st.age >= every:
                    st.age = 0
                    self.resent += len(st.up)
                    st.up.clear()
                    self._advance(g, step, out)
        return out

    def node_gone(self, node: int) -> list[SyncOut]:
        """`node` was declared dead: stop waiting for it; its domains get new combiners."""
        self.dead.add(node)
        return self._view_changed(node)

    def node_back(self, node: int) -> list[SyncOut]:
        """`node` is alive again (a new incarnation): wait for it again from now on."""
        if node not in self.dead:
            return []
        self.dead.discard(node)
        return self._view_changed(node)

    # ---- lookups ---------------------------------------------------------------------------
    def combiner(self, group: int, node: int, level: int) -> int:
        """The node that combines `node`'s domain at `level` (0 leaf, 1 pod, 2 cluster) in
        this node's view; without a topology every member counts for itself: `node`."""
        g = self.groups[group]
        if self.topology is None:
            return node
        return g.comb(g.domain(node, level))

    def stats(self) -> dict[str, int]:
        """The counters: steps released here, reports re-sent to a new combiner, late
        RELEASEs (ignored) and readiness for released steps (answered in a tree)."""
        return {
            "releases": self.releases,
            "resent": self.resent,
            "late": self.late,
            "stale": self.stale,
        }

    def released(self, group: int) -> int:
        """The last step of `group` released here (-1: none)."""
        return self.groups[group].released

    # ---- internals ---------------------------------------------------------------------------
    @staticmethod
    def _step(g: _Group, step: int) -> _Step:
        st = g.steps.get(step)
        if st is None:
            st = g.steps[step] = _Step()
        return st

    def _release_msg(self, g: _Group, step: int, trigger: int) -> msg.SyncReady:
        return msg.SyncReady(g.id, step, self.me, sent_ns=trigger, job=g.id, flags=RELEASE)

    @staticmethod
    def _complete(g: _Group, d: _Domain, st: _Step) -> bool:
        """Every live child of domain `d` is ready."""
        level, idx = d
        lay = g.layout
        if level == _LEAF:
            ready, dead = st.ready, g.dead
            return all(m in ready or m in dead for m in lay.leaves[idx])
        if level == _POD:
            children = [(_LEAF, x) for x in lay.pods[idx]]
        else:
            children = [(_POD, p) for p in lay.pods]
        # a child domain without a live member has no combiner: not waited for
        done = st.done
        return all(c in done or g.comb(c) < 0 for c in children)

    def _advance(self, g: _Group, step: int, out: list[SyncOut]) -> None:
        """Combine what is known of `step`, release it at the root, report what is complete
        to the combiner above (again if that combiner changed)."""
        st = g.steps.get(step)
        me = self.me
        if st is None:
            return
        if self.topology is None:
            ready, dead = st.ready, g.dead
            for m in g.members:  # (a loop, not all() over a generator: no object made)
                if m not in ready and m not in dead:
                    return
            self._release(g, step, st.last, None, out)
            return
        if me not in g.members:
            return  # not in the tree: it combines nothing
        comb = g.comb
        if st.mine is not None and comb(g.domain(me, _LEAF)) == me:
            st.ready.setdefault(me, st.mine)
        for level in (_LEAF, _POD, _ROOT):
            d = g.domain(me, level)
            if comb(d) != me:
                break
            if d not in st.done:
                if not self._complete(g, d, st):
                    break
                st.done[d] = st.last  # the time of the readiness that completed it
        if _ROOT_DOMAIN in st.done and comb(_ROOT_DOMAIN) == me:
            self._release(g, step, st.done[_ROOT_DOMAIN], None, out)
            return
        for level in (_MEMBER, _LEAF, _POD):
            if level == _MEMBER:
                t = st.mine
            elif comb(g.domain(me, level)) == me:
                t = st.done.get(g.domain(me, level))
            else:
                break
            if t is None:
                continue
            to = comb(g.domain(me, level + 1))
            if to == me or st.up.get(level) == to:
                continue
            if level in st.up:
                self.resent += 1
            st.up[level] = to
            flags = 0 if level == _MEMBER else COMBINED | (POD if level == _POD else 0)
            out.append(SendSync(to, msg.SyncReady(g.id, step, me, t, job=g.id, flags=flags)))

    def _release(
        self, g: _Group, step: int, trigger: int, source: int | None, out: list[SyncOut]
    ) -> None:
        if step <= g.released:
            self.late += 1
            return
        g.released = step
        g.history[step] = trigger
        if len(g.history) > HISTORY:
            del g.history[min(g.history)]
        steps = g.steps
        st = steps.pop(step, None)
        reporters = () if st is None else sorted(st.by)
        # the partial reports of earlier steps go too (a list made only when there are some)
        if steps and min(steps) < step:
            for s in [s for s in steps if s < step]:
                del steps[s]
        self.releases += 1
        if self.topology is not None and self.me not in g.dead:
            m = self._release_msg(g, step, trigger)
            to = dict.fromkeys(self._children(g))
            to.update(dict.fromkeys(r for r in reporters if r not in g.dead))
            out += [SendSync(n, m) for n in to if n != source and n != self.me]
        out.append(Release(g.id, step, trigger))

    def _children(self, g: _Group) -> list[int]:
        """The nodes this node passes a release to: the combiners of the domains below the
        ones it combines, and the members of its leaf if it combines that."""
        me, comb, lay = self.me, g.comb, g.layout
        if me not in g.members:
            return []
        out: dict[int, None] = {}  # ordered, without repeats
        if comb(_ROOT_DOMAIN) == me:
            out.update((c, None) for p in lay.pods if (c := comb((_POD, p))) >= 0)
        if comb(g.domain(me, _POD)) == me:
            leaves = lay.pods[lay.pod_of[me]]
            out.update((c, None) for x in leaves if (c := comb((_LEAF, x))) >= 0)
        if comb(g.domain(me, _LEAF)) == me:
            out.update((m, None) for m in lay.leaves[lay.leaf_of[me]] if m not in g.dead)
        out.pop(me, None)
        return list(out)

    def _parents(self, g: _Group) -> set[int]:
        """The nodes this node reports to (its leaf's combiner, and the combiner above each
        domain it combines)."""
        me, comb = self.me, g.comb
        out = {comb(g.domain(me, _LEAF))}
        for level in (_LEAF, _POD):
            if comb(g.domain(me, level)) != me:
                break
            out.add(comb(g.domain(me, level + 1)))
        out.discard(me)
        return out

    def _via(self, to: int, node: int) -> bool:
        """Whether `node` relays this node's messages to `to`, or `to`'s answers back."""
        return self.topology is not None and on_route(self.topology, self.me, to, node)

    def _view_changed(self, node: int) -> list[SyncOut]:
        out: list[SyncOut] = []
        for g in self.groups.values():
            if node not in g.members:
                continue
            tree = self.topology is not None and self.me in g.members
            live = g.comb(_ROOT_DOMAIN) >= 0
            before = self._parents(g) if tree and live else set()
            below = set(self._children(g)) if tree and live else set()
            if node in self.dead:
                g.dead.add(node)
            else:
                g.dead.discard(node)
            g.view()
            if g.comb(_ROOT_DOMAIN) < 0:  # every member is dead
                continue
            if tree and node in self.dead:
                # a report whose route crossed the dead node may be lost with it: sent again
                # (around it; readiness for a released step is answered with the RELEASE)
                for st in g.steps.values():
                    for level, to in list(st.up.items()):
                        if node != to and self._via(to, node):
                            del st.up[level]
                            self.resent += 1
            if tree and g.released >= 0:
                # a new combiner above may have missed the last release: tell it; and a
                # new combiner below may have had no release from here
                m = self._release_msg(g, g.released, g.history[g.released])
                above = self._parents(g) - before
                under = set(self._children(g)) - below
                if node not in self.dead and (node in above or node in under):
                    # `node` came back: it missed the steps released while it was away,
                    # not only the last. Every one remembered, in order: it releases those
                    # after its own last, each once and in order (the rest are `late`)
                    above.discard(node)
                    under.discard(node)
                    hist = g.history
                    out += [SendSync(node, self._release_msg(g, s, hist[s])) for s in sorted(hist)]
                out += [SendSync(p, m) for p in sorted(above)]
                out += [SendSync(c, m) for c in sorted(under)]
            for step in sorted(g.steps):
                self._advance(g, step, out)
        return out


__all__ = [
    "COMBINED",
    "FLAGS",
    "HISTORY",
    "POD",
    "RELEASE",
    "Reject",
    "Release",
    "SendSync",
    "SyncGroups",
    "SyncOut",
    "on_route",
]
