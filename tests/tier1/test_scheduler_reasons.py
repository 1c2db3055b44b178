"""Why is it waiting (issue 22 item 7): the ranked reason codes of a queued task, one test
per code, their counts per reason, and the node core's Wake that ends a quantum's wait."""

from __future__ import annotations

from typing import Any

import pytest

from rdmasched.daemon.core import NodeCore, PreemptTask, SetTimer, Wake
from rdmasched.scheduler import FakeClock, PeerTable, Scheduler, Task, UnknownTaskError
from rdmasched.scheduler.reasons import Code

MS = 1_000_000


def make(nslots: int = 1, **kw: Any) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock(1 * MS)
    kw.setdefault("starvation_us", 10**9)
    return Scheduler(nslots, clock=clock, **kw), clock


def T(tid: int, prio: int, job: int = 0, hops: int = 0) -> Task:
    return Task(id=tid, job=job, priority=prio, cost_ns=1000, hops=hops)


def codes(s: Scheduler, tid: int) -> list[str]:
    return [str(r.code) for r in s.why(tid)]


def test_no_free_slot_and_does_not_outrank_with_the_figures() -> None:
    s, _ = make(4)
    for i, p in enumerate((9, 12, 30, 40)):
        s.dispatch(T(1 + i, p))
    s.dispatch(T(10, 5))
    got = s.why(10)
    assert [str(r.code) for r in got] == ["NoFreeSlot", "DoesNotOutrankLowestRunning"]
    assert got[0].message == "4/4 slots busy, 1 queued"
    assert got[1].message == "priority 5 <= lowest running 9 (task 1) on 4/4 slots"
    assert got[1].figures == {"priority": 5, "lowest_running": 9, "lowest_task": 1}
    s.dispatch(T(11, 9))  # equal priority does not outrank either
    assert codes(s, 11) == ["NoFreeSlot", "DoesNotOutrankLowestRunning"]


def test_queued_behind_the_head_and_behind_a_starved_task() -> None:
    s, _clock = make(1, quantum_us=1000)
    s.dispatch(T(1, 1))
    s.dispatch(T(2, 50))  # the head, held by the quantum
    s.dispatch(T(3, 20))  # outranks task 1 too, but behind task 2
    got = s.why(3)
    assert [str(r.code) for r in got] == ["NoFreeSlot", "QueuedBehind"]
    assert got[1].message == "1 queued task start before it (head: task 2 priority 50)"
    s2, clock2 = make(1, starvation_us=100)
    s2.dispatch(T(1, 10))
    s2.dispatch(T(2, 0))
    clock2.advance_us(200)  # task 2 is starved: no compute preemption meanwhile
    s2.dispatch(T(3, 60))
    got = s2.why(3)
    assert [str(r.code) for r in got] == ["NoFreeSlot", "QueuedBehind"]
    assert got[1].figures["starved"] is True and "a starved task goes first" in got[1].message


def test_run_quantum_says_how_long_it_ran_and_when_it_may_go() -> None:
    s, clock = make(1, quantum_us=10_000)
    s.dispatch(T(1, 3))
    clock.advance_us(2500)
    s.dispatch(T(2, 50))
    got = s.why(2)
    assert [str(r.code) for r in got] == ["NoFreeSlot", "RunQuantum"]
    assert got[1].figures == {
        "victim": 1,
        "victim_priority": 3,
        "ran_ns": 2500_000,
        "quantum_ns": 10 * MS,
        "in_ns": 7500_000,
    }
    assert "has run 2.5 ms of its 10 ms quantum: preemptable in 7.5 ms" in got[1].message
    clock.advance_us(7500)
    s.tick()
    assert s.why(2) == []  # it runs


def test_preemption_budget_exhausted_for_a_task_and_for_a_job() -> None:
    s, _ = make(1, task_budget=1)
    s.dispatch(T(1, 3))
    s.dispatch(T(2, 50))
    s.yielded(1, 0)
    s.complete(2)  # task 1 runs again, its one preemption spent
    s.dispatch(T(3, 60))
    got = s.why(3)
    assert [str(r.code) for r in got] == ["NoFreeSlot", "PreemptionBudgetExhausted"]
    assert "task 1 preempted 1/1 times" in got[1].message
    s, _ = make(2, job_budget=1, job_window_us=1_000_000)
    s.dispatch(T(1, 3, job=7))
    s.dispatch(T(2, 4, job=7))
    s.dispatch(T(3, 60))
    s.dispatch(T(4, 60))
    got = s.why(4)
    assert [str(r.code) for r in got] == ["NoFreeSlot", "PreemptionBudgetExhausted"]
    assert "job 7 preempted 1/1 times in 1 s" in got[1].message


def _with_peer() -> tuple[Scheduler, FakeClock, PeerTable]:
    clock = FakeClock(1 * MS)
    peers = PeerTable(clock=clock, dead_after_us=10**9)
    peers.add(1, "")
    s = Scheduler(1, clock=clock, starvation_us=10**9, node_id=0, peers=peers, max_hops=2)
    return s, clock, peers


def test_peer_refused_and_topology() -> None:
    s, _clock, peers = _with_peer()
    peers.seen(1, 0)
    s.dispatch(T(1, 90))
    out = s.submit(T(2, 10))  # busy here, peer 1 idle: it goes there
    assert type(out[0]).__name__ == "Forward"
    peers.seen(1, 5000)  # peer 1 is now loaded: no lighter peer when it comes back
    task = out[0].task
    s.receive(task, 1)  # peer 1 hands it back
    got = s.why(2)
    assert [str(r.code) for r in got] == [
        "NoFreeSlot",
        "DoesNotOutrankLowestRunning",
        "PeerRefused",
        "Topology",
    ]
    assert got[2].message == "peer 1 handed it back after 1 hop"
    assert got[3].message == "no live peer has a load below this node's 2000"
    s.dispatch(T(3, 10, hops=2))  # no hop left
    assert s.why(3)[-1].message == "made 2/2 hops: it stays here"


def test_waiting_counts_every_code_and_each_task_under_each_reason() -> None:
    s, _ = make(1, quantum_us=1000)
    s.dispatch(T(1, 5))
    s.dispatch(T(2, 50))  # RunQuantum
    s.dispatch(T(3, 20))  # QueuedBehind
    s.dispatch(T(4, 1))  # DoesNotOutrank
    counts = s.waiting_counts()
    assert set(counts) == {str(c) for c in Code}
    assert counts["NoFreeSlot"] == 3
    assert counts["RunQuantum"] == counts["QueuedBehind"] == 1
    assert counts["DoesNotOutrankLowestRunning"] == 1
    assert counts["PeerRefused"] == counts["GangIncomplete"] == 0


def test_why_of_a_running_or_unknown_task() -> None:
    s, _ = make(1)
    s.dispatch(T(1, 5))
    assert s.why(1) == []
    with pytest.raises(UnknownTaskError):
        s.why(99)


def test_the_node_core_asks_for_a_wake_and_the_task_preempts_then() -> None:
    hb = 50 * MS
    core = NodeCore(
        0,
        {0: ""},
        slots=1,
        inc=1,
        dead_after_ns=10 * hb,
        heartbeat_ns=hb,
        now=0,
        preemption={"quantum_us": 2000},
    )
    core.open(0)
    core.dispatch(T(1, 5), 0)
    fx = core.dispatch(T(2, 50), 100_000)
    assert Wake(2 * MS) in fx and not any(isinstance(e, PreemptTask) for e in fx)
    assert core.wake(1 * MS) == []  # early: nothing (a stale wake is harmless)
    fx = core.wake(2 * MS)
    assert [e.victim.id for e in fx if isinstance(e, PreemptTask)] == [1]
    # a driver that ignores Wake: the heartbeat tick does it, later
    core2 = NodeCore(
        0, {0: ""}, slots=1, inc=1, dead_after_ns=10 * hb, heartbeat_ns=hb, now=0,
        preemption={"quantum_us": 2000},
    )  # fmt: skip
    core2.open(0)
    core2.dispatch(T(1, 5), 0)
    core2.dispatch(T(2, 50), 100_000)
    fx = core2.tick(hb)
    assert any(isinstance(e, PreemptTask) for e in fx) and SetTimer(2 * hb) in fx
    # without settings: no Wake, ever
    core3 = NodeCore(0, {0: ""}, slots=1, inc=1, dead_after_ns=10 * hb, heartbeat_ns=hb, now=0)
    core3.dispatch(T(1, 5), 0)
    assert not any(isinstance(e, Wake) for e in core3.dispatch(T(2, 50), 1))


def test_the_preemption_table_of_the_config_and_its_doc() -> None:
    import re
    import tomllib
    from pathlib import Path

    from rdmasched.cluster import PREEMPTION_KEYS, ClusterConfig
    from rdmasched.errors import ConfigError

    doc = (Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md").read_text()
    sec = doc[doc.index("### `[preemption]`") : doc.index("## From the environment")]
    assert set(re.findall(r"^\| `([a-z_]+)` \|", sec, re.M)) == PREEMPTION_KEYS
    node = [{"name": "n0", "slots": 1}]
    (example,) = re.findall(r"```text\n(\[preemption\].*?)```", sec, re.S)
    c = ClusterConfig.from_dict({"node": node, **tomllib.loads(example)})
    assert dict(c.preemption) == {
        "quantum_us": 10000,
        "task_budget": 3,
        "job_budget": 20,
        "critical_priority": 200,
    }
    c = ClusterConfig.from_dict({"node": node, "preemption": {"quantum_us": 5}})
    assert dict(c.preemption) == {"quantum_us": 5}
    assert ClusterConfig.from_dict({"node": node}).preemption == {}
    for bad, says in (
        ({"quantum": 5}, "unknown [preemption] key(s) ['quantum']"),
        ({"quantum_us": -1}, "preemption.quantum_us must be an integer in 0..60000000"),
        ({"task_budget": "3"}, "preemption.task_budget must be an integer, not '3'"),
        ({"critical_priority": 300}, "preemption.critical_priority must be an integer in 0..255"),
    ):
        with pytest.raises(ConfigError, match=re.escape(says)):
            ClusterConfig.from_dict({"node": node, "preemption": bad})
    with pytest.raises(ConfigError, match=r"\[preemption\] must be a table"):
        ClusterConfig.from_dict(tomllib.loads('preemption = 3\n[[node]]\nname="a"\nslots=1\n'))


def test_the_daemon_options_override_the_config_key_by_key() -> None:
    from rdmasched.cli import _build
    from rdmasched.commands.daemon import daemon_policy

    parser, _ = _build()
    args = parser.parse_args(["daemon", "--quantum-us", "2000", "--job-budget", "4"])
    assert daemon_policy(args)["preemption"] == {"quantum_us": 2000, "job_budget": 4}
    assert "preemption" not in daemon_policy(parser.parse_args(["daemon"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["daemon", "--quantum-us", "-5"])
