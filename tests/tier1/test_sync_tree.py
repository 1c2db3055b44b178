"""Hierarchical sync (rdmasched/daemon/sync.py, docs/SCALE.md "Hierarchical sync"):
readiness combined per leaf, pod and cluster, released back down, on cores that hold a
generated topology, through tests/corenet.py's Cluster (the real codec on every message)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from rdmasched import messages as msg
from rdmasched.daemon import sync
from rdmasched.topology import Topology
from rdmasched.wire import Kind
from tests.codec import through_codec
from tests.corenet import DEAD_AFTER_NS, HEARTBEAT_NS, Cluster

_SYNC = int(Kind.SYNC_READY)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "SCALE.md"
GROUP = 5


def tree_cluster(
    n: int, leaf: int = 8, pod: int = 16, heartbeats: bool = True
) -> tuple[Cluster, Topology]:
    t = Topology.generate(nodes=n, leaf=leaf, pod=pod)
    c = Cluster(n, topology=t)
    if heartbeats:
        c.deliver()  # the opening heartbeats
    else:
        c.wire.clear()  # (a full mesh of them: slow at 512 nodes, and not what is counted)
    for i, core in c.cores.items():
        c.do(i, core.define_group(GROUP, frozenset(c.cores), c.now))
    c.sent.clear()
    return c, t


def synced(c: Cluster, node: int, step: int) -> int:
    return sum(1 for s in c.of(node, "sync") if s[1:3] == (GROUP, step))


def sync_sent(c: Cluster) -> dict[int, int]:
    out: dict[int, int] = {}
    for (src, _, kind), k in c.sent.items():
        if kind == _SYNC:
            out[src] = out.get(src, 0) + k
    return out


def test_released_on_every_member_exactly_once_when_the_last_reports() -> None:
    c, _ = tree_cluster(32)
    order = list(c.cores)
    random.Random(7).shuffle(order)
    for i in order[:-1]:
        c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
        c.deliver()
    assert not any(c.of(i, "sync") for i in c.cores)
    c.do(order[-1], c.cores[order[-1]].sync_ready(GROUP, 0, c.now))
    c.deliver()
    for i in c.cores:
        assert synced(c, i, 0) == 1, i
    # the next step runs the same way
    for i in order:
        c.do(i, c.cores[i].sync_ready(GROUP, 1, c.now))
    c.deliver()
    for i in c.cores:
        assert [s[2] for s in c.of(i, "sync")] == [0, 1]


@pytest.mark.parametrize("n", [8, 32, 128, 512])
def test_messages_per_step_grow_linearly_and_the_release_depth_is_bounded(n: int) -> None:
    c, t = tree_cluster(n, leaf=8, pod=64, heartbeats=False)
    leaves_per_pod = 64 // 8
    pods = len(t.pods)
    for step in range(2):
        c.sent.clear()
        for i, core in c.cores.items():
            c.do(i, core.sync_ready(GROUP, step, c.now))
        rounds = c.deliver_rounds()
        assert all(synced(c, i, step) == 1 for i in c.cores)
        per_node = sync_sent(c)
        total = sum(per_node.values())
        # one message up and one release down per member but the root: 2 (N - 1)
        assert total == 2 * (n - 1), (n, total)
        assert total / n < 2
        # no node sends more than its fan-out in the tree (one leaf, one pod, the pods)
        assert max(per_node.values()) <= (8 - 1) + (leaves_per_pod - 1) + (pods - 1) + 1
        # the readiness goes up at most 3 levels and the release down as many
        assert rounds <= 2 * 3
        # over the real links: every logical message takes at most the plan's hop bound
        links = sum(
            (len(t.path(src, dst)) - 1) * k
            for (src, dst, kind), k in c.sent.items()
            if kind == _SYNC
        )
        assert links <= 2 * (n - 1) * t.plan.hops
        row = [
            t.plan.scheme,
            f"{total:,}",
            f"{total / n:.2f}",
            str(max(per_node.values())),
            str(rounds),
            f"{links:,}",
        ]
        assert row == doc_rows()[n], n  # docs/SCALE.md section 9 shows these figures
        print(  # the figures of docs/SCALE.md, "Hierarchical sync" (pytest -s)
            f"N={n} step {step}: {total} messages ({total / n:.2f} per member), "
            f"most sent by one node {max(per_node.values())}, rounds {rounds}, "
            f"link traversals {links} ({links / n:.2f} per member, plan {t.plan.scheme})"
        )


def test_without_a_topology_every_member_tells_every_member() -> None:
    """The full mesh (no topology): today's all-to-all, N (N - 1) plain SYNC_READYs."""
    c = Cluster(4)
    c.deliver()
    for i, core in c.cores.items():
        c.do(i, core.define_group(GROUP, frozenset(c.cores), c.now))
    c.sent.clear()
    for i, core in c.cores.items():
        c.do(i, core.sync_ready(GROUP, 0, c.now))
    assert c.deliver_rounds() == 1
    assert sum(sync_sent(c).values()) == 4 * 3
    assert all(synced(c, i, 0) == 1 for i in c.cores)


def doc_rows() -> dict[int, list[str]]:
    """N -> the cells of docs/SCALE.md's table of messages per step."""
    rows = re.findall(r"^\| N = (\d+) \| (.+) \|$", DOCS.read_text(), re.M)
    return {int(n): [c.strip() for c in rest.split("|")] for n, rest in rows}


def roles(c: Cluster, t: Topology) -> dict[str, int]:
    """A combiner at each level, chosen so that they are different nodes."""
    s = c.cores[0].sync
    root = s.combiner(GROUP, 0, 2)
    other_pod = next(i for i in c.cores if t.pod(i) != t.pod(root))
    pod = s.combiner(GROUP, other_pod, 1)
    other_leaf = next(i for i in c.cores if t.pod(i) == t.pod(pod) and t.leaf(i) != t.leaf(pod))
    leaf = s.combiner(GROUP, other_leaf, 0)
    assert len({root, pod, leaf}) == 3
    return {"root": root, "pod": pod, "leaf": leaf}


def wait_dead(c: Cluster, node: int) -> None:
    live = [i for i in c.cores if i not in c.down]
    for _ in range(40):
        if all(c.cores[i].members.is_dead(node) for i in live):
            return
        c.advance(HEARTBEAT_NS)
    raise AssertionError(f"node {node} was not declared dead everywhere")


@pytest.mark.parametrize("when", ["before-forwarding", "after-forwarding"])
@pytest.mark.parametrize("role", ["leaf", "pod", "root"])
def test_a_combiner_killed_mid_step_neither_loses_the_step_nor_releases_it_twice(
    role: str, when: str
) -> None:
    c, t = tree_cluster(32)  # 4 leaves of 8 in 2 pods of 16: three levels
    victim = roles(c, t)[role]
    live = [i for i in c.cores if i != victim]
    last = next(i for i in live if t.pod(i) != t.pod(victim))
    first = [i for i in live if i != last]
    if when == "before-forwarding":
        # half the members reported when the combiner stops: what it held is lost
        for i in first[: len(first) // 2]:
            c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
        c.deliver()
        c.down.add(victim)
        for i in first[len(first) // 2 :]:
            c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
    else:
        # it reported and forwarded everything; it stops before the release comes back
        for i in [*first, victim]:
            c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
        c.deliver()
        c.down.add(victim)
    c.do(last, c.cores[last].sync_ready(GROUP, 0, c.now))
    c.deliver()
    wait_dead(c, victim)
    c.advance(5 * HEARTBEAT_NS)
    for i in live:
        assert synced(c, i, 0) == 1, (i, c.seen[i])
    # and the group goes on without it
    for i in live:
        c.do(i, c.cores[i].sync_ready(GROUP, 1, c.now))
    c.deliver()
    for i in live:
        assert synced(c, i, 1) == 1, i
    assert sum(c.cores[i].sync.resent for i in live) > 0


def test_a_member_that_dies_mid_step_leaves_the_group() -> None:
    """The rule: a member declared dead is not waited for; the step is released on the
    live members once each of them reported, and later steps go on without it."""
    c, t = tree_cluster(32)
    s = c.cores[0].sync
    victim = next(
        i for i in c.cores if i not in roles(c, t).values() and s.combiner(GROUP, i, 0) != i
    )
    live = [i for i in c.cores if i != victim]
    for i in live:
        c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
    c.deliver()
    assert not any(c.of(i, "sync") for i in live)  # the victim has not reported
    c.down.add(victim)
    wait_dead(c, victim)
    c.deliver()
    for i in live:
        assert synced(c, i, 0) == 1, i
    for i in live:
        c.do(i, c.cores[i].sync_ready(GROUP, 1, c.now))
    c.deliver()
    for i in live:
        assert synced(c, i, 1) == 1, i


def test_a_member_that_dies_mid_step_leaves_the_group_without_a_topology() -> None:
    c = Cluster(3)
    c.deliver()
    for i, core in c.cores.items():
        c.do(i, core.define_group(GROUP, frozenset(c.cores), c.now))
    for i in (0, 1):
        c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
    c.deliver()
    c.down.add(2)
    c.advance(DEAD_AFTER_NS + 3 * HEARTBEAT_NS)
    assert synced(c, 0, 0) == synced(c, 1, 0) == 1


def test_a_late_duplicate_release_is_counted_not_acted_on() -> None:
    c, _ = tree_cluster(32)
    for i, core in c.cores.items():
        c.do(i, core.sync_ready(GROUP, 0, c.now))
    c.deliver()
    late = c.cores[3].sync.late
    dup = msg.SyncReady(GROUP, 0, 9, sent_ns=c.now, job=GROUP, flags=sync.RELEASE)
    c.wire.append((9, 3, dup))
    c.deliver()
    assert synced(c, 3, 0) == 1
    assert c.cores[3].sync.late == late + 1


def test_readiness_before_define_group_is_kept_in_the_tree() -> None:
    t = Topology.generate(nodes=32, leaf=8, pod=16)
    c = Cluster(32, topology=t)
    c.deliver()
    early = [i for i in c.cores if i % 3 == 0]  # roots and combiners among the late ones
    for i in c.cores:
        if i not in early:
            c.do(i, c.cores[i].define_group(GROUP, frozenset(c.cores), c.now))
            c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
    c.deliver()
    assert sum(c.cores[i].sync_early_kept for i in early) > 0
    for i in early:
        c.do(i, c.cores[i].define_group(GROUP, frozenset(c.cores), c.now))
        c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
        c.deliver()
    for i in c.cores:
        assert synced(c, i, 0) == 1, i


def test_the_sync_flags_travel_through_the_codec() -> None:
    for flags in (0, sync.COMBINED, sync.COMBINED | sync.POD, sync.RELEASE):
        m = msg.SyncReady(GROUP, 3, 17, sent_ns=99, job=GROUP, flags=flags)
        assert msg.decode(through_codec(m)) == m


def test_a_whole_leaf_with_the_root_stopping_mid_step_loses_nothing() -> None:
    """Every combiner of the root's leaf and pod goes at once: the next live members take
    over each level, and the leaf without a live member is not waited for."""
    c, t = tree_cluster(32)
    root = c.cores[0].sync.combiner(GROUP, 0, 2)
    gone = {i for i in c.cores if t.leaf(i) == t.leaf(root)}
    live = [i for i in c.cores if i not in gone]
    for i in c.cores:
        c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
    c.down |= gone  # they reported; what they forwarded and the release are lost with them
    c.deliver()
    for _ in range(40):  # the leaf's members with no link out of it are cut off, not dead
        if all(c.cores[i].lost(v) for i in live for v in gone):
            break
        c.advance(HEARTBEAT_NS)
    inner = [v for v in gone if all(t.leaf(x) == t.leaf(v) for x in t.neighbours(v))]
    assert inner and all(v in c.cores[i]._cut for i in live for v in inner)
    c.advance(5 * HEARTBEAT_NS)
    for i in live:
        assert synced(c, i, 0) == 1, i
    assert c.cores[live[0]].sync.combiner(GROUP, live[0], 2) not in gone


def test_members_running_ahead_get_their_steps_in_order_across_a_combiner_death() -> None:
    """Members report steps 0 and 1 before either is released (allowed: reports for later
    steps are kept); a leaf combiner stops after forwarding both. Every live member runs
    the sync of step 0, then step 1, each once."""
    c, t = tree_cluster(32)
    victim = roles(c, t)["leaf"]
    live = [i for i in c.cores if i != victim]
    last = next(i for i in live if t.pod(i) != t.pod(victim))
    for step in (0, 1):
        for i in c.cores:
            if i != last:
                c.do(i, c.cores[i].sync_ready(GROUP, step, c.now))
    c.deliver()
    c.down.add(victim)
    for step in (0, 1):
        c.do(last, c.cores[last].sync_ready(GROUP, step, c.now))
    c.deliver()
    wait_dead(c, victim)
    c.advance(5 * HEARTBEAT_NS)
    for i in live:
        assert [s[2] for s in c.of(i, "sync")] == [0, 1], (i, c.seen[i])


def deliver_some(c: Cluster, k: int) -> None:
    """Deliver the first `k` messages in flight (the rest stay on the wire, in order)."""
    for _ in range(min(k, len(c.wire))):
        writer, to, m = c.wire.popleft()
        if c.passes(writer, to, m):
            c.deliver_one(writer, to, m)


@pytest.mark.parametrize("seed", range(4))
def test_random_deaths_mid_step_release_every_step_once_in_order(seed: int) -> None:
    """Members report each step when the last one was released here; messages are delivered
    a few at a time while two random nodes stop at random moments (mostly combiners)."""
    rng = random.Random(seed)
    c, _ = tree_cluster(32)
    steps = 6
    kills = sorted(rng.sample(range(2, 30), 2))
    reported = dict.fromkeys(c.cores, -1)
    for tick in range(4000):
        live = [i for i in c.cores if i not in c.down]
        if not kills and all(synced(c, i, steps - 1) for i in live):
            break
        if kills and tick >= kills[0]:
            kills.pop(0)
            s = c.cores[live[0]].sync
            combiners = sorted(
                {s.combiner(GROUP, i, lv) for i in live for lv in (0, 1, 2)} - c.down
            )
            c.down.add(rng.choice(combiners if rng.random() < 0.7 else live))
        for i in live:
            done = [s[2] for s in c.of(i, "sync")]
            if reported[i] < steps - 1 and (reported[i] < 0 or reported[i] in done):
                reported[i] += 1
                c.do(i, c.cores[i].sync_ready(GROUP, reported[i], c.now))
        deliver_some(c, rng.randint(1, 20))
        if not c.wire:
            c.advance(HEARTBEAT_NS)
    live = [i for i in c.cores if i not in c.down]
    assert len(c.down) == 2
    for i in live:
        assert [s[2] for s in c.of(i, "sync")] == list(range(steps)), (i, c.seen[i])


def test_the_tree_layout_is_shared_and_the_view_is_per_node() -> None:
    """A group's layout (its members' leaves, pods and order) is a function of the group,
    its members and the topology: every core of the process that defines the group holds
    the same one (built once, not once per core: O(N) at N nodes, not O(N^2)). What a node
    has seen (a death) stays its own."""
    c, _ = tree_cluster(64, leaf=8, pod=32, heartbeats=False)
    groups = [core.sync.groups[GROUP] for core in c.cores.values()]
    assert all(g.layout is groups[0].layout for g in groups)
    # a second group over the same members is laid out on its own (its own rail rotation)
    a, b = c.cores[0], c.cores[1]
    members = frozenset(c.cores)
    a.define_group(GROUP + 1, members, c.now)
    b.define_group(GROUP + 1, members, c.now)
    assert a.sync.groups[GROUP + 1].layout is b.sync.groups[GROUP + 1].layout
    assert a.sync.groups[GROUP + 1].layout is not a.sync.groups[GROUP].layout
    # a death seen by one node changes its view only
    root = a.sync.combiner(GROUP, 0, 2)
    assert b.sync.combiner(GROUP, 0, 2) == root
    a.sync.node_gone(root)
    assert a.sync.combiner(GROUP, 0, 2) != root
    assert b.sync.combiner(GROUP, 0, 2) == root
    assert root not in b.sync.groups[GROUP].dead
    a.sync.node_back(root)
    assert a.sync.combiner(GROUP, 0, 2) == root
    # the same members in another topology: another layout
    other = sync.SyncGroups(0, Topology.generate(nodes=64, leaf=16, pod=32))
    other.define(GROUP, members)
    assert other.groups[GROUP].layout is not groups[0].layout


def test_a_release_drops_the_partial_reports_of_earlier_steps() -> None:
    # without a topology: node 0 of {0, 1, 2}; step 0 never completes (2 skips it), step 1
    # and 3 do; each release forgets the steps up to it and keeps the later ones
    s = sync.SyncGroups(0, None)
    s.define(GROUP, [0, 1, 2])
    assert s.receive(GROUP, 0, 0, 100, 1) == []  # step 0: only 1
    s.receive(GROUP, 0, 2, 150, 1)  # step 2 reported by 1 only
    s.receive(GROUP, 0, 4, 160, 2)  # step 4 reported by 2 only
    s.ready(GROUP, 1, 200)
    s.receive(GROUP, 0, 1, 210, 1)
    out = s.receive(GROUP, 0, 1, 220, 2)
    assert out == [sync.Release(GROUP, 1, 220)]
    g = s.groups[GROUP]
    assert sorted(g.steps) == [2, 4] and s.released(GROUP) == 1
    assert s.receive(GROUP, 0, 0, 230, 2) == [] and s.stale == 1  # step 0 is gone
    s.ready(GROUP, 3, 300)
    s.receive(GROUP, 0, 3, 310, 1)
    assert s.receive(GROUP, 0, 3, 320, 2) == [sync.Release(GROUP, 3, 320)]
    assert sorted(g.steps) == [4]


# ---- a relay's death (issue 20 item 3) ---------------------------------------------------
#: 2 leaves of 4, each its own pod: a leaf dragonfly whose routes between the leaves cross
#: a gateway (node 5's route to node 1 is [5, 4, 0, 1]; nodes 4 and 6 are leaf 1's gateways)
T8 = Topology.generate(nodes=8, leaf=4, pod=4)


def run_steps(
    c: Cluster, steps: int, rng: random.Random, event: tuple[int, int, str, int] | None
) -> None:
    """Members report each step once they ran the sync of the one before (as a workload
    does), messages delivered a few at a time. `event` (tick, node, how, back_ns): at
    `tick`, `node` is killed (`how` "kill") or stopped ("stop": its lanes keep what comes
    in) for `back_ns`, then resumes: it notices its stall (and rejoins if it was long)."""
    reported = dict.fromkeys(c.cores, -1)
    for tick in range(3000):
        if event is not None and tick == event[0]:
            (c.down.add if event[2] == "kill" else c.stop)(event[1])
        for i, since in list(c.stopped.items()):
            if c.now >= since + event[3]:  # type: ignore[index]
                c.resume(i)
        live = [i for i in c.cores if i not in c.down and i not in c.stopped]
        if (
            (event is None or tick > event[0])
            and not c.stopped
            and all(synced(c, i, steps - 1) for i in live)
        ):
            return
        for i in live:
            done = [s[2] for s in c.of(i, "sync")]
            if reported[i] < steps - 1 and (reported[i] < 0 or reported[i] in done):
                reported[i] += 1
                c.do(i, c.cores[i].sync_ready(GROUP, reported[i], c.now))
        deliver_some(c, rng.randint(1, 12))
        if not c.wire:
            c.advance(HEARTBEAT_NS)
    raise AssertionError(
        "the group hangs: "
        + str({i: [s[2] for s in c.of(i, "sync")] for i in c.cores if i not in c.down})
    )


def t8_cluster() -> Cluster:
    c = Cluster(8, topology=T8)
    c.deliver()
    for i, core in c.cores.items():
        c.do(i, core.define_group(GROUP, frozenset(c.cores), c.now))
    return c


def test_t8_routes_cross_the_gateway_and_the_combiners_are_on_both_sides() -> None:
    """The case of issue 20 item 3: the combined readiness of leaf 1 goes from its combiner
    (5) to the root (1) through node 4."""
    c = t8_cluster()
    s = c.cores[0].sync
    assert s.combiner(GROUP, 0, 2) == 1 and s.combiner(GROUP, 6, 0) == 5
    assert T8.path(5, 1) == [5, 4, 0, 1]


@pytest.mark.parametrize("how", ["kill", "stop"])
@pytest.mark.parametrize("tick", [0, 3, 7])
def test_a_relay_between_combiners_that_dies_does_not_hang_the_group(how: str, tick: int) -> None:
    """Node 4 relays between leaf 1's combiner and the root. Killed (or stopped past
    dead_after, then rejoining), the readiness its death completes goes around it, and what
    it held is sent again: the group shrinks and goes on (docs/SCALE.md section 9). A stopped
    node that rejoins is waited for again and goes on with the group."""
    c = t8_cluster()
    run_steps(c, 6, random.Random(tick), (tick, 4, how, DEAD_AFTER_NS + 10 * HEARTBEAT_NS))
    live = [i for i in c.cores if i != 4]
    for i in live:
        assert [s[2] for s in c.of(i, "sync")] == list(range(6)), (i, c.seen[i])
    if how == "stop":  # it ran the steps released while it was waited for, in order, once
        mine = [s[2] for s in c.of(4, "sync")]
        assert mine == sorted(set(mine)) and mine[-1] == 5, mine


@pytest.mark.parametrize("seed", range(16))
def test_any_node_dying_or_stopping_mid_step_never_hangs_the_group(seed: int) -> None:
    """The rule (docs/SCALE.md section 9): a member's death, a relay's or a combiner's, at
    any moment and with messages in flight, leaves the live members running every step
    once, in order; a stopped member (briefly, or past dead_after: it rejoins) goes on with
    them."""
    rng = random.Random(seed)
    c = t8_cluster()
    victim = rng.randrange(8)
    how = rng.choice(["kill", "stop"])
    back = rng.choice([DEAD_AFTER_NS // 2, DEAD_AFTER_NS + rng.randint(2, 20) * HEARTBEAT_NS])
    run_steps(c, 6, rng, (rng.randint(0, 12), victim, how, back))
    for i in c.cores:
        if i != victim:
            assert [s[2] for s in c.of(i, "sync")] == list(range(6)), (i, victim, how)


def test_a_release_lost_in_a_relay_not_yet_known_dead_is_recovered() -> None:
    """Node 4 dies; its leaf's combiner (5) hears of it first, and its readiness, which the
    death completes, goes around 4 to the root (1). The root does not know yet, nor does
    node 0, the relay before 4 on the root's route back to 5: the RELEASE is written into
    4's lane and lost. The step is still released everywhere: a pending report is sent
    again every dead_after, and a readiness for a released step is answered with its
    RELEASE."""
    c = t8_cluster()
    live = [i for i in c.cores if i != 4]
    for i in live:
        c.do(i, c.cores[i].sync_ready(GROUP, 0, c.now))
    c.deliver()
    c.down.add(4)
    for i in (5, 6, 7):  # they see its lane close; 0 has not noticed yet
        c.do(i, c.cores[i].peer_lost(4, "its lane closed", c.now))
    c.deliver()
    assert synced(c, 1, 0) == 1 and not any(synced(c, i, 0) for i in (5, 6, 7))
    c.advance(DEAD_AFTER_NS + 10 * HEARTBEAT_NS)
    for i in live:
        assert synced(c, i, 0) == 1, (i, c.seen[i])
