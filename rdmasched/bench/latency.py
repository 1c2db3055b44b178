"""`rdmasched bench latency`: round trip of a 64-byte control message between two processes.

Rows, all measured in this run, on this machine, with the two sides pinned to two cores:

- rdmasched-shm      both sides use the public Python API for every message: `send`, then
                     `poll` returning the decoded `Message`.
- rdmasched-shm-hot  the pinger uses the Python API; the echo side is the Cython hot path
                     (a daemon's poll loop): poll and reply in C without the GIL.
- rdmasched-shm-c    both sides in the hot path: what the lane itself costs over the floor.
- c-shm-floor        plain C: two flags on two cache lines of shared memory, spin with pause.
- zmq-ipc            pyzmq REQ/REP over ipc://, 64-byte messages.
- unix-socket        a Unix stream socketpair, blocking send/recv of 64 bytes.

A sample is one round trip (two messages), timed by the pinger from the previous sample's end,
so the pinger's own loop is included, as it is for a user.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from array import array
from typing import Any

from rdmasched.bench.common import Row, pick_cores, run_pair, samples_array

PING = 1  # Kind.DISPATCH
ROWS = (
    "rdmasched-shm",
    "rdmasched-shm-hot",
    "rdmasched-shm-c",
    "c-shm-floor",
    "zmq-ipc",
    "unix-socket",
)
WHAT = {
    "rdmasched-shm": "Python API both sides (send, poll -> Message)",
    "rdmasched-shm-hot": "Python API pinger, Cython hot-path echo",
    "rdmasched-shm-c": "Cython hot path both sides",
    "c-shm-floor": "plain C, two cache-line flags (this machine's floor)",
    "zmq-ipc": "pyzmq REQ/REP over ipc://",
    "unix-socket": "Unix socketpair, blocking send/recv",
}
TIMEOUT_US = 10_000_000
#: metadata sizes of the size sweep (`--sizes all`, like perftest's -a): bytes of msgpack
#: metadata per message, 0 (a lone head slot) to the protocol's 4096
SIZES_ALL = (0, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: the rows that carry metadata in the sweep (both sides through the Python API)
SIZED_ROWS = ("rdmasched-shm",)


def meta_of_size(size: int) -> dict[str, Any] | None:
    """Metadata whose msgpack encoding is exactly `size` bytes: {"p": <bin of zeros>};
    None for 0. Sizes 1-4 are too small for a map with a payload."""
    if size == 0:
        return None
    if not 5 <= size <= 4096:
        raise ValueError(f"metadata size {size}: must be 0 or 5..4096 bytes")
    pad = size - 5 if size - 5 < 256 else size - 6  # bin 8 header: 2 bytes; bin 16: 3
    meta = {"p": bytes(pad)}
    import msgpack

    if len(msgpack.packb(meta, use_bin_type=True)) != size:
        raise ValueError(f"metadata size {size} cannot be made exactly (bin 8/16 boundary)")
    return meta


def sized_name(name: str, size: int) -> str:
    """The row name of `name` measured with `size` bytes of metadata."""
    return f"{name}@{size}B"


# ---- rdmasched lanes ------------------------------------------------------------------------
def _lanes(cfg: dict[str, Any], me: str, peer: str) -> tuple[Any, Any]:
    """Create my inbound lane, wait for the peer's, attach to it."""
    from rdmasched.transport import shm

    rx = shm.create_lane(f"{cfg['prefix']}-{me}", cfg["nslots"])
    deadline = time.monotonic() + 10
    while True:
        try:
            tx = shm.attach_lane(f"{cfg['prefix']}-{peer}", src=1 if me == "a" else 2)
            break
        except Exception:
            if time.monotonic() > deadline:
                rx.close()
                raise
            time.sleep(0.001)
    return rx, tx


def _sync(rx: Any, tx: Any) -> None:
    """Exchange one message each way so both lanes are attached before timing starts."""
    tx.send(PING, 0)
    if rx.poll(TIMEOUT_US) is None:
        raise TimeoutError("peer did not answer the start-up message")


def ping_loop(tx: Any, rx: Any, n: int, warmup: int, meta: dict[str, Any] | None = None) -> bytes:
    """The pinger through the public Python API, on any transport: send, then poll for the
    echo; one sample per round trip, timed from the previous sample's end. With `meta`,
    every message carries that metadata (the size sweep)."""
    send, poll, perf = tx.send, rx.poll, time.perf_counter_ns
    out = samples_array(n)
    for i in range(warmup):
        send(PING, i, meta=meta)
        poll(TIMEOUT_US)
    t_prev = perf()
    for i in range(n):
        send(PING, i, meta=meta)
        if poll(TIMEOUT_US) is None:
            raise TimeoutError(f"no echo for message {i}")
        t = perf()
        out[i] = t - t_prev
        t_prev = t
    return out.tobytes()


def echo_loop(tx: Any, rx: Any, count: int) -> None:
    """The echo side through the public Python API: poll, send the fields (and the
    metadata, if any) straight back."""
    send, poll = tx.send, rx.poll
    for _ in range(count):
        m = poll(TIMEOUT_US)
        if m is None:
            raise TimeoutError("pinger went quiet")
        send(m.kind, m.id, m.job, m.priority, meta=m.meta)


def py_ping(cfg: dict[str, Any]) -> bytes:
    rx, tx = _lanes(cfg, "a", "b")
    with rx, tx:
        _sync(rx, tx)
        return ping_loop(tx, rx, cfg["n"], cfg["warmup"], cfg.get("meta"))


def py_echo(cfg: dict[str, Any]) -> None:
    rx, tx = _lanes(cfg, "b", "a")
    with rx, tx:
        _sync(rx, tx)
        echo_loop(tx, rx, cfg["n"] + cfg["warmup"])


def hot_echo(cfg: dict[str, Any]) -> None:
    from rdmasched import _bench

    rx, tx = _lanes(cfg, "b", "a")
    with rx, tx:
        _sync(rx, tx)
        _bench.echo(rx, tx, cfg["n"] + cfg["warmup"])


def hot_ping(cfg: dict[str, Any]) -> bytes:
    from rdmasched import _bench

    rx, tx = _lanes(cfg, "a", "b")
    with rx, tx:
        _sync(rx, tx)
        _bench.ping(rx, tx, cfg["warmup"])
        return bytes(_bench.ping(rx, tx, cfg["n"]))


# ---- plain C floor ---------------------------------------------------------------------------
def floor_side(cfg: dict[str, Any]) -> bytes | None:
    from rdmasched import _bench
    from rdmasched._shm import ShmSegment

    pinger = cfg["role"] == "a"
    with ShmSegment.open(cfg["segment"]) as seg:
        total = cfg["n"] + cfg["warmup"]
        samples = _bench.floor_pingpong(seg.address, pinger, total)
    return bytes(samples[cfg["warmup"] :]) if samples is not None else None


def _floor_a(cfg: dict[str, Any]) -> bytes | None:
    return floor_side({**cfg, "role": "a"})


def _floor_b(cfg: dict[str, Any]) -> bytes | None:
    return floor_side({**cfg, "role": "b"})


# ---- what users would otherwise pick ---------------------------------------------------------
def zmq_ping(cfg: dict[str, Any]) -> bytes:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.REQ)
    s.connect(cfg["endpoint"])
    msg = bytes(64)
    n, warm = cfg["n"], cfg["warmup"]
    out = samples_array(n)
    try:
        for _ in range(warm):
            s.send(msg)
            s.recv()
        perf = time.perf_counter_ns
        t_prev = perf()
        for i in range(n):
            s.send(msg)
            s.recv()
            t = perf()
            out[i] = t - t_prev
            t_prev = t
    finally:
        s.close(linger=0)
        ctx.term()
    return out.tobytes()


def zmq_echo(cfg: dict[str, Any]) -> None:
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.REP)
    s.bind(cfg["endpoint"])
    try:
        for _ in range(cfg["n"] + cfg["warmup"]):
            s.send(s.recv())
    finally:
        s.close(linger=0)
        ctx.term()


def _recv_exact(s: socket.socket, buf: memoryview) -> None:
    got = 0
    while got < len(buf):
        k = s.recv_into(buf[got:])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


def unix_ping(cfg: dict[str, Any]) -> bytes:
    s: socket.socket = cfg["sockets"][0]
    cfg["sockets"][1].close()
    msg, buf = bytes(64), memoryview(bytearray(64))
    n, warm = cfg["n"], cfg["warmup"]
    out = samples_array(n)
    for _ in range(warm):
        s.sendall(msg)
        _recv_exact(s, buf)
    perf = time.perf_counter_ns
    t_prev = perf()
    for i in range(n):
        s.sendall(msg)
        _recv_exact(s, buf)
        t = perf()
        out[i] = t - t_prev
        t_prev = t
    return out.tobytes()


def unix_echo(cfg: dict[str, Any]) -> None:
    s: socket.socket = cfg["sockets"][1]
    cfg["sockets"][0].close()
    buf = memoryview(bytearray(64))
    for _ in range(cfg["n"] + cfg["warmup"]):
        _recv_exact(s, buf)
        s.sendall(buf)


# ---- driver ----------------------------------------------------------------------------------
def _to_row(name: str, raw: bytes) -> Row:
    samples = array("Q")
    samples.frombytes(raw)
    return Row.from_samples(name, WHAT[name], samples)


def run_row(
    name: str, n: int, warmup: int, nslots: int = 256, meta_bytes: int | None = None
) -> tuple[Row, bytes]:
    """Measure one row: `n` round trips after `warmup`; the row and its raw samples. With
    `meta_bytes` (rows in SIZED_ROWS only), every message carries that much metadata, and
    the row is named `row@<size>B` (also for 0)."""
    cfg: dict[str, Any] = {
        "n": n,
        "warmup": warmup,
        "nslots": nslots,
        "prefix": f"bench-{os.getpid()}-{uuid.uuid4().hex[:8]}",
    }
    if meta_bytes is not None:
        if name not in SIZED_ROWS:
            raise ValueError(f"row {name} has no metadata path; sized rows: {SIZED_ROWS}")
        cfg["meta"] = meta_of_size(meta_bytes)
        row, raw = run_row_cfg(name, cfg)
        sized = Row.from_hist(
            sized_name(name, meta_bytes),
            f"{WHAT[name]}, {meta_bytes} B of metadata",
            row.hist,
            row.total_ns,
        )
        return sized, raw
    return run_row_cfg(name, cfg)


def run_row_cfg(name: str, cfg: dict[str, Any]) -> tuple[Row, bytes]:
    if name == "rdmasched-shm":
        a, _ = run_pair(py_ping, py_echo, cfg)
    elif name == "rdmasched-shm-hot":
        a, _ = run_pair(py_ping, hot_echo, cfg)
    elif name == "rdmasched-shm-c":
        a, _ = run_pair(hot_ping, hot_echo, cfg)
    elif name == "c-shm-floor":
        from rdmasched._shm import ShmSegment

        with ShmSegment.create(f"/rdmasched.{cfg['prefix']}-floor", 128) as seg:
            cfg["segment"] = seg.name
            a, _ = run_pair(_floor_a, _floor_b, cfg)
    elif name == "zmq-ipc":
        with tempfile.TemporaryDirectory(prefix="rdmasched-bench-") as d:
            cfg["endpoint"] = f"ipc://{d}/zmq.sock"
            a, _ = run_pair(zmq_ping, zmq_echo, cfg)
    elif name == "unix-socket":
        cfg["sockets"] = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            a, _ = run_pair(unix_ping, unix_echo, cfg)
        finally:
            for s in cfg["sockets"]:
                s.close()
    else:
        raise ValueError(f"unknown row {name!r}; rows: {', '.join(ROWS)}")
    return _to_row(name, a), a


SLOW_ROWS = ("zmq-ipc", "unix-socket")
#: round trips of the probe that sizes a row in duration mode
PROBE = 500


def count_for(
    name: str, seconds: float, nslots: int, meta_bytes: int | None = None, probe: int = PROBE
) -> int:
    """Duration mode: how many round trips of `name` fill about `seconds`, from a probe
    of `probe` round trips of the same row (its mean, not its median: the time it takes)."""
    row, _ = run_row(name, probe, min(probe, 100), nslots, meta_bytes)
    mean_ns = row.total_ns / max(1, row.n)
    return max(1, int(seconds * 1e9 / mean_ns)) if mean_ns > 0 else probe


def run(
    rows: list[str],
    n: int,
    slow_n: int,
    warmup: int,
    rounds: int = 5,
    nslots: int = 256,
    progress: Any = None,
    sizes: tuple[int, ...] = (),
    duration_s: float | None = None,
) -> tuple[list[Row], list[dict[str, Row]]]:
    """Measure `rows` in `rounds` interleaved rounds of n/rounds samples each.

    The host may move the two vCPUs between physical cores at any time (the floor here was
    seen to jump between 0.1 and 0.45 us within a minute). Interleaving gives every row the
    same mix of placements; ratios are taken within a round. Returns the rows over all
    samples (the rounds' histograms merged: exact percentiles of every sample), and each
    round's rows.

    `sizes`: the rows in SIZED_ROWS are measured once per metadata size (named
    `row@<size>B`), the others once. `duration_s`: each row runs about that long per round
    (the count from a probe of the row, at the round's start) instead of n/rounds.
    """
    plan: list[tuple[str, str, int | None]] = []  # (result name, row, metadata bytes)
    for name in rows:
        if sizes and name in SIZED_ROWS:
            plan += [(sized_name(name, k), name, k) for k in sizes]
        else:
            plan.append((name, name, None))
    per_round: list[dict[str, Row]] = []
    for r in range(rounds):
        this: dict[str, Row] = {}
        for key, name, k in plan:
            if duration_s is not None:
                count = count_for(name, duration_s, nslots, k)
            else:
                count = max(1, (slow_n if name in SLOW_ROWS else n) // rounds)
            row, _ = run_row(name, count, min(warmup, count), nslots, k)
            this[key] = row
            if progress:
                progress(r, key, row)
        per_round.append(this)
    return [Row.merged([rr[key] for rr in per_round]) for key, _, _ in plan], per_round


def round_ratios(per_round: list[dict[str, Row]], name: str, ref: str) -> list[float]:
    """p50(name) / p50(ref) in each round where both were measured."""
    return [
        r[name].p50_us / r[ref].p50_us
        for r in per_round
        if name in r and ref in r and r[ref].p50_us > 0
    ]


def from_args(args: argparse.Namespace, quiet: bool = False) -> dict[str, Any]:
    """`rdmasched bench latency`'s figures from its parsed options: the rows, their ratios
    within rounds; progress on stderr unless `quiet` or stderr is not a terminal."""
    rows = list(args.rows)
    sizes: tuple[int, ...] = tuple(getattr(args, "sizes", None) or ())
    quiet = quiet or not sys.stderr.isatty()

    def progress(r: int, name: str, row: Any) -> None:
        if not quiet:
            print(
                f"  round {r + 1}/{args.rounds}: {name:<18} p50 {row.p50_us:7.2f} us",
                file=sys.stderr,
            )

    results, per_round = run(
        rows,
        args.iterations,
        args.slow_iterations,
        args.warmup,
        args.rounds,
        args.lane_slots,
        progress,
        sizes=sizes,
        duration_s=getattr(args, "duration", None),
    )
    # in a size sweep the sized rows are renamed (row@<size>B): only the floor is a reference
    refs = [
        r for r in ("c-shm-floor", "rdmasched-shm") if r in rows and not (r in SIZED_ROWS and sizes)
    ]
    ratios = {
        row.name: {ref: statistics.median(round_ratios(per_round, row.name, ref)) for ref in refs}
        for row in results
    }
    return {
        "results": results,
        "ratios_p50_median_of_rounds": ratios,
        "refs": refs,
        "rounds": args.rounds,
        "cores": list(pick_cores()),
        "per_round": per_round,
    }
