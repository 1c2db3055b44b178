"""`rdmasched bench failover`: a host of a torchrun DDP job hangs; how long until every
survivor is out, how the restart splits, and the steps per second over a run with failures,
with rdmasched and without (docs/TORCH.md, "Fast failure").

Two "hosts" on this machine: two torchrun agents (``--nnodes 1:2 --nproc-per-node 1``, c10d
rendezvous on 127.0.0.1, ``--max-restarts``), each in a cgroup of its own (`Freezer`, with
``kill``), each running one rank (`rdmasched.bench.failover_rank`, a tiny DDP job on gloo,
checkpointed every step); with rdmasched, each host's local rank 0 starts the host's daemon
(`host_client()`), so the agent, its rank and its daemon are one cgroup. Host A runs the
rendezvous store (``is_host=1``: the one single point the job keeps); host B is the one lost.

A failure: once the job has done `steps_between` steps on both hosts (B started first, so
that the first round has both), B's cgroup is frozen (``cgroup.freeze``: every process of
the host stops at once, as a hung host or a partition does; on one kernel a killed
process's sockets would close and its peers fail at once). Then:

- **exit**: the freeze (the kernel's confirmation) to the survivor's exit (its exit status
  and time, written by the shell torchrun runs the rank under);
- **respawn**: the exit to the agent's next rendezvous (``Rendezvous'ing worker group`` in
  its log, time-stamped as it arrives): the agent's monitor noticing and stopping the group;
- **rendezvous**: to ``Rendezvous complete`` (the agent alone now: ``--nnodes 1:2``; the
  round waits `last_call_s` for more hosts, and for the lost agent's keep-alive to lapse);
- **process up**: to the restarted rank's first line;
- **first step**: to its first step done (torch imported, the process group, the daemon,
  the checkpoint loaded, the step).

The job then goes on alone from the checkpoint to 2 x `steps_between` steps. Each failure is
one such job (an `episode`), `failures` of them one after the other (a job that takes its
replaced host back in would need torchrun's scale-up, which hung in its rank assignment
here: the second agent's rendezvous never completed). Goodput: the useful steps (each
restart goes on from the last checkpoint) per second from each job's first step to its last,
over all the failures, and the batches per second (one per rank and step); with rdmasched
against without, the same jobs, one mode after the other.

Without rdmasched the survivor waits in its collective until the process group's timeout
(`timeout_s`, default 60 s: torch's defaults are 30 min for gloo and 10 min for NCCL), then
fails and exits 1. With rdmasched the host's daemon declares B dead within its liveness
bound (``dead_after_ms``, default 500 ms), tells its ranks at once, and the rank exits with
`EXIT_LOST` (75).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import IO, Any

from rdmasched.integrations.freeze import Freezer

__all__ = ["add_arguments", "cli", "report", "run", "run_mode"]

_log = logging.getLogger("rdmasched.bench.failover")

#: the shell torchrun runs each rank under: it writes the rank's exit status and time
_SHELL = (
    '"$0" -m rdmasched.bench.failover_rank "$@"; c=$?; '
    'printf \'{"ev": "exit", "code": %d, "t": %s, "host": "%s", "restart": %d}\\n\' '
    '"$c" "$(date +%s.%N)" "$RDMASCHED_HOST" "${TORCHELASTIC_RESTART_COUNT:-0}" '
    '>> "$FAILOVER_EVENTS"; exit $c'
)
#: agent log lines whose arrival times split the restart
_MARKS = {
    "up": "Starting elastic_operator",  # before it connects to the store
    "rdzv": "Rendezvous'ing worker group",
    "rdzv_done": "Rendezvous complete",
    "failed": "will restart worker group",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Agent:
    """One "host": a torchrun agent in a cgroup of its own, its output read and time-stamped."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.freezer = Freezer("auto", kill=True)
        self.marks: list[tuple[float, str]] = []
        self._log: IO[str] = log.open("a")
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            self.freezer.add(self.proc.pid)  # its ranks and daemon are born in the cgroup
        except BaseException:
            self.proc.kill()
            raise
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            with contextlib.suppress(ValueError):
                self._log.write(f"{now:.6f} {line}")
                self._log.flush()
            for key, text in _MARKS.items():
                if text in line:
                    self.marks.append((now, key))

    def mark_after(self, key: str, t: float) -> float | None:
        return next((m for m, k in list(self.marks) if k == key and m >= t), None)

    def close(self) -> None:
        """Kill every process of the host (its cgroup) and remove the cgroup."""
        with contextlib.suppress(Exception):
            self.freezer.close()
        with contextlib.suppress(Exception):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(10)
        self._reader.join(5)
        self._log.close()


def _events(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def _wait(what: str, cond: Any, timeout_s: float, agents: list[_Agent]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        for a in agents:
            if a.proc.poll() is not None:
                raise RuntimeError(f"{what}: the agent of {a.name} exited ({a.proc.returncode})")
        time.sleep(0.002)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


def _form(
    agent: Any,
    latest: Any,
    agents: list[_Agent],
    last_call_s: int,
    out: Path,
    attempts: int = 3,
) -> tuple[_Agent, _Agent]:
    """Start both hosts' agents until the job's first round has both (B first, waiting for
    the store A hosts; A once B's agent has started, about to connect to it). On a loaded
    machine A's round can still close alone (its last call, `last_call_s`, passing before B
    connects), and the job's scale-up to B then hung in torchrun's rank assignment here:
    such a start is ended and made again."""
    for attempt in range(attempts):
        t0 = time.time()
        b = agent("hostB", False)
        agents.append(b)
        _wait("host B's agent up", partial(b.mark_after, "up", t0), 300, [b])
        a = agent("hostA", True)
        agents.append(a)
        first = _wait("the job's first rank", partial(latest, "start", after=t0), 300, [a, b])
        if first["world"] == 2:
            return a, b
        _log.warning("attempt %d: the first round had host A alone; starting again", attempt + 1)
        for x in (a, b):
            x.close()
            agents.remove(x)
        for name in ("events.jsonl", "ckpt.pt"):  # the next start from nothing
            (out / name).unlink(missing_ok=True)
    raise RuntimeError(
        f"the job's first round formed without host B {attempts} times (the machine too slow "
        f"for last_call_s={last_call_s})"
    )


def episode(
    rdmasched: bool,
    *,
    steps_between: int = 40,
    step_ms: float = 50.0,
    timeout_s: float = 60.0,
    last_call_s: int = 3,
    keep_alive_s: int = 1,
    out_dir: str | None = None,
) -> dict[str, Any]:
    """One job of 2 * `steps_between` steps whose host B is frozen after `steps_between`
    steps on both hosts (module doc): its figures."""
    run_id = f"ff{uuid.uuid4().hex[:8]}"
    out = Path(out_dir) if out_dir else Path(f"/tmp/rdmasched-failover-{run_id}")
    out.mkdir(parents=True, exist_ok=True)
    events = out / "events.jsonl"
    port = _free_port()
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
        LOGLEVEL="INFO",
        OMP_NUM_THREADS="1",
        RDMASCHED_TRANSPORT="shm",  # two "hosts" of one machine: shm between the daemons
        RDMASCHED_CLUSTER=run_id,
        RDMASCHED_STORE_TIMEOUT_S="60",
        FAILOVER_EVENTS=str(events),
    )
    steps = 2 * steps_between
    rank_args = ["--out", str(out), "--steps", str(steps), "--step-ms", str(step_ms)]
    rank_args += ["--timeout-s", str(timeout_s)] + (["--rdmasched"] if rdmasched else [])
    cgroups: list[str] = []

    def agent(name: str, is_host: bool) -> _Agent:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2"]
        cmd += ["--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id]
        # the round after a failure waits last_call_timeout for more hosts than the minimum;
        # a lost agent leaves the rendezvous after keep_alive_interval * keep_alive_max_attempt
        # (default 5 s * 3), which that round waits for too
        conf = f"is_host={int(is_host)},last_call_timeout={last_call_s},join_timeout=120,"
        conf += f"keep_alive_interval={keep_alive_s},keep_alive_max_attempt=2"
        cmd += ["--rdzv-conf", conf, "--max-restarts", "1", "--monitor-interval", "0.05"]
        cmd += ["--no-python", "/bin/sh", "-c", _SHELL, sys.executable, *rank_args]
        made = _Agent(name, cmd, {**env, "RDMASCHED_HOST": name}, out / f"{name}.log")
        if made.freezer.path:
            cgroups.append(made.freezer.path)
        return made

    def latest(
        ev: str, host: str | None = None, after: float = 0.0, world: int = 0, step: int = 0
    ) -> dict[str, Any] | None:
        """The last event `ev` (of `host`, later than `after`, of a world of `world`, at
        step `step` or later) so far."""
        for e in reversed(_events(events)):
            if (
                e["ev"] == ev
                and (host is None or e["host"] == host)
                and e["t"] > after
                and (not world or e["world"] == world)
                and e.get("step", 0) >= step
            ):
                found: dict[str, Any] = e
                return found
        return None

    agents: list[_Agent] = []
    try:
        a, b = _form(agent, latest, agents, last_call_s, out)
        two = _wait(
            f"{steps_between} steps on both hosts",
            partial(latest, "step", world=2, step=steps_between),
            300,
            agents,
        )
        t0 = time.time()
        b.freezer.freeze()
        t_freeze = time.time()
        gone = _wait("the survivor out", partial(latest, "exit", "hostA", t0), timeout_s + 120, [a])
        first = _wait(
            "the first step on the host left",
            partial(latest, "step", "hostA", gone["t"], 1),
            300,
            [a],
        )
        done = _wait("the job's last step", partial(latest, "done"), 300, [a])
        a.proc.wait(60)
    finally:
        for x in agents:
            x.close()
    started = latest("start", "hostA", gone["t"])
    rdzv = a.mark_after("rdzv", gone["t"])
    rdzv_done = a.mark_after("rdzv_done", gone["t"])
    error = latest("error", "hostA", t0)
    all_steps = [e for e in _events(events) if e["ev"] == "step"]
    wall = done["t"] - all_steps[0]["t"]
    return {
        "rdmasched": rdmasched,
        "at_step": two["step"],
        "freeze_s": t_freeze - t0,
        "exit_code": gone["code"],
        "error": error["error"] if error else None,
        "exit_s": gone["t"] - t_freeze,
        "respawn_s": (rdzv - gone["t"]) if rdzv else None,
        "rendezvous_s": (rdzv_done - rdzv) if rdzv and rdzv_done else None,
        "process_start_s": (started["t"] - rdzv_done) if started and rdzv_done else None,
        "first_step_s": (first["t"] - started["t"]) if started else None,
        "freeze_to_first_step_s": first["t"] - t_freeze,
        # from the first step to the last: the useful steps (the restart goes on from the
        # last checkpoint), and the batches (one per rank and step)
        "steps": done["step"] - all_steps[0]["step"],
        "batches": sum(e["world"] for e in all_steps[1:]),
        "wall_s": wall,
        "agent_exit": a.proc.returncode,
        "out": str(out),
        "freezer": a.freezer.mechanism,
        # the hosts' cgroups, removed by now (the freezers' close, or their reapers)
        "cgroups": cgroups,
    }


def run_mode(
    rdmasched: bool, *, failures: int = 2, out_dir: str | None = None, **kw: Any
) -> dict[str, Any]:
    """`failures` episodes of the job (`episode`, `kw` its options), one after the other:
    every failure's figures, and the goodput over them all."""
    eps = [
        episode(rdmasched, out_dir=os.path.join(out_dir, str(i)) if out_dir else None, **kw)
        for i in range(failures)
    ]
    wall = sum(e["wall_s"] for e in eps)
    return {
        "rdmasched": rdmasched,
        "failures": eps,
        "steps": sum(e["steps"] for e in eps),
        "wall_s": wall,
        "goodput_steps_per_s": sum(e["steps"] for e in eps) / wall,
        "goodput_batches_per_s": sum(e["batches"] for e in eps) / wall,
    }


def run(
    *,
    failures: int = 2,
    steps_between: int = 40,
    step_ms: float = 50.0,
    timeout_s: float = 60.0,
    modes: tuple[bool, ...] = (True, False),
    out_dir: str | None = None,
) -> dict[str, Any]:
    """Every figure: one run per mode (with rdmasched, without), the same job, one after
    the other; each run's files in `out_dir`/rdmasched or /plain (default: a new directory
    under /tmp)."""
    runs = [
        run_mode(
            m,
            failures=failures,
            steps_between=steps_between,
            step_ms=step_ms,
            timeout_s=timeout_s,
            out_dir=os.path.join(out_dir, "rdmasched" if m else "plain") if out_dir else None,
        )
        for m in modes
    ]
    return {
        "load_avg": os.getloadavg(),
        "failures": failures,
        "steps_between": steps_between,
        "step_ms": step_ms,
        "timeout_s": timeout_s,
        "runs": runs,
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:,.0f}"


def report(figures: dict[str, Any]) -> str:
    """The figures of `run` as a Markdown table."""
    lines = [
        f"load average {figures['load_avg'][0]:.2f}; {figures['failures']} failure(s), "
        f"{figures['steps_between']} steps between, a step paced to {figures['step_ms']:g} ms, "
        f"the process group's timeout {figures['timeout_s']:g} s",
        "",
        "| run | failure | exit code | freeze -> survivor out, ms | respawn, ms "
        "| rendezvous, ms | process up, ms | first step, ms | freeze -> first step, ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in figures["runs"]:
        name = "with rdmasched" if r["rdmasched"] else "without"
        for i, f in enumerate(r["failures"], 1):
            lines.append(
                f"| {name} | {i} | {f['exit_code']} | {_ms(f['exit_s'])} | {_ms(f['respawn_s'])} "
                f"| {_ms(f['rendezvous_s'])} | {_ms(f['process_start_s'])} "
                f"| {_ms(f['first_step_s'])} | {_ms(f['freeze_to_first_step_s'])} |"
            )
    lines += [
        "",
        "| run | steps | wall, s | goodput, steps/s | batches/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in figures["runs"]:
        name = "with rdmasched" if r["rdmasched"] else "without"
        lines.append(
            f"| {name} | {r['steps']} | {r['wall_s']:.1f} | {r['goodput_steps_per_s']:.2f} "
            f"| {r['goodput_batches_per_s']:.2f} |"
        )
    return "\n".join(lines)


#: `--quick`: one failure, 10 steps before and after it, a 20 s process-group timeout
QUICK = {"failures": 1, "steps_between": 10, "timeout_s": 20.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `rdmasched bench failover`."""
    p.add_argument(
        "--failures", type=int, default=2, help="failures: jobs, each losing a host (1..10)"
    )
    p.add_argument(
        "--steps-between",
        type=int,
        default=40,
        help="steps on both hosts before the failure (each job: twice that)",
    )
    p.add_argument("--step-ms", type=float, default=50.0, help="each step paced to this, ms")
    p.add_argument(
        "--timeout-s",
        type=float,
        default=60.0,
        help="the process group's timeout, s: where a job without rdmasched ends a collective "
        "waiting for a hung host (torch's default: 30 min on gloo, 10 min on NCCL)",
    )
    p.add_argument(
        "--only", choices=("rdmasched", "plain"), help="run one mode only (default both)"
    )
    p.add_argument(
        "--out-dir",
        metavar="DIR",
        help="the runs' events, checkpoints and logs (default a new directory under /tmp)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="one failure, 10 steps before and after, a 20 s timeout (to check it runs)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def cli(args: argparse.Namespace) -> int:
    """Run from parsed arguments: the figures printed; 2 with one line for bad options."""
    from rdmasched.bench.output import run_info

    conf: dict[str, Any] = {
        "failures": args.failures,
        "steps_between": args.steps_between,
        "step_ms": args.step_ms,
        "timeout_s": args.timeout_s,
    }
    if args.quick:
        conf.update(QUICK)
    bad = [
        f"--{k.replace('_', '-')} {conf[k]} is not in {lo:g}..{hi:g}"
        for k, lo, hi in (
            ("failures", 1, 10),
            ("steps_between", 2, 100_000),
            ("step_ms", 0, 10_000),
            ("timeout_s", 1, 7200),
        )
        if not lo <= conf[k] <= hi
    ]
    if bad:
        print(f"rdmasched bench failover: {bad[0]}", file=sys.stderr)
        return 2
    modes = {"rdmasched": (True,), "plain": (False,), None: (True, False)}[args.only]
    try:
        figures = run(**conf, modes=modes, out_dir=args.out_dir)
    except (RuntimeError, TimeoutError) as exc:  # a run that went wrong: one line, its files
        where = args.out_dir or "/tmp/rdmasched-failover-*"
        print(f"rdmasched bench failover: {exc} (the runs' logs: {where})", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**run_info({**conf, "quick": args.quick}), **figures}, indent=2))
    else:
        print(report(figures))
    return 0
