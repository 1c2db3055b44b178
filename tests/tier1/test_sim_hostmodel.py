"""The simulator's host model (issue 21 item 5, rdmasched/sim/hostmodel.py): N processes
sharing a host's CPUs through one run queue, each a loop that spins after its last item and
sleeps, woken with a latency drawn from a measured distribution. Its arithmetic, its draws
(deterministic per seed), and that it is off by default."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

import pytest

from rdmasched._ring import SPIN_PAUSE_NS
from rdmasched.cli import main
from rdmasched.demo.job import WorkloadConfig
from rdmasched.errors import ArgumentError
from rdmasched.sim import PRESETS, SimConfig, simulate
from rdmasched.sim.engine import Engine
from rdmasched.sim.hostmodel import (
    WAKE_MSG_US,
    WAKE_TIMER_US,
    Host,
    HostModel,
    draw,
    parse_spec,
)
from rdmasched.sim.report import FIT_GRID, calibrate, real_runs, reals_from, score

US = 1_000
#: no wake-up latency, no spin: only the run queue's arithmetic
BARE = HostModel(
    cpus=2, spin_us=0, msg_cpu_ns=0, timer_cpu_ns=100 * US, post_cpu_ns=0, switch_cpu_ns=0,
    pass_cpu_ns=0, cold_cpu_ns=0, slice_ns=0, wake_msg_us=(), wake_timer_us=(),
)  # fmt: skip


def _host(model: HostModel) -> tuple[Engine, Host]:
    eng = Engine()
    return eng, Host(eng, model, seed=1)


def _run(eng: Engine) -> None:
    eng.run(lambda: False, 10**12)


def test_run_queue_three_turns_on_two_cpus() -> None:
    """Three processes each with one 100 us item at t=0 on 2 CPUs: two run at once, the
    third waits for a CPU and ends at 200 us."""
    eng, host = _host(BARE)
    ends: dict[int, int] = {}
    eps = [host.endpoint(eng, i, 0, lambda m, w: None) for i in range(3)]
    for i, ep in enumerate(eps):
        eng.at(0, ep.fire, lambda i=i: ends.setdefault(i, eng.now))
    _run(eng)
    # a handler runs at the start of its item: 0, 0 and 100 us; the CPUs were busy 300 us
    assert ends == {0: 0, 1: 0, 2: 100 * US}
    assert host.handle_ns == 300 * US
    assert host.queued_ns == 100 * US  # the third waited one item's time
    assert len(host.free_cpus) == 2


def test_one_process_handles_its_items_in_a_row_and_posts_first() -> None:
    """One process: its items one after the other, each its cost; a call its handler posts
    runs before the next item (the loop drains its inbox after every timer)."""
    eng, host = _host(replace(BARE, post_cpu_ns=10 * US))
    ep = host.endpoint(eng, 0, 0, lambda m, w: None)
    seen: list[tuple[str, int]] = []

    def first() -> None:
        seen.append(("first", eng.now))
        ep.post(lambda: seen.append(("posted", eng.now)))

    eng.at(0, ep.fire, first)
    eng.at(0, ep.fire, lambda: seen.append(("second", eng.now)))
    _run(eng)
    assert seen == [("first", 0), ("posted", 100 * US), ("second", 110 * US)]


def _a_then_b(gives_way: bool, a2_us: int) -> tuple[Host, dict[str, int]]:
    """One CPU, a spin of 50 us, wake-ups of 20 us: timers of process a at 0, `a2_us` and
    1000 us, and of process b at 110 us; when each ran."""
    model = replace(BARE, cpus=1, spin_us=50, wake_timer_us=(20.0, 20.0), spin_gives_way=gives_way)
    eng, host = _host(model)
    a = host.endpoint(eng, 0, 0, lambda m, w: None)
    b = host.endpoint(eng, 1, 0, lambda m, w: None)
    seen: dict[str, int] = {}
    for t, ep, name in ((0, a, "a1"), (a2_us, a, "a2"), (110, b, "b"), (1000, a, "a3")):
        eng.at(t * US, ep.fire, lambda name=name: seen.setdefault(name, eng.now))
    _run(eng)
    return host, seen


def test_spin_keeps_the_cpu_and_takes_work_without_a_wake_up() -> None:
    """After its last item a process spins `spin_us` on its CPU: work in that time is
    handled at once (no wake-up); after it, the process sleeps and the next item pays a
    wake-up. With `spin_gives_way` off (the loop before commit fd92b8d: every poll a
    pause), the spin holds the CPU from another process."""
    # a wakes at 20 us, its item ends at 120, it spins to 170: a timer due at 130 is
    # handled at once, without a wake-up; b is woken at 110 (+20 us) and waits for the one
    # CPU: a runs to 230 and spins to 280; a timer of a at 1000, long after its spin: a
    # wake-up of 20 us, and the CPU is free
    host, seen = _a_then_b(gives_way=False, a2_us=130)
    assert seen == {"a1": 20 * US, "a2": 130 * US, "b": 280 * US, "a3": 1020 * US}
    assert host.wakeups == 3  # a at 0, b, a at 1000; not a at 130 (spinning)
    assert host.spun_ns == (10 + 50 + 50 + 50) * US
    assert host.queued_ns == 150 * US  # b, from 130 to 280


def test_a_spin_gives_its_cpu_to_a_waiting_process_after_its_pause() -> None:
    """The real spin (`rs_spin_step`) polls with a pause for its first `SPIN_PAUSE_NS`,
    then yields between polls: a process waiting for the CPU gets it, and the spinner waits
    in the run queue for the rest of its spin. If its spin ends there with no work, it
    sleeps (leaves the queue); work that came meanwhile it handles at its turn."""
    assert SPIN_PAUSE_NS == 10 * US
    # a wakes at 20 us, handles 20-120 and spins from 120; b wakes at 130, a's spin is 10 us
    # old: a gives way at once, b runs 130-230; a timer of a at 150, while it waits in the
    # queue: no wake-up; b spins from 230 and gives way at 240 to a, which handles it
    # 240-340; b's spin ends in the queue at 280: it sleeps
    host, seen = _a_then_b(gives_way=True, a2_us=150)
    assert seen == {"a1": 20 * US, "b": 130 * US, "a2": 240 * US, "a3": 1020 * US}
    assert host.wakeups == 3  # a at 0, b, a at 1000; not a at 150 (queued)
    assert host.give_ways == 2
    # a 120-130, b 230-240, a 340-390 and 1120-1170
    assert host.spun_ns == (10 + 10 + 50 + 50) * US
    assert host.queued_ns == 110 * US  # a, from 130 to 240 (b left the queue asleep)
    assert not host.runq and len(host.free_cpus) == 1


def test_a_spinner_alone_keeps_spinning_and_gives_way_to_each_waiting_process() -> None:
    """Two spinners on two CPUs and two processes woken while they spin: each spinner gives
    its CPU to one of them; with nobody waiting a spin runs its whole length."""
    model = replace(BARE, cpus=2, spin_us=50, wake_timer_us=(0.0, 0.0))
    eng, host = _host(model)
    eps = [host.endpoint(eng, i, 0, lambda m, w: None) for i in range(4)]
    seen: dict[str, int] = {}
    for i in (0, 1):  # handle 0-100, spin from 100
        eng.at(0, eps[i].fire, lambda i=i: seen.setdefault(f"s{i}", eng.now))
    for i in (2, 3):  # woken at 105: both spinners are 5 us in, and give way at 110
        eng.at(105 * US, eps[i].fire, lambda i=i: seen.setdefault(f"w{i}", eng.now))
    _run(eng)
    assert seen == {"s0": 0, "s1": 0, "w2": 110 * US, "w3": 110 * US}
    assert host.give_ways == 2
    # the spinners 100-110 each; the woken ones spin their whole 50 us after 210 (the
    # spinners' spins ended in the queue at 150)
    assert host.spun_ns == (10 + 10 + 50 + 50) * US


def test_switch_costs_a_turn_on_a_cpu_another_process_ran() -> None:
    eng, host = _host(replace(BARE, cpus=1, switch_cpu_ns=7 * US))
    a = host.endpoint(eng, 0, 0, lambda m, w: None)
    b = host.endpoint(eng, 1, 0, lambda m, w: None)
    seen: dict[str, int] = {}
    eng.at(0, a.fire, lambda: seen.setdefault("a", eng.now))
    eng.at(0, b.fire, lambda: seen.setdefault("b", eng.now))
    eng.at(500 * US, b.fire, lambda: seen.setdefault("b2", eng.now))
    _run(eng)
    # the first CPU ran nobody (-1): a pays 7 us; b after a pays 7; b again on its own: 0
    assert seen == {"a": 7 * US, "b": 114 * US, "b2": 500 * US}
    assert host.switches == 2


def test_a_turn_after_many_others_finds_its_caches_cold() -> None:
    """The caches hold the working sets of the last few turns' processes: a turn that
    comes after more than `cache_turns` turns of other processes since its own last one
    costs `cold_us` (its working set refilled from memory) besides the switch. Two
    processes taking turns stay warm; the third after two others' turns is cold."""
    model = replace(BARE, cpus=1, timer_cpu_ns=10 * US, cache_turns=1, cold_cpu_ns=50 * US)
    eng, host = _host(model)
    a, b, c = (host.endpoint(eng, i, 0, lambda m, w: None) for i in range(3))
    seen: dict[str, int] = {}
    for t, ep, name in ((0, a, "a1"), (100, b, "b1"), (200, a, "a2"), (300, c, "c1"),
                        (400, b, "b2"), (500, a, "a3")):  # fmt: skip
        eng.at(t * US, ep.fire, lambda name=name: seen.setdefault(name, eng.now))
    _run(eng)
    # first turns are cold (a1, b1, c1); a2 after one other turn (b1): warm; b2 after two
    # (a2, c1): cold; a3 after two (c1, b2): cold
    assert seen == {"a1": 50 * US, "b1": 150 * US, "a2": 200 * US, "c1": 350 * US,
                    "b2": 450 * US, "a3": 550 * US}  # fmt: skip
    assert host.cold_turns == 5


def test_a_long_turn_gives_its_cpu_to_a_waiting_process_after_its_slice() -> None:
    """The kernel preempts a process that has run its slice while another waits for a
    CPU (the real coordinator's long batches: thousands of involuntary switches a run):
    with `slice_us`, a turn longer than that yields at its next item to the first process
    waiting and goes to the back of the run queue, keeping its items; without, it keeps the
    CPU until its queue is empty."""
    model = replace(BARE, cpus=1, slice_ns=200 * US)
    eng, host = _host(model)
    a = host.endpoint(eng, 0, 0, lambda m, w: None)
    b = host.endpoint(eng, 1, 0, lambda m, w: None)
    seen: list[tuple[str, int]] = []
    for k in range(5):
        eng.at(0, a.fire, lambda k=k: seen.append((f"a{k}", eng.now)))
    eng.at(150 * US, b.fire, lambda: seen.append(("b", eng.now)))
    _run(eng)
    # a runs 0-200 (two items), has run its slice with b waiting: b 200-300, then a again
    assert seen == [("a0", 0), ("a1", 100 * US), ("b", 200 * US), ("a2", 300 * US),
                    ("a3", 400 * US), ("a4", 500 * US)]  # fmt: skip
    assert host.preemptions == 1
    eng, host = _host(replace(BARE, cpus=1))  # no slice: b waits for a's five items
    a = host.endpoint(eng, 0, 0, lambda m, w: None)
    b = host.endpoint(eng, 1, 0, lambda m, w: None)
    seen.clear()
    for k in range(5):
        eng.at(0, a.fire, lambda k=k: seen.append((f"a{k}", eng.now)))
    eng.at(150 * US, b.fire, lambda: seen.append(("b", eng.now)))
    _run(eng)
    assert seen[-1] == ("b", 500 * US) and host.preemptions == 0


def test_a_pass_costs_once_for_what_was_queued_when_it_began() -> None:
    """The real loop takes what its lanes hold in one wait (up to 256) and pays the pass
    (the wait's return, the outbox, the timers' check) once for the batch: three items
    queued at 0 are one pass; an item that comes while the pass runs waits for the next one,
    which pays again; a posted call runs inside the pass that posted it."""
    model = replace(BARE, cpus=1, pass_cpu_ns=30 * US, post_cpu_ns=5 * US)
    eng, host = _host(replace(model, wake_timer_us=(20.0, 20.0)))  # a, b, c queue meanwhile
    ep = host.endpoint(eng, 0, 0, lambda m, w: None)
    seen: list[tuple[str, int]] = []

    def item(name: str, post: bool = False) -> Any:
        def run() -> None:
            seen.append((name, eng.now))
            if post:
                ep.post(lambda: seen.append((name + "-posted", eng.now)))

        return run

    for name in ("a", "b", "c"):
        eng.at(0, ep.fire, item(name, post=name == "b"))
    eng.at(250 * US, ep.fire, item("d"))
    _run(eng)
    # woken at 20: the pass 20-50, then a 50-150, b 150-250, its post 250-255, c 255-355;
    # d came at 250: the next pass 355-385, d 385-485
    assert seen == [
        ("a", 50 * US), ("b", 150 * US), ("b-posted", 250 * US), ("c", 255 * US),
        ("d", 385 * US),
    ]  # fmt: skip
    assert host.passes == 2
    assert host.handle_ns == (2 * 30 + 4 * 100 + 5) * US


def test_draw_is_the_inverse_cdf_of_the_percentiles() -> None:
    q = (10.0, 20.0, 40.0)
    assert draw(q, 0.0) == 10.0
    assert draw(q, 0.25) == 15.0
    assert draw(q, 0.5) == 20.0
    assert draw(q, 0.75) == 30.0
    assert draw(q, 1.0) == 40.0
    assert draw((), 0.3) == 0.0


def test_wake_up_draws_are_deterministic_per_seed() -> None:
    def draws(seed: int) -> list[int]:
        eng = Engine()
        host = Host(eng, HostModel(), seed)
        return [host.wake_ns_for(k % 3) for k in range(200)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
    d = draws(3)
    lo, hi = min(WAKE_MSG_US[0], WAKE_TIMER_US[0]), max(WAKE_MSG_US[-1], WAKE_TIMER_US[-1])
    assert all(lo * US - 1 <= x <= hi * US + 1 for x in d)


def test_wake_pct_keeps_the_percentiles_up_to_it() -> None:
    """wake_pct=90: draws from the 0th..90th percentile only (the measured tail above it is
    left out)."""
    q = tuple(float(k) for k in range(101))  # the k-th percentile is k us
    eng = Engine()
    host = Host(eng, HostModel(wake_msg_us=q, wake_timer_us=q, wake_keep_pct=90), 1)
    xs = [host.wake_ns_for(0) for _ in range(2000)]
    assert max(xs) <= 90 * US and max(xs) > 85 * US
    assert parse_spec("wake_pct=95").wake_keep_pct == 95.0
    with pytest.raises(ArgumentError):
        parse_spec("wake_pct=20")


def test_recorded_wake_ups_are_percentiles() -> None:
    for q in (WAKE_MSG_US, WAKE_TIMER_US):
        assert len(q) in (21, 101) and list(q) == sorted(q) and q[0] > 0
    HostModel().check()


def _cfg(n: int, sched: str, hm: HostModel | None, seed: int = 1) -> SimConfig:
    return SimConfig(
        nodes=n,
        scheduler=sched,
        links=PRESETS["shm"],
        leaf=8,
        seed=seed,
        workload=WorkloadConfig(steps=20, seed=seed),
        central_call_ns=4000,
        host_model=hm,
    )


@pytest.mark.parametrize("sched", ["rdmasched", "central"])
def test_a_run_with_the_host_model_is_deterministic_and_finishes(sched: str) -> None:
    a = simulate(_cfg(8, sched, HostModel()))
    b = simulate(_cfg(8, sched, HostModel()))
    assert a["finished"] and a["rejected"] == 0
    for k in ("step_time_ms", "slot_idle_pct", "msgs", "events"):
        assert a[k] == b[k]
    assert a["host_model"] == b["host_model"]
    assert 0 < a["host_model"]["cpu_busy_pct"] <= 100.0 + 1e-9
    c = simulate(_cfg(8, sched, HostModel(), seed=2))
    assert c["step_time_ms"] != a["step_time_ms"]


def test_off_by_default_and_the_host_slows_a_crowded_host() -> None:
    """Without the host model (the default) a node has its own CPU: the step does not grow
    with N. With 2 CPUs for N processes it does, and one CPU more makes it shorter."""
    assert SimConfig(nodes=4).host_model is None
    plain = [simulate(_cfg(n, "rdmasched", None))["step_time_ms"] for n in (4, 32)]
    hosted = [simulate(_cfg(n, "rdmasched", HostModel()))["step_time_ms"] for n in (4, 32)]
    assert plain[1] < 1.05 * plain[0]
    # the real demo's step grows 1.6-1.7x from 4 to 32 nodes here (SIM.md, "Calibration")
    assert hosted[1] > 1.4 * hosted[0]
    wider = simulate(_cfg(32, "rdmasched", HostModel(cpus=4)))["step_time_ms"]
    assert wider < hosted[1]
    assert "host_model" not in simulate(_cfg(4, "rdmasched", None))


def test_parse_spec() -> None:
    hm = parse_spec("cpus=3, msg_us=12.5,switch_us=4,wake=none")
    assert hm.cpus == 3 and hm.msg_cpu_ns == 12_500 and hm.switch_cpu_ns == 4_000
    assert hm.wake_msg_us == () and hm.wake_timer_us == ()
    assert parse_spec("") == HostModel()
    assert parse_spec("wake=recorded").wake_msg_us == WAKE_MSG_US
    assert HostModel().spin_gives_way and not parse_spec("spin_gives_way=0").spin_gives_way
    for bad in ("cpus=0", "cpus=1.5", "msg_us=-1", "nope=1", "msg_us", "wake=x", "spin_us=inf",
                "spin_gives_way=2", "spin_gives_way=0.5"):  # fmt: skip
        with pytest.raises(ArgumentError):
            parse_spec(bad)


@pytest.mark.parametrize(
    "argv",
    [
        ["--host-model", "cpus=0"],
        ["--fit-sizes", "4"],  # no --calibrate --host-model
        ["--calibrate", "--host-model", "--fit-sizes", "5"],  # not a calibrate size
        ["--calibrate-real", "x.json"],  # no --calibrate
        ["--calibrate", "--calibrate-rounds", "0"],
        ["--calibrate", "--calibrate-rounds", "3", "--calibrate-real", "x.json"],
        ["--host-model", "cache_turns=2.5"],  # a whole number
    ],
)
def test_bad_host_model_flags_are_one_line_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sim", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and err[-1].startswith("rdmasched")


def test_calibrate_real_file_that_is_not_one_is_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "x.json"
    p.write_text('{"calibration": [{"nodes": 4}]}')
    argv = ["sim", "--calibrate", "--calibrate-sizes", "4", "--host-model"]
    assert main([*argv, "--calibrate-real", str(p), "--central-call-ns", "4000"]) == 2
    err = capsys.readouterr().err
    assert "not a calibration document" in err and "Traceback" not in err
    p.write_text("[1, 2")
    assert main([*argv, "--calibrate-real", str(p)]) == 2
    assert "--calibrate-real" in capsys.readouterr().err
    assert main([*argv, "--calibrate-real", str(tmp_path / "none.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def _fake_real(n: int, step: float) -> dict[str, Any]:
    """A real run's record as a calibration keeps it (REAL_KEYS), for the scoring code."""
    r = {
        "step_time_ms": step,
        "slot_idle_pct": 1.0,
        "msgs_per_node_step": 2.0,
        "msgs_per_node_step_by_kind": {"HEARTBEAT": 0.2, "SYNC_READY": 1.8},
        "lanes_max": 3,
        "host": {"cpu_ms_per_step": 9.0},
    }
    return {"load": (0.5, 0.6), "rdmasched": r, "central": dict(r)}


def test_real_runs_in_rounds_are_interleaved_and_their_median_is_compared() -> None:
    """This host's speed drifts from one minute to the next, so `rounds` > 1 runs every
    size once per round, one size after the other (4, 8, 4, 8, ...), and a calibration
    compares each figure's median over the rounds; each round's record is kept."""
    calls: list[int] = []

    def real(n: int) -> dict[str, Any]:
        calls.append(n)
        k = len(calls)
        r = _fake_real(n, float(k))["rdmasched"] | {"host": {"cpu_ms_per_step": 10.0 * k}}
        return {"rdmasched": r, "central": dict(r)}

    out = real_runs([4, 8], real, rounds=3)
    assert calls == [4, 8, 4, 8, 4, 8]
    assert out[4]["rdmasched"]["step_time_ms"] == 3.0  # the median of runs 1, 3 and 5
    assert out[8]["central"]["host"]["cpu_ms_per_step"] == 40.0  # of 20, 40, 60
    assert out[8]["central"]["lanes_max"] == 3
    assert [r["rdmasched"]["step_time_ms"] for r in out[8]["rounds"]] == [2.0, 4.0, 6.0]
    base = replace(_cfg(4, "rdmasched", HostModel()), workload=WorkloadConfig(steps=5))
    rows = calibrate(base, [4], {4: out[4]}, plain=False)
    assert rows[0]["real_step_time_ms"] == 3.0
    assert [r["step_time_ms"] for r in rows[0]["real_rounds"]] == [1.0, 3.0, 5.0]
    again = reals_from(json.loads(json.dumps({"calibration": rows})))
    assert again[4]["rdmasched"]["step_time_ms"] == 3.0
    with pytest.raises(ArgumentError, match="rounds"):
        real_runs([4], real, rounds=0)


def test_calibrate_from_recorded_real_runs_round_trips_and_scores() -> None:
    """The calibration's rows keep what they compared of the real run, so a later run can
    take them (--calibrate-real) and score another host model against the same runs."""
    base = replace(_cfg(4, "rdmasched", HostModel()), workload=WorkloadConfig(steps=5))
    reals = {4: _fake_real(4, 7.0)}
    rows = calibrate(base, [4], reals, fitted_on=[4])
    assert [r["scheduler"] for r in rows] == ["rdmasched", "central"]
    assert all(r["fitted_on"] and "plain_sim_step_time_ms" in r for r in rows)
    again = reals_from(json.loads(json.dumps({"calibration": rows})))
    assert again[4]["rdmasched"] == reals[4]["rdmasched"]
    # the host's CPU per step is compared (the model's handling and spinning per step)
    assert all(r["real_cpu_ms_per_step"] == 9.0 and r["sim_cpu_ms_per_step"] > 0 for r in rows)
    assert all(r["plain_sim_cpu_ms_per_step"] is None for r in rows)  # no host, no CPU
    assert list(again[4]["load"]) == [0.5, 0.6]
    s = score(rows)
    want = [abs(r[f"diff_{k}_pct"]) for r in rows for k in ("step_time_ms", "slot_idle_pct")]
    want += [abs(r[f"diff_{k}_pct"]) for r in rows for k in ("msgs_per_step", "cpu_ms_per_step")]
    assert s == pytest.approx(sum(want) / len(want))
    assert set(FIT_GRID) == {
        "msg_us", "timer_us", "post_us", "switch_us", "pass_us", "cold_us", "cache_turns",
        "slice_us", "wake_pct",
    }  # fmt: skip


def test_sim_help_names_the_host_model(capsys: pytest.CaptureFixture[str]) -> None:
    from rdmasched.cli import build_parser

    args = build_parser().parse_args(["sim", "--host-model", "cpus=2"])
    assert isinstance(args, argparse.Namespace) and args.host_model == "cpus=2"
    assert build_parser().parse_args(["sim"]).host_model is None


def test_spinners_waiting_without_work_do_not_trade_the_cpu() -> None:
    """One CPU, two spinners: the one that gave way waits in the queue with no work, so the
    other does not give way to it (the real pair would trade the CPU back and forth
    until their spins end, to no one's gain); each sleeps when its spin ends."""
    model = replace(BARE, cpus=1, spin_us=50, wake_timer_us=(0.0, 0.0))
    eng, host = _host(model)
    a = host.endpoint(eng, 0, 0, lambda m, w: None)
    b = host.endpoint(eng, 1, 0, lambda m, w: None)
    eng.at(0, a.fire, lambda: None)  # a 0-100, spins from 100
    eng.at(105 * US, b.fire, lambda: None)  # a gives way at 110; b 110-210, spins
    _run(eng)
    assert host.give_ways == 1
    # a 100-110, then its spin ends in the queue at 150; b spins 210-260 alone
    assert host.spun_ns == (10 + 50) * US
    assert not host.runq and len(host.free_cpus) == 1 and not any(ep.giving for ep in (a, b))
