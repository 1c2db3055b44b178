"""Membership rules (rdmasched/daemon/membership.py), driven by hand: no threads, no clock.

Issue 7 items 6 and 17: a dead node is re-admitted as a new incarnation; a node that was
stalled, or hears it was declared dead, rejoins instead of trusting its view.
"""

from __future__ import annotations

import pytest

from rdmasched.daemon.membership import (
    Membership,
    PeerGone,
    PeerJoined,
    Rejoined,
    Replace,
)

MS = 1_000_000
DEAD = 200 * MS
BEAT = 20 * MS


def member(me: int, inc: int = 100, now: int = 0) -> Membership:
    return Membership(me, [0, 1, 2], inc=inc, dead_after_ns=DEAD, heartbeat_ns=BEAT, now=now)


def test_first_heartbeats_admit_the_peers() -> None:
    m = member(0)
    assert m.on_heartbeat(1, {"inc": 7}, 0) == [PeerJoined(1, 7, False)]
    assert m.on_heartbeat(1, {"inc": 7, "ack": 100}, 0) == []  # nothing new
    assert m.heartbeat_meta(1) == {"inc": 100, "ack": 7}
    assert m.heartbeat_meta(2) == {"inc": 100}  # not heard yet
    assert m.on_heartbeat(1, None, 0) == [] and m.on_heartbeat(1, {"inc": "x"}, 0) == []


def test_a_silent_peer_is_declared_dead_once_and_its_messages_ignored() -> None:
    m = member(0)
    m.on_heartbeat(1, {"inc": 7}, 0)
    assert m.tick(BEAT, []) == []
    assert m.tick(2 * BEAT, [1]) == [PeerGone(1, 7, "silent for too long")]
    assert m.tick(3 * BEAT, [1]) == []  # once
    assert not m.accepts(1) and m.dead() == [1]
    assert m.heartbeat_meta(1) == {"inc": 100, "dead": 7}  # it is told
    assert m.on_heartbeat(1, {"inc": 7}, 3 * BEAT) == []  # still the dead incarnation
    assert m.stale_ignored == 1 and not m.accepts(1)


def test_a_restarted_node_is_re_admitted_as_a_new_incarnation() -> None:
    m = member(0)
    m.on_heartbeat(1, {"inc": 7}, 0)
    m.tick(BEAT, [1])  # declared dead
    assert m.on_heartbeat(1, {"inc": 9}, 2 * BEAT) == [PeerJoined(1, 9, True)]
    assert m.accepts(1) and m.alive() == [1, 2]
    assert m.heartbeat_meta(1) == {"inc": 100, "ack": 9, "dead": 7}


def test_a_new_incarnation_of_a_live_peer_ends_the_old_one_first() -> None:
    m = member(0)
    m.on_heartbeat(1, {"inc": 7}, 0)
    assert m.on_heartbeat(1, {"inc": 8}, 0) == [
        PeerGone(1, 7, "it is now incarnation 8"),
        PeerJoined(1, 8, True),
    ]


def test_a_stalled_node_rejoins_instead_of_declaring_everyone_dead() -> None:
    m = member(0, now=0)
    m.on_heartbeat(1, {"inc": 7}, 0)
    m.on_heartbeat(2, {"inc": 5}, 0)
    # The heartbeat timer fires 1 s late: the peers look silent, but it is this node that
    # did not run. It rejoins; nobody is declared dead.
    out = m.tick(BEAT + 1000 * MS, [1, 2])
    assert out == [Rejoined(100, 101, "its heartbeat timer ran 1000 ms late")]
    assert m.alive() == [1, 2] and m.inc == 101
    assert m.replace_pending == {1, 2}
    assert not m.accepts_task_from(1)  # DISPATCHes sent to incarnation 100 are stale
    assert m.accepts(1)  # but its other messages count (COMPLETEs of our tasks)
    # Its tasks held by peer 1 are placed again once peer 1 acknowledged incarnation 101.
    assert m.on_heartbeat(1, {"inc": 7, "ack": 100}, 0) == []
    assert m.on_heartbeat(1, {"inc": 7, "ack": 101}, 0) == [Replace(1)]
    assert m.accepts_task_from(1) and not m.accepts_task_from(2)
    # Peer 2 dies before it acknowledged: its tasks are placed again through PeerGone.
    assert m.tick(m.last_tick_ns + BEAT, [2]) == [PeerGone(2, 5, "silent for too long")]
    assert m.replace_pending == set()


def test_a_gap_in_the_loop_rejoins_only_past_what_a_peer_waits() -> None:
    m = member(0)
    assert m.stalled(DEAD - BEAT, 0) == []  # no peer can have declared it dead yet
    out = m.stalled(DEAD - BEAT + 1, 0)
    assert len(out) == 1 and isinstance(out[0], Rejoined) and m.rejoins == 1


def test_hearing_it_was_declared_dead_makes_it_rejoin_once() -> None:
    m = member(0)
    m.on_heartbeat(1, {"inc": 7}, 0)
    out = m.on_heartbeat(1, {"inc": 7, "dead": 100}, 0)
    assert out == [Rejoined(100, 101, "node 1 declared incarnation 100 dead")]
    # heartbeats it sent before it learned of 101 still say 100 is dead: not again
    assert m.on_heartbeat(1, {"inc": 7, "dead": 100}, 0) == []
    assert m.on_heartbeat(1, {"inc": 7, "ack": 101, "dead": 100}, 0) == [Replace(1)]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        Membership(0, [1], inc=0, dead_after_ns=DEAD, heartbeat_ns=BEAT, now=0)
    with pytest.raises(ValueError):
        Membership(0, [1], inc=1, dead_after_ns=BEAT, heartbeat_ns=DEAD, now=0)


def test_the_loop_reports_its_own_stall_before_the_next_timer() -> None:
    import os
    import uuid

    from rdmasched.daemon.links import ShmLinks
    from rdmasched.daemon.loop import Loop

    links = ShmLinks(f"t{os.getpid()}-{uuid.uuid4().hex[:6]}", 0, [0], nslots=16)
    now = [0]
    loop = Loop(links, spin_us=0, clock=lambda: now[0])
    seen: list[tuple[str, int]] = []
    loop.stall_ns = 100 * MS
    loop.on_stall = lambda gap: seen.append(("stall", gap))

    def stopped_here() -> None:  # as if SIGSTOP hit inside this timer, for 1 s
        seen.append(("first", now[0]))
        now[0] += 1000 * MS

    loop.call_at(10, stopped_here)
    loop.call_at(20, lambda: seen.append(("second", now[0])))
    now[0] = 20
    try:
        loop.run(lambda m, p: None, until=lambda: len(seen) >= 3)
    finally:
        links.close()
    assert seen == [("first", 20), ("stall", 1000 * MS), ("second", 20 + 1000 * MS)]
    assert loop.stalls == 1


def test_a_complete_queued_for_a_dead_peer_goes_first_when_it_comes_back() -> None:
    # The lane to peer 1 is full when peer 1 is declared dead (it was stalled): the COMPLETE
    # waiting behind it must reach peer 1 if it rejoins, ahead of the acknowledging
    # heartbeat, or peer 1 would place a finished task again. Other messages are dropped.
    import os
    import threading
    import uuid

    from rdmasched._ring import Batch
    from rdmasched.daemon.links import ShmLinks
    from rdmasched.daemon.loop import Loop
    from rdmasched.wire import Kind

    name = f"t{os.getpid()}-{uuid.uuid4().hex[:6]}"
    got: list[ShmLinks] = []
    t = threading.Thread(target=lambda: got.append(ShmLinks(name, 1, [0, 1], nslots=16)))
    t.start()
    a = ShmLinks(name, 0, [0, 1], nslots=16)
    t.join()
    b = got[0]
    try:
        loop = Loop(a, spin_us=0)
        loop.keep_on_death = frozenset({int(Kind.COMPLETE)})
        sent = 0
        while not loop._outbox:  # fill the lane until messages queue
            loop.send(1, Kind.DISPATCH, sent)
            sent += 1
        sent -= 1  # the last one waits in the outbox: dropped with it
        loop.send(1, Kind.COMPLETE, 77)
        loop.send(1, Kind.DISPATCH, 1000)
        loop.mark_dead(1, "test")
        loop.send(1, Kind.COMPLETE, 78)  # made while it is dead: kept too
        assert loop.send(1, Kind.DISPATCH, 1001) is False
        loop.revive(1)  # the same process, rejoined
        loop.send(1, Kind.HEARTBEAT, 0)
        seen: list[tuple[int, int]] = []
        batch = Batch(64)
        deadline = 200
        while len(seen) < sent + 3 and deadline:
            loop._flush()  # what each pass of the loop does
            batch.clear()
            b.inbound.drain(batch)
            seen += [(m.kind, m.id) for m in batch]
            deadline -= 1
        assert seen[sent:] == [
            (int(Kind.COMPLETE), 77),
            (int(Kind.COMPLETE), 78),
            (int(Kind.HEARTBEAT), 0),
        ]
    finally:
        a.close()
        b.close()


def test_news_only_moves_forward_and_is_carried_a_bounded_number_of_times() -> None:
    """Issue 8 item 5: far nodes are known from news, in any order, with the same result."""
    from rdmasched.daemon.membership import NEWS_MAX, NEWS_REPEAT

    m = Membership(0, [1], inc=100, dead_after_ns=DEAD, heartbeat_ns=BEAT, now=0, gossip=True)
    assert m.learn(5, 7, True, 0) == [PeerGone(5, 7, "declared dead (news from the links)")]
    assert m.learn(5, 7, False, 0) == []  # older news: dead beats alive at one incarnation
    assert m.learn(5, 6, False, 0) == []  # an earlier incarnation
    assert m.is_dead(5) and m.far_inc(5) == 7
    assert m.learn(5, 8, False, 0) == [PeerJoined(5, 8, True)]  # restarted
    assert not m.is_dead(5)
    # the news waits to be carried NEWS_REPEAT rounds, at most NEWS_MAX entries a round
    for n in range(10, 10 + NEWS_MAX):
        m.learn(n, 3, True, 0)
    rounds = []
    while m.news:
        rounds.append(m.news_out(consume=True))
    assert all(len(r) <= NEWS_MAX for r in rounds)
    carried = [e[0] for r in rounds for e in r]
    assert all(carried.count(n) == NEWS_REPEAT for n in [5, *range(10, 10 + NEWS_MAX)])
    # news that this node's own incarnation is dead makes it rejoin; a link's is ended
    assert m.learn(1, 4, False, 0) == [] and m.alive() == [1]  # its own heartbeat admits it
    m.on_heartbeat(1, {"inc": 4}, 0)
    assert m.learn(1, 4, True, 0) == [PeerGone(1, 4, "incarnation 4 is news from the links")]
    (r,) = m.learn(0, 100, True, 0)
    assert isinstance(r, Rejoined) and m.inc == 101
