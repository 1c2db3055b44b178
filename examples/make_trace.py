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
features. `--bucket-cap-mb` sets DDP's bucket size (default 25, DDP's own default). The job
(models, options, DDP over gloo, the training step) is examples/ddp_job.py, which
examples/make_chakra_trace.py records too.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys

from ddp_job import Job, add_job_args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_job_args(p, model="lm", active=3)
    p.add_argument("--wait", type=int, default=1, help="profiler schedule wait (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="profiler schedule warmup (default 1)")
    args = p.parse_args(argv)

    job = Job.start(args, port=29517)
    raw = job.tmp / "trace.json"
    job.profile(raw, wait=args.wait, warmup=args.warmup, active=args.active)

    if job.rank == 0:
        with (
            raw.open("rb") as src,
            open(f"{job.out()}.json.gz", "wb") as f,
            gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as dst,  # reproducible bytes
        ):
            shutil.copyfileobj(src, dst)
        params = job.params()
        fields = {
            "params": len(params),
            "param_elements": sum(q.numel() for q in params),
            "param_bytes": job.param_bytes(),
            "dtype": "Float",
            # buffers DDP broadcasts from rank 0 at each forward (broadcast_buffers=True)
            "buffer_bytes": sum(b.numel() * b.element_size() for b in job.model.buffers()),
            **job.buckets(),
            "schedule": {"wait": args.wait, "warmup": args.warmup, "active": args.active},
        }
        job.write_meta(".json.gz", fields)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
