"""`rdmasched bench latency --transport verbs`: round trip of a 64-byte control message over
RDMA verbs, against perftest's ib_write_lat on the same device in the same run.

Runs where an RDMA device is (inside the Soft-RoCE VM: tests/vm/bench-verbs.sh). Rows:

- rdmasched-verbs    two processes on the one device (loopback), both sides on the public
                     Python API for every message: `send`, then `poll` returning a `Message`.
- rdmasched-verbs-c  the same lanes, both sides in the Cython hot path (what the lane costs).
- ib_write_lat       perftest, `ib_write_lat -d DEV -x GIDIDX -F -s 64 -n N`, server and
                     client on the same device, the client to the device's IPv4 address.

Like with like: ib_write_lat reports one-way latency, half of each measured round trip. Every
figure here is a round trip, so its row shows 2 x ib_write_lat's figures (its t_typical is
the median: p50 = 2 x t_typical; p99, p99.9, min, max likewise). The ratio is rdmasched's p50
over that, within each round; the median over rounds is printed. ib_write_lat's percentiles
cannot be merged across rounds, so its row holds the median of each figure over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from array import array
from typing import Any

from rdmasched.bench.common import Row, dump_json, pick_cores, print_table, run_pair
from rdmasched.bench.latency import echo_loop, ping_loop

PING = 1  # Kind.DISPATCH
TIMEOUT_US = 10_000_000
TOKEN = "bench-verbs-latency-token"
WHAT = {
    "rdmasched-verbs": "Python API both sides (send, poll -> Message), verbs loopback",
    "rdmasched-verbs-c": "Cython hot path both sides, verbs loopback",
    "ib_write_lat": "perftest ib_write_lat -F -s 64, 2 x its one-way figures (= round trip)",
}


# ---- rdmasched sides ------------------------------------------------------------------------
def _connect(cfg: dict[str, Any], me: str) -> tuple[Any, Any]:
    from rdmasched.transport import verbs

    ep = verbs.Endpoint(
        cfg["device"],
        1 if me == "a" else 2,
        token=TOKEN,
        gid_index=cfg["gid_index"],
        nslots=cfg["nslots"],
        service_level=cfg["service_level"],
        dscp=cfg["dscp"],
        # a late ACK (a busy host) must not fail the QP before the sides' own timeout
        qp_timeout=verbs.qp_timeout_for(TIMEOUT_US / 1000),
    )
    try:
        if me == cfg.get("listener", "a"):  # two hosts: the server (echo side, b) listens
            ep.listen(cfg.get("listen", "127.0.0.1"), cfg["port"])
            conn = ep.accept(cfg.get("accept_s", 30))
        else:
            host = cfg.get("host", "127.0.0.1")
            conn = ep.connect(host, cfg["port"], attempts=100, connect_timeout_s=1)
        conn.tx.send(PING, 0)  # both lanes up before timing starts
        if conn.rx.poll(TIMEOUT_US) is None:
            raise TimeoutError("peer did not answer the start-up message")
    except BaseException:
        ep.close()
        raise
    return ep, conn


def py_ping(cfg: dict[str, Any]) -> bytes:
    ep, conn = _connect(cfg, "a")
    with ep:
        return ping_loop(conn.tx, conn.rx, cfg["n"], cfg["warmup"])


def py_echo(cfg: dict[str, Any]) -> None:
    ep, conn = _connect(cfg, "b")
    with ep:
        echo_loop(conn.tx, conn.rx, cfg["n"] + cfg["warmup"])


def hot_ping(cfg: dict[str, Any]) -> bytes:
    from rdmasched import _bench

    ep, conn = _connect(cfg, "a")
    with ep:
        _bench.ping(conn.rx, conn.tx, cfg["warmup"])
        return bytes(_bench.ping(conn.rx, conn.tx, cfg["n"]))


def hot_echo(cfg: dict[str, Any]) -> None:
    from rdmasched import _bench

    ep, conn = _connect(cfg, "b")
    with ep:
        _bench.echo(conn.rx, conn.tx, cfg["n"] + cfg["warmup"])
        time.sleep(0.2)


# ---- perftest --------------------------------------------------------------------------------
_COLS = ("bytes", "iterations", "t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p999")


def parse_ib_write_lat(text: str) -> dict[str, float]:
    """The result line of ib_write_lat's table (one-way microseconds) as a dict."""
    seen_header = False
    for line in text.splitlines():
        if "t_typical" in line:
            seen_header = True
            continue
        if seen_header:
            parts = line.split()
            if len(parts) >= len(_COLS) and re.fullmatch(r"\d+", parts[0]):
                return {k: float(v) for k, v in zip(_COLS, parts[: len(_COLS)], strict=True)}
    raise ValueError("no result table in ib_write_lat's output:\n" + text[-2000:])


def run_ib_write_lat(
    device: str, gid_index: int, ip: str, iters: int, cls: dict[str, int], timeout_s: float = 300
) -> dict[str, float]:
    port = _free_port()
    base = _ib_write_lat_cmd(device, gid_index, iters, port, cls)
    server = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = ib_write_lat_client(base, ip, timeout_s)
        server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return parse_ib_write_lat(out)


def ib_write_lat_client(base: list[str], ip: str, timeout_s: float = 300) -> str:
    """Run ib_write_lat's client to `ip`, retrying while its server is not listening yet;
    its output."""
    deadline = time.monotonic() + 30
    while True:
        r = subprocess.run([*base, ip], capture_output=True, text=True, timeout=timeout_s)
        out = r.stdout + r.stderr
        if r.returncode == 0:
            return out
        if "Couldn't connect" not in out or time.monotonic() > deadline:
            raise RuntimeError(f"ib_write_lat client failed ({r.returncode}):\n{out}")
        time.sleep(0.2)


def _ib_write_lat_cmd(
    device: str, gid_index: int, iters: int, port: int, cls: dict[str, int]
) -> list[str]:
    """ib_write_lat on the same class as rdmasched's lanes: --sl, and --tclass, the GRH's
    traffic class byte (DSCP << 2)."""
    return [
        "ib_write_lat",
        "-d",
        device,
        "-x",
        str(gid_index),
        "-F",
        "-s",
        "64",
        "-n",
        str(iters),
        "-p",
        str(port),
        f"--sl={cls['service_level']}",
        f"--tclass={cls['dscp'] << 2}",
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def perftest_row(stats: list[dict[str, float]]) -> Row:
    def med(k: str) -> float:
        return 2 * statistics.median(s[k] for s in stats)

    avg = statistics.median(s["t_avg"] for s in stats)
    return Row(
        "ib_write_lat",
        WHAT["ib_write_lat"],
        int(sum(s["iterations"] for s in stats)),
        med("t_min"),
        med("t_typical"),
        med("p99"),
        med("p999"),
        med("t_max"),
        1e6 / avg if avg else 0.0,
    )


# ---- driver ------------------------------------------------------------------------------------
def _row(name: str, raw: bytes) -> Row:
    samples = array("Q")
    samples.frombytes(raw)
    return Row.from_samples(name, WHAT[name], samples)


def _device(args: argparse.Namespace) -> tuple[str, int, str | None]:
    """The device, its GID index and the IPv4 address of that GID (RdmaschedError if none)."""
    from rdmasched.transport import verbs

    dev_name = args.device or os.environ.get("RDMASCHED_DEVICE") or None
    gid_env = os.environ.get("RDMASCHED_GID_INDEX")
    gid_index = (
        args.gid_index if args.gid_index is not None else (int(gid_env) if gid_env else None)
    )
    dev = verbs.Device(dev_name, gid_index=gid_index)
    name, gidx, ip = dev.name, dev.gid.index, dev.gid.ipv4
    dev.close()
    return name, gidx, os.environ.get("RDMASCHED_IP") or ip


def _class(source: Any) -> dict[str, int]:
    """The run's class (--service-level, --dscp): from the arguments, or the client's
    parameters on the server."""
    d = source if isinstance(source, dict) else vars(source)
    return {"service_level": int(d["service_level"]), "dscp": int(d["dscp"])}


def _fail(text: str) -> int:
    print(f"rdmasched bench latency: error: --transport verbs: {text}", file=sys.stderr)
    return 1


def main(args: argparse.Namespace) -> int:
    from rdmasched.errors import RdmaschedError

    try:
        name, gidx, ip = _device(args)
    except RdmaschedError as exc:
        return _fail(
            f"{exc}; this benchmark runs where an RDMA device is (the Soft-RoCE VM: "
            "tests/vm/bench-verbs.sh)"
        )
    if getattr(args, "server", False):
        return serve(args, name, gidx)
    if getattr(args, "client", None):
        return run_client(args, name, gidx)
    if ip is None:
        return _fail(
            "no IPv4 address for the device's GID: ib_write_lat's client needs one "
            "(set RDMASCHED_IP)"
        )
    per_round_n = max(1, args.iterations // args.rounds)
    warm = min(args.warmup, per_round_n)
    ptest_n = args.perftest_iterations or per_round_n
    rounds: list[tuple[bytes, bytes, dict[str, float]]] = []
    for r in range(args.rounds):
        cfg = {
            "device": name,
            "gid_index": gidx,
            "nslots": args.lane_slots,
            "n": per_round_n,
            "warmup": warm,
            **_class(args),
        }
        a, _ = run_pair(py_ping, py_echo, {**cfg, "port": _free_port()}, timeout_s=600)
        c, _ = run_pair(hot_ping, hot_echo, {**cfg, "port": _free_port()}, timeout_s=600)
        st = run_ib_write_lat(name, gidx, ip, ptest_n, _class(args))
        rounds.append((a, c, st))
        _progress(args, r, a, c, st)
    return report(args, rounds, name, gidx, "two processes on one device (loopback)")


def _progress(args: argparse.Namespace, r: int, a: bytes, c: bytes, st: dict[str, float]) -> None:
    if args.json or not sys.stderr.isatty():
        return
    py, hot = _row("rdmasched-verbs", a), _row("rdmasched-verbs-c", c)
    print(
        f"  round {r + 1}/{args.rounds}: rdmasched-verbs p50 {py.p50_us:8.2f} us, "
        f"-c {hot.p50_us:8.2f} us, ib_write_lat t_typical {st['t_typical']:.2f} us "
        f"one-way (x2 = {2 * st['t_typical']:.2f} us)",
        file=sys.stderr,
    )


def report(
    args: argparse.Namespace,
    rounds: list[tuple[bytes, bytes, dict[str, float]]],
    name: str,
    gidx: int,
    where: str,
) -> int:
    """The table (or JSON) from each round's samples and ib_write_lat figures."""
    raw: dict[str, list[bytes]] = {"rdmasched-verbs": [], "rdmasched-verbs-c": []}
    ptest: list[dict[str, float]] = []
    ratios: list[float] = []
    ratios_c: list[float] = []
    bad_rounds: list[int] = []
    for r, (a, c, st) in enumerate(rounds):
        raw["rdmasched-verbs"].append(a)
        raw["rdmasched-verbs-c"].append(c)
        if not all(math.isfinite(v) and v > 0 for k, v in st.items() if k != "t_stdev"):
            # perftest's cycle clock is unreliable under emulation (SOFT-ROCE-VM.md): a round
            # where it printed inf/0 has no baseline; its rdmasched samples stay in the rows.
            bad_rounds.append(r + 1)
            continue
        ptest.append(st)
        ratios.append(_row("rdmasched-verbs", a).p50_us / (2 * st["t_typical"]))
        ratios_c.append(_row("rdmasched-verbs-c", c).p50_us / (2 * st["t_typical"]))
    if not ptest:
        print("ib_write_lat gave no usable figures in any round: no ratio", file=sys.stderr)
        return 1
    rows = [_row(k, b"".join(v)) for k, v in raw.items()] + [perftest_row(ptest)]
    table = {
        "rdmasched-verbs": {"ib_write_lat": statistics.median(ratios)},
        "rdmasched-verbs-c": {"ib_write_lat": statistics.median(ratios_c)},
    }
    if args.json:
        from rdmasched.bench import output

        config = {k: v for k, v in vars(args).items() if k != "func"}
        print(
            dump_json(
                rows,
                {
                    "ratios_p50_median_of_rounds": table,
                    "rounds": args.rounds,
                    "device": name,
                    "gid_index": gidx,
                    "where": where,
                    "cores": list(pick_cores()),
                    "ib_write_lat_one_way_us": ptest,
                    "rounds_without_baseline": bad_rounds,
                    "compare": "round trip: rdmasched p50 vs 2 x ib_write_lat "
                    "t_typical (ib_write_lat reports one-way)",
                    **output.run_info(config),
                },
            )
        )
        return 0
    print_table(
        f"rdmasched bench latency --transport verbs: round trip (us) of a 64-byte message each "
        f"way on {name} (GID index {gidx}), {where}, {args.rounds} interleaved rounds\n"
        "ib_write_lat reports one-way latency (half the round trip): its row is 2 x its figures,"
        " so every row is a round trip;\nratio = rdmasched p50 / (2 x ib_write_lat t_typical) "
        "within a round, median of rounds",
        rows,
        table,
        ["ib_write_lat"],
    )
    one_way = statistics.median(s["t_typical"] for s in ptest)
    py_p50 = rows[0].p50_us
    print(
        f"\none-way view: rdmasched-verbs p50/2 = {py_p50 / 2:.2f} us vs ib_write_lat "
        f"t_typical {one_way:.2f} us: {statistics.median(ratios):.2f}x (target <= 1.2x)"
    )
    if bad_rounds:
        print(f"rounds left out of the ratio (ib_write_lat printed inf/0): {bad_rounds}")
    print(json.dumps({"ib_write_lat_one_way_us_per_round": ptest}))
    return 0


# ---- two hosts: server and client, as perftest ---------------------------------------------
#: the control connection's port; row k of a round uses port + 1 + k
DEFAULT_PORT = 18520
ROW_ORDER = ("rdmasched-verbs", "rdmasched-verbs-c", "ib_write_lat")
CONTROL_TIMEOUT_S = 600.0


def _send_json(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _recv_json(f: Any) -> dict[str, Any]:
    line = f.readline()
    if not line:
        raise ConnectionError("the other side closed the control connection")
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError(f"bad control message: {line!r}")
    if "error" in obj:
        raise RuntimeError(f"the other side failed: {obj['error']}")
    return obj


def serve(args: argparse.Namespace, name: str, gidx: int) -> int:
    """The server (echo) side of a two-host run: waits for one client on --port, takes the
    run's parameters from it (as perftest's server does) and echoes every row."""
    from rdmasched import __version__

    port = args.port or DEFAULT_PORT
    with socket.create_server(("0.0.0.0", port)) as ls:
        ls.settimeout(CONTROL_TIMEOUT_S)
        print(f"rdmasched bench latency: server on {name}, port {port}", file=sys.stderr)
        ctl, peer = ls.accept()
    with ctl, ctl.makefile("r") as f:
        ctl.settimeout(CONTROL_TIMEOUT_S)
        try:
            cfg = _recv_json(f)
            if cfg.get("version") != __version__:
                raise ValueError(
                    f"client is rdmasched {cfg.get('version')}, server {__version__}: "
                    "run the same version on both hosts"
                )
            _send_json(ctl, {"ok": True, "device": name})
            for _ in range(int(cfg["rounds"])):
                for k, row in enumerate(ROW_ORDER):
                    rport = port + 1 + k
                    side = {
                        "device": name,
                        "gid_index": gidx,
                        "nslots": int(cfg["nslots"]),
                        **_class(cfg),
                        "n": int(cfg["n"]),
                        "warmup": int(cfg["warmup"]),
                        "port": rport,
                        "listener": "b",
                        "listen": "0.0.0.0",
                    }
                    if row == "ib_write_lat":
                        base = _ib_write_lat_cmd(
                            name, gidx, int(cfg["perftest_n"]), rport, _class(cfg)
                        )
                        proc = subprocess.Popen(
                            base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                        )
                        _send_json(ctl, {"ready": row, "port": rport})
                        out, _ = proc.communicate(timeout=CONTROL_TIMEOUT_S)
                        if proc.returncode:
                            raise RuntimeError(f"ib_write_lat server failed:\n{out}")
                    else:
                        _send_json(ctl, {"ready": row, "port": rport})
                        (py_echo if row == "rdmasched-verbs" else hot_echo)(side)
                    _recv_json(f)  # the client's "done" for this row
            _send_json(ctl, {"done": True})
        except Exception as exc:
            with contextlib.suppress(OSError):
                _send_json(ctl, {"error": f"{type(exc).__name__}: {exc}"})
            raise
    print(f"rdmasched bench latency: served {peer[0]}", file=sys.stderr)
    return 0


def run_client(args: argparse.Namespace, name: str, gidx: int) -> int:
    """The client (pinger) side of a two-host run: connects to the server at --client,
    gives it the run's parameters, measures every row, prints the table."""
    from rdmasched import __version__

    host, port = args.client, args.port or DEFAULT_PORT
    per_round_n = max(1, args.iterations // args.rounds)
    warm = min(args.warmup, per_round_n)
    ptest_n = args.perftest_iterations or per_round_n
    deadline = time.monotonic() + 60
    while True:
        try:
            ctl = socket.create_connection((host, port), timeout=5)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                return _fail(f"no server at {host}:{port} ({exc}); start one with --server")
            time.sleep(0.5)
    rounds: list[tuple[bytes, bytes, dict[str, float]]] = []
    with ctl, ctl.makefile("r") as f:
        ctl.settimeout(CONTROL_TIMEOUT_S)
        _send_json(
            ctl,
            {
                "version": __version__,
                "n": per_round_n,
                "warmup": warm,
                "rounds": args.rounds,
                "nslots": args.lane_slots,
                "perftest_n": ptest_n,
                **_class(args),
            },
        )
        _recv_json(f)
        for r in range(args.rounds):
            got: dict[str, Any] = {}
            for row in ROW_ORDER:
                ready = _recv_json(f)
                if ready.get("ready") != row:
                    raise RuntimeError(f"server out of step: expected {row}, got {ready}")
                side = {
                    "device": name,
                    "gid_index": gidx,
                    "nslots": args.lane_slots,
                    **_class(args),
                    "n": per_round_n,
                    "warmup": warm,
                    "port": int(ready["port"]),
                    "listener": "b",
                    "host": host,
                }
                if row == "ib_write_lat":
                    base = _ib_write_lat_cmd(name, gidx, ptest_n, int(ready["port"]), _class(args))
                    got[row] = parse_ib_write_lat(ib_write_lat_client(base, host))
                else:
                    got[row] = (py_ping if row == "rdmasched-verbs" else hot_ping)(side)
                _send_json(ctl, {"done": row})
            rounds.append((got["rdmasched-verbs"], got["rdmasched-verbs-c"], got["ib_write_lat"]))
            _progress(args, r, *rounds[-1])
        _recv_json(f)
    return report(args, rounds, name, gidx, f"two hosts: this one and the server at {host}")
