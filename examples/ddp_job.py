"""The small DDP training job that examples/make_trace.py and examples/make_chakra_trace.py
record, written once: the models (examples/ddp_train.py trains the same TinyLM), their
command-line options, the gloo process group (a world of one rank when not run under
torchrun), DDP with SGD, one training step with its phases annotated for the profiler, and
what DDP reports about its gradient buckets.

Needs torch (the CPU build: `pip install torch==2.13.0` here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, record_function, schedule

Batch = Callable[[], tuple[torch.Tensor, torch.Tensor]]


class TinyLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True
        )
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        x = self.body(x, mask=self.mask, is_causal=True)
        return self.head(x)


def build(args: argparse.Namespace) -> tuple[nn.Module, Batch]:
    """(model, batch maker) for --model."""
    g = torch.Generator().manual_seed(args.seed + dist.get_rank())
    if args.model == "lm":
        model: nn.Module = TinyLM(args.vocab, args.d_model, args.layers, 4, args.seq)

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            tok = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
            return tok[:, :-1], tok[:, 1:]

    else:
        width = args.d_model
        model = nn.Sequential(
            nn.Linear(64, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 10),
        )

        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(args.batch, 64, generator=g), torch.randint(
                0, 10, (args.batch,), generator=g
            )

    return model, batch


def add_job_args(p: argparse.ArgumentParser, *, model: str, active: int) -> None:
    """The options of the job (model, sizes, DDP's bucket cap, seed) and of the output."""
    p.add_argument("--model", choices=("lm", "mlp"), default=model, help=f"default {model}")
    p.add_argument("--out", required=True, help="output path without extension")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="default 25 (DDP's)")
    p.add_argument("--d-model", type=int, default=64, help="lm width / mlp width (default 64)")
    p.add_argument("--layers", type=int, default=2, help="lm layers (default 2)")
    p.add_argument("--vocab", type=int, default=512, help="lm vocabulary (default 512)")
    p.add_argument("--seq", type=int, default=32, help="lm sequence length (default 32)")
    p.add_argument("--batch", type=int, default=8, help="batch per rank (default 8)")
    p.add_argument("--active", type=int, default=active, help=f"profiled steps (default {active})")
    p.add_argument("--seed", type=int, default=0, help="default 0")


@dataclass
class Job:
    args: argparse.Namespace
    rank: int
    world: int
    model: nn.Module
    batch: Batch
    ddp: DistributedDataParallel
    opt: torch.optim.Optimizer
    loss_fn: nn.Module
    #: a scratch directory for the raw traces, removed by close()
    tmp: Path

    @classmethod
    def start(cls, args: argparse.Namespace, port: int) -> Job:
        """Join the gloo process group (torchrun's, else a world of one on `port`) and set up
        the model under DDP."""
        if "RANK" not in os.environ:  # not under torchrun: a world of one
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
            os.environ["MASTER_PORT"] = str(port)
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        torch.manual_seed(args.seed)
        model, batch = build(args)
        ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
        rank, world = dist.get_rank(), dist.get_world_size()
        tmp = Path(tempfile.mkdtemp(prefix=Path(sys.argv[0]).stem))
        return cls(args, rank, world, model, batch, ddp, opt, nn.CrossEntropyLoss(), tmp)

    def step(self) -> None:
        """One training step, its phases annotated (`forward`, `backward`, `optimizer`)."""
        x, y = self.batch()
        self.opt.zero_grad(set_to_none=True)
        with record_function("forward"):
            out = self.ddp(x)
            loss = self.loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            self.opt.step()

    def profile(
        self, chrome_trace: Path, *, wait: int, warmup: int, active: int, **kw: Any
    ) -> None:
        """Train wait + warmup + active steps under torch.profiler (CPU, shapes recorded);
        rank 0 exports the active steps' Chrome trace to `chrome_trace`. `kw` goes to
        `profile` (an execution_trace_observer)."""

        def ready(prof: profile) -> None:
            if self.rank == 0:
                prof.export_chrome_trace(str(chrome_trace))

        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=ready,
            record_shapes=True,
            **kw,
        ) as prof:
            for _ in range(wait + warmup + active):
                self.step()
                prof.step()

    def params(self) -> list[nn.Parameter]:
        return [q for q in self.model.parameters() if q.requires_grad]

    def param_bytes(self) -> int:
        return sum(q.numel() * q.element_size() for q in self.params())

    def out(self) -> Path:
        """--out, its folder made."""
        base = Path(self.args.out)
        base.parent.mkdir(parents=True, exist_ok=True)
        return base

    def write_meta(self, trace_suffix: str, fields: dict[str, Any]) -> None:
        """OUT.meta.json: what ran (`about()`), then `fields`, then the command line."""
        base = self.out()
        meta = {**self.about(), **fields, "command": " ".join(sys.argv)}
        Path(f"{base}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"wrote {base}{trace_suffix} and {base}.meta.json", file=sys.stderr)

    def about(self) -> dict[str, Any]:
        """The head of a sidecar OUT.meta.json: what ran."""
        return {
            "model": self.args.model,
            "torch": torch.__version__,
            "world_size": self.world,
            "backend": dist.get_backend(),
            "bucket_cap_mb": self.args.bucket_cap_mb,
        }

    def buckets(self) -> dict[str, list[int]]:
        """DDP's own account of its gradient buckets (bytes each), first and after its
        rebuild."""
        logging = self.ddp._get_ddp_logging_data()
        return {
            key: [int(s) for s in str(logging.get(key, "")).split(",") if s]
            for key in ("bucket_sizes", "rebuilt_bucket_sizes")
        }

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        dist.destroy_process_group()
