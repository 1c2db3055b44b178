"""The training rank of `rdmasched bench failover` (rdmasched/bench/failover.py), run by
torchrun: ``torchrun ... -m rdmasched.bench.failover_rank --out DIR [--rdmasched] ...``.

A tiny DDP job on gloo (a two-layer MLP, batch 16, one torch thread), each step paced to
`--step-ms` (the step's compute, slept) and checkpointed by rank 0 (the model, the optimizer
and the step, written atomically), so a restarted job goes on from the last step done: the
steps done are the useful ones. With `--rdmasched`, every rank is a client of its host's
daemon (`host_client()`: local rank 0 starts it) and the buckets are its sync tasks
(`RankScheduler(..., exit_on_lost=True)`): a host declared dead ends the rank at once with
`EXIT_LOST`. Without, the job is plain DDP: a hung peer ends it at the process group's
`--timeout-s`.

Each rank appends what happened to `DIR/events.jsonl`, a JSON line each, wall-clock times
(`time.time()`): ``start`` (first line of the program), ``ready`` (process group, DDP and
the daemon up), ``step`` (rank 0, each step done: its number), ``error`` (the training
thread's exception), ``done`` (the last step).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T_START = time.time()


def _event(out: str, ev: str, **kw: object) -> None:
    rec = {
        "ev": ev,
        "t": time.time(),
        "pid": os.getpid(),
        "rank": int(os.environ.get("RANK", "0")),
        "host": os.environ.get("RDMASCHED_HOST", ""),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        **kw,
    }
    line = json.dumps(rec) + "\n"
    fd = os.open(os.path.join(out, "events.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())  # one write, O_APPEND: lines of ranks never interleave
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rdmasched.bench.failover_rank")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--rdmasched", action="store_true")
    args = p.parse_args(argv)
    _event(args.out, "start", t=T_START)

    import datetime

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = os.path.join(args.out, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
    ddp = DistributedDataParallel(model)
    client = sched = None
    if args.rdmasched:
        from rdmasched.integrations.torch import RankScheduler, host_client

        # this round's cluster and session, the same on every rank: torchrun's store keeps
        # the hosts' entries of earlier rounds, and TORCHELASTIC_RESTART_COUNT differs
        # between an agent that restarted and one that joined since (docs/TORCH.md)
        round_id = torch.tensor([int.from_bytes(os.urandom(4), "little") >> 2])
        dist.broadcast(round_id, src=0)
        name = f"{os.environ.get('RDMASCHED_CLUSTER', 'ff')}r{int(round_id)}"
        os.environ.update(RDMASCHED_CLUSTER=name, RDMASCHED_SESSION=name)
        # the daemon starts beside the rank (a second Python importing torch for the
        # launcher's store): on a loaded machine that took more than the default 30 s
        client = host_client(connect_timeout_s=120).open()
        sched = RankScheduler(client, exit_on_lost=True, collective_timeout_s=args.timeout_s)
        ddp.register_comm_hook(None, sched.hook)
    g = torch.Generator().manual_seed(rank)
    _event(args.out, "ready", step=step)
    try:
        while step < args.steps:
            t0 = time.monotonic()
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
            if sched is not None:
                with sched.compute():
                    _step(ddp, opt, x, y, nn)
            else:
                _step(ddp, opt, x, y, nn)
            left = args.step_ms / 1000 - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)  # the rest of the step's compute
            step += 1
            if rank == 0:
                tmp = ckpt + ".tmp"
                torch.save(
                    {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp
                )
                os.replace(tmp, ckpt)
                _event(args.out, "step", step=step)
    except Exception as exc:
        _event(args.out, "error", error=f"{type(exc).__name__}: {str(exc)[:300]}")
        sys.stderr.flush()
        os._exit(1)  # as a plain job dies of its collective's error (no waiting on teardown)
    if rank == 0:
        _event(args.out, "done", step=step)
    if sched is not None and client is not None:
        sched.close()
        client.close()
    dist.destroy_process_group()
    return 0


def _step(ddp: object, opt: object, x: object, y: object, nn: object) -> None:
    opt.zero_grad()  # type: ignore[attr-defined]
    nn.functional.cross_entropy(ddp(x), y).backward()  # type: ignore[attr-defined,operator]
    opt.step()  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
