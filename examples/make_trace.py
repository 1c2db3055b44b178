"""Record a real torch.profiler Chrome trace of a DDP rank on the CPU (gloo), for tests and docs.

    torchrun --nproc-per-node 2 examples/make_trace.py --model lm --out tests/data/traces/lm

trains a small model from torch.nn with DistributedDataParallel (gloo, CPU) on synthetic data
for a few steps under torch.profiler with a wait/warmup/active schedule, and writes rank 0's
trace as OUT.json.gz plus a sidecar OUT.meta.json: the model, its parameter count and bytes,
DDP's bucket_cap_mb and the gradient bucket sizes DDP itself reports (its logging data), so a
test can check what the parser finds against what DDP did.

Run without torchrun, it trains as a world of one rank (gloo still, so the all-reduces are
real collectives). Needs torch (the CPU build: `pip install torch==2.13.0` here); the parser
of these traces (`rdmasched.workload`) does not.

Models: `lm` is a 2-layer transformer language model (embedding, nn.TransformerEncoder with a
causal mask, a linear head) on random tokens; `mlp` a 4-layer MLP classifier on random
features. `--bucket-cap-mb` sets DDP's bucket size (default 25, DDP's own default).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, record_function, schedule


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


def build(args: argparse.Namespace) -> tuple[nn.Module, Any]:
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", choices=("lm", "mlp"), default="lm", help="default lm")
    p.add_argument("--out", required=True, help="output path without extension")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="default 25 (DDP's)")
    p.add_argument("--d-model", type=int, default=64, help="lm width / mlp width (default 64)")
    p.add_argument("--layers", type=int, default=2, help="lm layers (default 2)")
    p.add_argument("--vocab", type=int, default=512, help="lm vocabulary (default 512)")
    p.add_argument("--seq", type=int, default=32, help="lm sequence length (default 32)")
    p.add_argument("--batch", type=int, default=8, help="batch per rank (default 8)")
    p.add_argument("--wait", type=int, default=1, help="profiler schedule wait (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="profiler schedule warmup (default 1)")
    p.add_argument("--active", type=int, default=3, help="profiled steps (default 3)")
    p.add_argument("--seed", type=int, default=0, help="default 0")
    args = p.parse_args(argv)

    if "RANK" not in os.environ:  # not under torchrun: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model, batch = build(args)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    tmp = Path(tempfile.mkdtemp(prefix="make_trace"))
    raw = tmp / "trace.json"

    def ready(prof: profile) -> None:
        if rank == 0:
            prof.export_chrome_trace(str(raw))

    steps = args.wait + args.warmup + args.active
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.active, repeat=1),
        on_trace_ready=ready,
        record_shapes=True,
    ) as prof:
        for _ in range(steps):
            x, y = batch()
            opt.zero_grad(set_to_none=True)
            with record_function("forward"):
                out = ddp(x)
                loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                opt.step()
            prof.step()

    if rank == 0:
        out_base = Path(args.out)
        out_base.parent.mkdir(parents=True, exist_ok=True)
        with (
            raw.open("rb") as src,
            open(f"{out_base}.json.gz", "wb") as f,
            gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as dst,  # reproducible bytes
        ):
            shutil.copyfileobj(src, dst)
        logging = ddp._get_ddp_logging_data()
        params = [q for q in model.parameters() if q.requires_grad]
        meta = {
            "model": args.model,
            "torch": torch.__version__,
            "world_size": world,
            "backend": "gloo",
            "bucket_cap_mb": args.bucket_cap_mb,
            "params": len(params),
            "param_elements": sum(q.numel() for q in params),
            "param_bytes": sum(q.numel() * q.element_size() for q in params),
            "dtype": "Float",
            # buffers DDP broadcasts from rank 0 at each forward (broadcast_buffers=True)
            "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
            # DDP's own account of its gradient buckets (bytes each), after its rebuild
            "bucket_sizes": [int(s) for s in str(logging.get("bucket_sizes", "")).split(",") if s],
            "rebuilt_bucket_sizes": [
                int(s) for s in str(logging.get("rebuilt_bucket_sizes", "")).split(",") if s
            ],
            "schedule": {"wait": args.wait, "warmup": args.warmup, "active": args.active},
            "command": " ".join(sys.argv),
        }
        Path(f"{out_base}.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"wrote {out_base}.json.gz and {out_base}.meta.json", file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
