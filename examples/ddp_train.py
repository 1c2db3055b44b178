"""A real DDP training job beside a real CPU-hungry co-located job, with and without rdmasched.

    python examples/ddp_train.py --compare --repeat 3          # the measurement (docs/TORCH.md)
    torchrun --nproc-per-node 2 examples/ddp_train.py --mode managed --steps 30

The training job: a small transformer language model from torch.nn (examples/ddp_job.py's
TinyLM: embedding, causal nn.TransformerEncoder, linear head) on random tokens, one process
per rank, DistributedDataParallel over gloo on the CPU, one torch thread per rank.

The co-located job (modes `linux` and `managed`): per rank, a pool of `--colo-workers`
processes compressing data with zlib as fast as they can, each counting the bytes it has
compressed in a shared file (no lock: nothing the training job could wait on).

Modes:
- `alone`: training only;
- `alone-hook`: training only, DDP's all-reduce in a Python comm hook (each bucket divided
  and all-reduced at once, as torch's own `allreduce_hook`): what any Python comm hook costs
  the step, the part of rdmasched's cost that is not rdmasched's;
- `linux`: the co-located job runs beside it, left to the Linux scheduler (same nice level,
  in a session of its own);
- `linux-idle`: the same, the job in the kernel's idle class (SCHED_IDLE, its session's
  autogroup at nice 19): what `chrt --idle 0` gives without a scheduler;
- `managed`: the host's rdmasched daemon (one per host, started by local rank 0; every rank
  its client: rdmasched.integrations.torch.host_client) runs the job: each rank's training
  step is a compute task (priority 200) on one of the host's slots (one per rank), held from
  step to step, each gradient bucket a sync task (its all-reduce started in one order on
  every rank: on one host the daemon's release order), each rank's co-located job a task
  of priority 10 whose preemption moves its processes into the idle class (they run on the
  CPU time the step leaves idle) and whose dispatch moves them back;
- `managed-freeze`: the same, the co-located job frozen while preempted (cgroup v2, else
  SIGSTOP): it runs only when a slot is free.

`--compare` runs the modes (`--modes`, default all but managed-freeze) `--repeat` times,
interleaved (alone, linux, ..., alone, ...), each under `torchrun --nproc-per-node 2` (as a
subprocess, `python -m torch.distributed.run`), and prints a table: step time, tokens/s, the
co-located job's throughput, every part's CPU time from /proc (the ranks, the daemon, the
co-located job, the host) with the idle CPU time training leaves and the share of it the
co-located job got, preemption and dispatch latencies; `--json-out` keeps every run (with
its per-step timeline), `--summarize JSON` prints the table again. `--trace OUT` makes the
last managed run also record a torch.profiler trace of rank 0 (after its measured steps, so
the profiler costs the figures nothing) as OUT.json.gz, which `python -m rdmasched.workload
OUT.json.gz` reads.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import mmap
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODES = ("alone", "alone-hook", "linux", "linux-idle", "managed", "managed-freeze")
#: the modes with no co-located job
SOLO = ("alone", "alone-hook")
#: --compare's modes unless --modes says
DEFAULT_MODES = ("alone", "linux", "linux-idle", "managed")
MANAGED = ("managed", "managed-freeze")
_BLOCK = b"".join(
    b"%d,%x;step %d loss %.4f\n" % (i, i * 7919, i % 97, 1 / (i + 1)) for i in range(8000)
)


# ---- the co-located job (no torch in these processes) -----------------------------------------
def colocated_job(workers: int, counter: str, idle: bool = False) -> None:
    """`workers` processes compressing data forever; worker i adds the bytes it compressed
    to the i-th u64 of file `counter`. `idle`: in the kernel's idle class (SCHED_IDLE, as
    `chrt --idle 0` would start them), their session's autogroup at nice 19 (the job runs in
    a session of its own, and the class ranks threads within their task group only)."""
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as f:
            f.write("19")
    fd = os.open(counter, os.O_RDWR)
    mem = mmap.mmap(fd, 8 * workers)
    kids = []
    for i in range(workers):
        pid = os.fork()
        if pid == 0:
            done = 0
            n = 0
            while True:
                data = _BLOCK[n % 64 :]
                zlib.compress(data, 6)
                done += len(data)
                n += 1
                struct.pack_into("<Q", mem, 8 * i, done)
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)


def start_colocated(workers: int, counter: Path, idle: bool = False) -> subprocess.Popen[bytes]:
    counter.write_bytes(b"\0" * (8 * workers))
    return subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--colocated-job",
            str(workers),
            str(counter),
            *(["idle"] if idle else []),
        ],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )


def colocated_bytes(counter: Path) -> int:
    data = counter.read_bytes()
    return sum(struct.unpack_from("<Q", data, o)[0] for o in range(0, len(data), 8))


def stop_colocated(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


# ---- CPU time, from /proc (every process's threads, in ns) ------------------------------------
def threads_cpu_ns(pid: int) -> dict[int, int]:
    """CPU time of each thread of process `pid` (its scheduler's sum_exec_runtime, ns); {}
    once it is gone."""
    out = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(OSError, ValueError, IndexError),
                open(f"/proc/{pid}/task/{tid}/schedstat") as f,
            ):
                out[int(tid)] = int(f.read().split()[0])
    return out


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with (
                    contextlib.suppress(OSError, ValueError),
                    open(f"/proc/{p}/task/{tid}/children") as f,
                ):
                    todo += [int(c) for c in f.read().split()]
    return out


def cpu_ns(pids: list[int]) -> int:
    return sum(sum(threads_cpu_ns(p).values()) for p in pids)


def host_busy_ns() -> int:
    """CPU time the host's CPUs spent busy since boot (every process's, /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is within user)
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The CPU time of the run's parts over the measured steps: this rank (by thread:
    training, rdmasched's, the rest: gloo's, torch's), its co-located job, the host's daemon
    (read by local rank 0) and the whole host (local rank 0, /proc/stat)."""

    def __init__(self, colo_pid: int | None, daemon_pid: int | None, threads: dict[str, int]):
        self.colo_pid, self.daemon_pid, self.threads = colo_pid, daemon_pid, threads
        self.first: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        mine = threads_cpu_ns(os.getpid())
        named = {k: mine.get(t, 0) for k, t in self.threads.items()}
        return {
            "wall_ns": time.perf_counter_ns(),
            "rank": sum(mine.values()),
            **{f"rank_{k}": v for k, v in named.items()},
            "colocated": cpu_ns(process_tree(self.colo_pid)) if self.colo_pid else 0,
            "daemon": cpu_ns([self.daemon_pid]) if self.daemon_pid else 0,
            "host": host_busy_ns(),
        }

    def start(self) -> None:
        self.first = self.read()

    def stop(self) -> dict[str, int]:
        last = self.read()
        return {k: last[k] - self.first[k] for k in last}


# ---- one rank (under torchrun) -----------------------------------------------------------------
def run_rank(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import record_function

    sys.path.insert(0, str(HERE))
    from ddp_job import TinyLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.d_model, args.layers, 4, args.seq)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(args.seed + rank)

    tmp = Path(tempfile.mkdtemp(prefix="ddp_train"))
    colo_proc = None
    counter = tmp / "counter"
    client = sched = colo = None
    if args.mode == "alone-hook":
        ddp.register_comm_hook(None, _allreduce_hook)
    if args.mode not in SOLO:
        colo_proc = start_colocated(args.colo_workers, counter, idle=args.mode == "linux-idle")
    try:
        if args.mode in MANAGED:
            from rdmasched.integrations.torch import Colocated, RankScheduler, host_client

            # this rank's client of the host's daemon; local rank 0 starts it if none runs
            client = host_client().open()
            sched = RankScheduler(
                client, max_inflight=args.max_inflight, overlap=not args.sync_takes_slot
            )
            ddp.register_comm_hook(None, sched.hook)
            assert colo_proc is not None
            # managed: preempted, the work goes into the kernel's idle class (it gets the CPU
            # time the step leaves idle); managed-freeze: it is stopped for the whole step
            colo = Colocated(sched, preempt="freeze" if args.mode == "managed-freeze" else "idle")
            colo.add(colo_proc.pid)
            colo.start()
            where = colo.freezer.path or "signals"
            say(f"ddp_train: rank {rank}: co-located job {colo_proc.pid} held by {where}")

        steps_done = 0

        def step() -> float:
            nonlocal steps_done
            if rank == world - 1 and steps_done == args.fail_at_step:
                _fail(args.fail_how, rank, steps_done)
            steps_done += 1
            tok = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
            if args.io_ms:
                time.sleep(args.io_ms / 1000)  # waiting for the next batch (storage, network)
            t0 = time.perf_counter()
            mark = [time.monotonic_ns()]
            with sched.compute() if sched is not None else contextlib.nullcontext():
                mark.append(time.monotonic_ns())
                opt.zero_grad(set_to_none=True)
                with record_function("forward"):
                    out = ddp(tok[:, :-1])
                    loss = loss_fn(out.reshape(-1, out.shape[-1]), tok[:, 1:].reshape(-1))
                mark.append(time.monotonic_ns())
                with record_function("backward"):
                    loss.backward()
                mark.append(time.monotonic_ns())
                with record_function("optimizer"):
                    opt.step()
                mark.append(time.monotonic_ns())
            mark.append(time.monotonic_ns())
            phases.append(mark)
            return time.perf_counter() - t0

        #: per step: monotonic ns at compute()'s call, its body's start, the forward's end,
        #: the backward's end, the optimizer's end, compute()'s exit
        phases: list[list[int]] = []
        for _ in range(args.warmup):
            step()
        del phases[:]
        local0 = int(os.environ.get("LOCAL_RANK", "0")) == 0
        threads = {"main": threading.main_thread().native_id or 0}
        if sched is not None and client is not None:
            # rdmasched's threads in the rank: its comm queue, its watchdog, the client's reader
            for name, th in (("comm", sched._comm), ("watch", sched._watch),
                             ("reader", client._thread)):  # fmt: skip
                threads[name] = (th.native_id or 0) if th is not None else 0
        meter = CpuMeter(
            colo_proc.pid if colo_proc else None,
            client.daemon_pid if client is not None and local0 else None,
            threads,
        )
        dist.barrier()
        bytes0 = colocated_bytes(counter) if colo_proc else 0
        meter.start()
        t_start = time.perf_counter()
        times = [step() for _ in range(args.steps)]
        dist.barrier()
        wall = time.perf_counter() - t_start
        cpu = meter.stop()
        done = (colocated_bytes(counter) - bytes0) if colo_proc else 0

        if args.trace and rank == 0 and sched is None:
            print("--trace records the managed mode only", file=sys.stderr)
        if args.trace and sched is not None:
            _trace(args, step, rank)

        # the host's share (its daemon, its CPUs, everything on it) counted once, by local rank 0
        capacity = (os.cpu_count() or 1) * cpu["wall_ns"] if local0 else 0
        keys = ["rank", *(f"rank_{k}" for k in ("main", "comm", "watch", "reader")), "colocated"]
        sums = [cpu.get(k, 0) for k in keys] + [
            cpu["daemon"],
            cpu["host"] if local0 else 0,
            capacity,
        ]
        total = torch.tensor([done, *sums], dtype=torch.int64)
        dist.all_reduce(total)
        names = [*keys, "daemon", "host", "capacity"]
        cpu_s = {k: int(x) / 1e9 for k, x in zip(names, total[1:], strict=True)}
        local = {
            "freeze_ns": list(colo.freeze_ns) if colo else [],
            "thaw_ns": list(colo.thaw_ns) if colo else [],
            "mechanism": colo.mechanism if colo else None,
            "errors": list(colo.errors) if colo else [],
            "starts": [(e[1], e[2]) for e in sched.log if e[0] == "start"] if sched else [],
            "timeline": timeline(phases, list(sched.log) if sched else []),
            "raw": {"phases": phases, "log": list(sched.log) if sched else []},
        }
        every: list[Any] = [None] * world
        dist.all_gather_object(every, local)
        if rank == 0:
            result = {
                "mode": args.mode,
                "world": world,
                "steps": args.steps,
                "tokens_per_step": args.batch * args.seq * world,
                "step_s": times,
                "wall_s": wall,
                "colocated_bytes": int(total[0]),
                "cpu_s": cpu_s,
                "colocated_workers": args.colo_workers * world if colo_proc else 0,
                "freeze_ns": [x for r in every for x in r["freeze_ns"]],
                "thaw_ns": [x for r in every for x in r["thaw_ns"]],
                "mechanism": every[0]["mechanism"],
                "errors": [x for r in every for x in r["errors"]],
                "timeline": [r["timeline"] for r in every],
                # every rank's step marks and sched.log (one run's; --compare drops them)
                "raw": [r["raw"] for r in every],
                "same_bucket_order_on_every_rank": all(
                    r["starts"] == every[0]["starts"] for r in every
                ),
            }
            text = json.dumps(result)
            if args.result:
                Path(args.result).write_text(text)
            else:
                print(text)
    finally:
        if colo is not None:
            colo.close()
        if colo_proc is not None:
            stop_colocated(colo_proc)
        if sched is not None:
            sched.close()
        if client is not None:
            client.close()
        shutil.rmtree(tmp, ignore_errors=True)
        dist.destroy_process_group()
    return 0


def say(line: str) -> None:
    """One line on stderr in one write: the ranks share the launcher's stderr, and print()'s
    two writes (the text, then its newline) let another rank's line land between them."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def timeline(phases: list[list[int]], log: list[tuple[str, int, int, int]]) -> dict[str, Any]:
    """Where a rank's measured steps went, medians in us: the step's phases (`dispatch`: its
    compute task's wait for a slot; `forward`; `backward`, DDP's wait for the last buckets
    included; `tail`: from the last bucket's hook to the backward's end, the wait for the
    all-reduces; `optimizer`; `complete`: leaving compute()) and each bucket's sync
    (`report_to_release`: the hook to the daemon's release; `release_to_start`: the comm
    queue, rank 0's choice included across hosts; `start_to_done`: its all-reduce)."""

    def med(xs: list[int]) -> float:
        return round(statistics.median(xs) / 1e3, 1) if xs else 0.0

    out: dict[str, Any] = {}
    for i, name in enumerate(("dispatch", "forward", "backward", "optimizer", "complete")):
        out[name] = med([m[i + 1] - m[i] for m in phases])
    # the buckets of the measured steps: those reported after the first measured step began
    t0 = phases[0][0] if phases else 0
    ev: dict[tuple[int, int], dict[str, int]] = {}
    for kind, step, index, ns in log:
        ev.setdefault((step, index), {})[kind] = ns
    ev = {k: e for k, e in ev.items() if e.get("report", 0) >= t0}
    reports = sorted(e["report"] for e in ev.values())
    tails = []
    for m in phases:  # the last hook of each backward, to the backward's end
        inside = [t for t in reports if m[2] <= t <= m[3]]
        if inside:
            tails.append(m[3] - inside[-1])
    out["tail"] = med(tails)
    for a, b in (("report", "release"), ("release", "start"), ("start", "done")):
        out[f"{a}_to_{b}"] = med([e[b] - e[a] for e in ev.values() if a in e and b in e])
    out["buckets_per_step"] = len(ev) / max(1, len(phases))
    return out


def _allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]  # (DDP reads the annotations)
    """`alone-hook`'s comm hook: the bucket divided by the world size and all-reduced at once
    on the default group, as torch's `allreduce_hook` does."""
    import torch.distributed as dist

    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    work = dist.all_reduce(tensor, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _fail(how: str, rank: int, step: int) -> None:
    """--fail-at-step: the last rank fails, as `how` says (to test what a failed run leaves)."""
    say(f"ddp_train: rank {rank}: failing at step {step} ({how})")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"ddp_train: rank {rank} failed at step {step} (--fail-at-step)")


def _trace(args: argparse.Namespace, step: Any, rank: int) -> None:
    """A few more steps under torch.profiler; rank 0's trace to args.trace + .json.gz."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile, schedule

    raw = Path(tempfile.mkdtemp(prefix="ddp_trace")) / "trace.json"

    def ready(prof: Any) -> None:
        if rank == 0:
            prof.export_chrome_trace(str(raw))

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=ready,
        record_shapes=True,
        # the buckets' all-reduces start on the scheduler's comm thread: record it too
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
    ) as prof:
        for _ in range(5):
            step()
            prof.step()
    if rank == 0:
        out = Path(f"{args.trace}.json.gz")
        out.parent.mkdir(parents=True, exist_ok=True)
        with (
            raw.open("rb") as src,
            open(out, "wb") as f,
            gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as dst,
        ):
            shutil.copyfileobj(src, dst)
        shutil.rmtree(raw.parent, ignore_errors=True)
        print(f"wrote {out}", file=sys.stderr)


# ---- the measurement -----------------------------------------------------------------------------
def run_once(args: argparse.Namespace, mode: str, trace: str | None) -> dict[str, Any]:
    """One torchrun of `mode`; rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="ddp_compare") as tmp:
        result = Path(tmp) / "result.json"
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(args.nproc), str(Path(__file__).resolve()),
            "--mode", mode, "--result", str(result), *_rank_args(args),
        ]  # fmt: skip
        if trace:
            cmd += ["--trace", trace]
        env = {
            **os.environ,
            "RDMASCHED_CLUSTER": f"ddp{os.getpid()}{uuid.uuid4().hex[:6]}",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0 or not result.exists():
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"ddp_train: the {mode} run failed (exit {proc.returncode})")
        out: dict[str, Any] = json.loads(result.read_text())
        out.pop("raw", None)
        return out


def _rank_args(args: argparse.Namespace) -> list[str]:
    out = []
    for name in ("steps", "warmup", "batch", "seq", "vocab", "d_model", "layers",
                 "bucket_cap_mb", "colo_workers", "io_ms", "max_inflight", "seed"):  # fmt: skip
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.sync_takes_slot:
        out.append("--sync-takes-slot")
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    from rdmasched.bench.freeze import summary_us

    """Per mode, over its runs: each run's median step time, its tokens/s (steps over the
    measured wall time), its co-located MB/s; the spread is min..max over the runs."""
    per: dict[str, Any] = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        if not rs:
            continue
        step_ms = [statistics.median(r["step_s"]) * 1e3 for r in rs]
        tok = [r["tokens_per_step"] * r["steps"] / r["wall_s"] for r in rs]
        colo = [r["colocated_bytes"] / r["wall_s"] / 1e6 for r in rs]
        cpu = [harvest(r) for r in rs]
        freeze = [x for r in rs for x in r["freeze_ns"]]
        thaw = [x for r in rs for x in r["thaw_ns"]]
        per[mode] = {
            "runs": len(rs),
            "step_ms": step_ms,
            "tokens_per_s": tok,
            "colocated_mb_per_s": colo,
            # CPUs (CPU-seconds per second of the measured wall time), each run's
            **{k: [c[k] for c in cpu] for k in cpu[0]},
            # the freezer benchmark's summary (n, min, p50, p90, p99, max; us)
            "freeze_us": summary_us(freeze) if freeze else None,
            "thaw_us": summary_us(thaw) if thaw else None,
            "mechanism": rs[0]["mechanism"],
            "errors": [e for r in rs for e in r["errors"]],
            "same_bucket_order_on_every_rank": all(
                r["same_bucket_order_on_every_rank"] for r in rs
            ),
        }
    return per


def harvest(r: dict[str, Any]) -> dict[str, float]:
    """One run's CPU account, in CPUs (CPU-seconds per second of its measured wall time):
    `training` its ranks' and its daemon's; `idle` what training leaves of the host's CPUs;
    `colocated` what the co-located job got of it (`harvested_over_idle`, the share); `others`
    the rest of the host's busy time (other users of this machine, torchrun's agent); `free`
    what nobody used, and `harvested_over_left` the job's share of the idle time that others
    left (colocated / (colocated + free))."""
    c, wall = r["cpu_s"], r["wall_s"]
    training = c["rank"] + c["daemon"]
    idle = c["capacity"] - training
    # what nobody used: on a shared host, others take part of the idle time too
    free = max(0.0, c["capacity"] - c["host"])
    return {
        "ranks_cpus": c["rank"] / wall,
        "daemon_cpus": c["daemon"] / wall,
        "rdmasched_threads_cpus": (c["rank_comm"] + c["rank_watch"] + c["rank_reader"]) / wall,
        "training_cpus": training / wall,
        "idle_cpus": idle / wall,
        "colocated_cpus": c["colocated"] / wall,
        "harvested_over_idle": c["colocated"] / idle if idle > 0 else 0.0,
        "others_cpus": max(0.0, c["host"] - training - c["colocated"]) / wall,
        "free_cpus": free / wall,
        # the co-located job's share of the idle time others left: colocated / (colocated
        # + free); on a quiet host the same as harvested_over_idle
        "harvested_over_left": c["colocated"] / (c["colocated"] + free)
        if c["colocated"] + free > 0
        else 0.0,
    }


def _spread(xs: list[float], fmt: str) -> str:
    mid = statistics.median(xs)
    if len(xs) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"


def table(per: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"{meta['date']}, {meta['cpus']} CPUs, load {meta['load_before']:.1f} -> "
        f"{meta['load_after']:.1f}, torch {meta['torch']}, commit {meta['commit']}: "
        f"`{meta['command']}`",
        "",
        "| run | step time, ms | step / alone's | tokens/s | co-located job, MB/s | "
        "training's CPUs (daemon) | idle CPUs | co-located CPUs | harvested / idle | "
        "others' CPUs | harvested / (harvested + unused) | preempt p50 / p99, us | "
        "dispatch p50 / p99, us |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    names = {
        "alone": "training alone",
        "alone-hook": "training alone, DDP's all-reduce in a Python comm hook",
        "linux": "+ co-located job, left to Linux",
        "linux-idle": "+ co-located job, left to Linux in its idle class",
        "managed": "+ co-located job, managed by rdmasched (idle class when preempted)",
        "managed-freeze": "+ co-located job, managed by rdmasched (frozen when preempted)",
    }
    alone = statistics.median(per["alone"]["step_ms"]) if "alone" in per else None
    for mode, v in per.items():
        fr = v["freeze_us"]
        th = v["thaw_us"]
        name = names[mode] + (f", {v['mechanism']}" if mode == "managed-freeze" else "")
        ratio = f"{statistics.median(v['step_ms']) / alone:.2f}" if alone else "-"
        colo = _spread(v["colocated_mb_per_s"], ".1f") if mode not in SOLO else "-"
        frz = f"{fr['p50']:,.0f} / {fr['p99']:,.0f}" if fr else "-"
        thw = f"{th['p50']:,.0f} / {th['p99']:,.0f}" if th else "-"
        has_colo = mode not in SOLO
        train = _spread(v["training_cpus"], ".2f")
        if mode in MANAGED:
            train += f" ({_spread(v['daemon_cpus'], '.2f')})"
        ccpu = _spread(v["colocated_cpus"], ".2f") if has_colo else "-"
        share = _spread([100 * x for x in v["harvested_over_idle"]], ".0f") + "%"
        left = _spread([100 * x for x in v["harvested_over_left"]], ".0f") + "%"
        lines.append(
            f"| {name} | {_spread(v['step_ms'], '.1f')} | {ratio} "
            f"| {_spread(v['tokens_per_s'], ',.0f')} "
            f"| {colo} | {train} | {_spread(v['idle_cpus'], '.2f')} | {ccpu} "
            f"| {share if has_colo else '-'} | {_spread(v['others_cpus'], '.2f')} "
            f"| {left if has_colo else '-'} | {frz} | {thw} |"
        )
    lines.append("")
    lines.append(
        "median over the runs (min-max in brackets); step time: each run's median step (step / "
        "alone's: the medians' ratio); "
        "tokens/s and MB/s: over each run's measured steps; CPUs: CPU-seconds per second of "
        "the measured steps' wall time, from /proc (training: the ranks, every thread, and the "
        "daemon; idle: the host's CPUs less training's; harvested / idle: the co-located "
        "job's CPU over that idle time; others: the rest of the host's busy time; unused: "
        "the host's CPUs that nobody used)"
    )
    return "\n".join(lines)


def compare(args: argparse.Namespace) -> int:
    import torch

    modes = args.modes or list(DEFAULT_MODES)
    load0 = os.getloadavg()[0]
    runs = []
    t0 = time.monotonic()
    for r in range(args.repeat):
        for mode in modes:
            trace = args.trace if (mode == "managed" and r == args.repeat - 1) else None
            print(f"ddp_train: run {r + 1}/{args.repeat}: {mode}", file=sys.stderr, flush=True)
            runs.append(run_once(args, mode, trace))
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "load_before": load0,
        "load_after": os.getloadavg()[0],
        "torch": torch.__version__,
        "commit": commit or "unknown",
        "seconds": round(time.monotonic() - t0),
        "command": "python examples/ddp_train.py " + " ".join(sys.argv[1:]),
        # every setting the ranks ran with, defaults included (a default can change)
        "rank_args": _rank_args(args),
    }
    per = summarize(runs)
    print(table(per, meta))
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"meta": meta, "summary": per, "runs": runs}, indent=1) + "\n"
        )
    bad = [m for m, v in per.items() if v["errors"] or not v["same_bucket_order_on_every_rank"]]
    if bad:
        print(f"ddp_train: errors in {bad}: {[per[m]['errors'] for m in bad]}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--colocated-job"]:
        colocated_job(int(argv[1]), argv[2], argv[3:4] == ["idle"])
        return 0
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--compare", action="store_true", help="run every mode --repeat times, print the table"
    )
    p.add_argument("--repeat", type=int, default=3, help="runs per mode with --compare (default 3)")
    p.add_argument("--modes", nargs="+", choices=MODES, help="with --compare: these modes only")
    p.add_argument(
        "--mode", choices=MODES, default="managed", help="one run, under torchrun (default managed)"
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks with --compare (default 2)")
    p.add_argument("--steps", type=int, default=30, help="measured steps (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="steps before measuring (default 3)")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step (default 8)")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence (default 64)")
    p.add_argument("--vocab", type=int, default=2000, help="default 2000")
    p.add_argument("--d-model", type=int, default=128, help="default 128")
    p.add_argument("--layers", type=int, default=2, help="default 2")
    p.add_argument(
        "--bucket-cap-mb", type=float, default=0.25, help="DDP's bucket size (default 0.25)"
    )
    p.add_argument(
        "--colo-workers", type=int, default=1, help="co-located processes per rank (default 1)"
    )
    p.add_argument(
        "--io-ms",
        type=float,
        default=0.0,
        help="per step, time waiting for the batch outside the compute task (default 0)",
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=8,
        help="managed: bucket all-reduces running at once (RankScheduler's max_inflight; "
        "default 8, this model's buckets a step: each starts once released, as in plain DDP)",
    )
    p.add_argument(
        "--sync-takes-slot",
        action="store_true",
        help="managed: each bucket's sync task takes a slot of the host, preempting a rank's "
        "compute task in the daemon's books (RankScheduler(overlap=False); default: the syncs "
        "overlap the step and take none)",
    )
    p.add_argument("--seed", type=int, default=0, help="default 0")
    p.add_argument(
        "--fail-at-step",
        type=int,
        metavar="N",
        help="(one run) the last rank fails at its step N, warm-up included (--fail-how)",
    )
    p.add_argument(
        "--fail-how",
        choices=("raise", "kill"),
        default="raise",
        help="an exception in the step (default), or SIGKILL of the rank",
    )
    p.add_argument("--trace", help="OUT: a torch.profiler trace of a managed run -> OUT.json.gz")
    p.add_argument("--result", help="(one run) write rank 0's result JSON here")
    p.add_argument("--json-out", help="(--compare) every run and the summary as JSON")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    p.add_argument(
        "--summarize", metavar="JSON", help="print the table again from a --json-out file"
    )
    args = p.parse_args(argv)
    if args.summarize:
        saved = json.loads(Path(args.summarize).read_text())
        print(table(summarize(saved["runs"]), saved["meta"]))
        return 0
    if args.compare:
        return compare(args)
    if "RANK" not in os.environ:
        p.error("one run goes under torchrun (torchrun --nproc-per-node 2 ...), or use --compare")
    return run_rank(args)


if __name__ == "__main__":
    sys.exit(main())
