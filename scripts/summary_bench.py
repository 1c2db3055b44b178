"""What a node core pays for a heartbeat's domain summaries when its table is full.

One core of a 100,000-node topology (leaves of 32: 3,125 leaves, SUMMARY_MAX kept) receives
heartbeats from a link, each carrying 1 + SUMMARIES_PER_BEAT summaries of random leaves,
nearly all new to it: every one drops a kept summary (docs/SCALE.md, "Domain summaries").
Prints the CPU time per heartbeat received. Run it against two builds, interleaved, and
compare within one run (this host's speed drifts):

    .venv/bin/python scripts/summary_bench.py [--beats N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rdmasched import messages as msg
from rdmasched.daemon import core as C
from rdmasched.daemon.membership import SUMMARIES_PER_BEAT
from rdmasched.topology import Topology
from tests.codec import through_codec

MS = 1_000_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--beats", type=int, default=20_000, help="heartbeats received (20,000)")
    p.add_argument("--nodes", type=int, default=100_000, help="topology size (100,000)")
    args = p.parse_args()
    t = Topology.generate(nodes=args.nodes, leaf=32, pod=1024)
    now = 10_000 * MS
    core = C.NodeCore(
        0,
        {j: t.domain(j) for j in range(len(t))},
        slots=1,
        inc=100,
        dead_after_ns=500 * MS,
        heartbeat_ns=50 * MS,
        now=now,
        topology=t,
    )
    core.open(now)
    link = min(core.links)
    rng = random.Random(1)
    beats = []
    for i in range(args.beats):
        now += 1_000
        nodes = [rng.randrange(len(t)) for _ in range(1 + SUMMARIES_PER_BEAT)]
        sums = [[t.leaf(n), 1 + i, 0, n, 1] for n in nodes]
        hb = msg.Heartbeat(now, 0, 0, {"inc": 1, "sum": sums})
        beats.append((through_codec(hb, src=link, dst=0), now))
    t0 = time.process_time()
    for m, at in beats:
        core.receive(m, link, at)
    per = (time.process_time() - t0) / len(beats) * 1e6
    print(
        f"{C.IMPLEMENTATION} node core: {per:.2f} us a heartbeat received "
        f"({1 + SUMMARIES_PER_BEAT} summaries, {t.leaf(len(t) - 1) + 1:,} leaves, "
        f"{core.SUMMARY_MAX} kept, {args.beats:,} heartbeats)"
    )


if __name__ == "__main__":
    main()
