"""A call from another thread to a verbs node's handler, in the Soft-RoCE VM:

    tests/vm/run-in-vm.sh -- python3 tests/vm/handoff-verbs.py

Two `Node`s on the one rxe device (verbs lanes, TCP bootstrap on loopback); the main thread
calls `Node.submit` on node 0 and waits for its dispatch handler (the loop's thread), back
to back and with a 2 ms pause before each call (the loop has gone to sleep), then prints
p50/p99/max; and the CPU both idle nodes' loops take over 2 s. Figures under qemu's TCG are
several times a real host's: compare runs of this script, not with bench handoff on shm.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.getcwd())

from rdmasched.cluster import ClusterConfig
from rdmasched.daemon.node import Node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    c = ClusterConfig.from_dict(
        {
            "cluster": {
                "name": "vmhandoff",
                "transport": "verbs",
                "token": "vm-handoff-token",
                "slots_per_lane": 64,
                "heartbeat_ms": 1000,
                "dead_after_ms": 10000,
            },
            "node": [
                {"name": f"n{i}", "slots": 1, "address": f"127.0.0.1:{free_port()}"}
                for i in range(2)
            ],
        }
    )
    a, b = Node(c, 0, spin_us=50), Node(c, 1, spin_us=50)
    entered = [0]
    ran = threading.Event()

    def dispatched(t: object, slot: int) -> None:
        entered[0] = time.monotonic_ns()
        ran.set()
        a.complete(t.id)  # type: ignore[attr-defined]

    a.on_dispatch(dispatched)
    opener = threading.Thread(target=b.open)  # both ends of the bootstrap at once
    opener.start()
    a.open()
    opener.join(60)
    a.start()
    b.start()
    try:
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(2.0)
        idle = (time.process_time() - cpu0) / (time.monotonic() - wall0)
        tid = 0
        for pause_ms in (0.0, 2.0):
            lat = []
            for _ in range(400):
                if pause_ms:
                    time.sleep(pause_ms / 1000)
                ran.clear()
                tid += 1
                t0 = time.monotonic_ns()
                a.submit(tid)
                if not ran.wait(10):
                    raise SystemExit(f"submit {tid}: the handler did not run within 10 s")
                lat.append(entered[0] - t0)
            lat.sort()
            print(
                f"pause {pause_ms:g} ms: submit -> on_dispatch p50 {lat[len(lat) // 2] / 1000:.0f}"
                f" us, p99 {lat[int(len(lat) * 0.99)] / 1000:.0f} us, max {lat[-1] / 1000:.0f} us"
            )
        print(f"idle: the two nodes' process took {idle * 100:.1f}% of a core")
    finally:
        a.stop()
        b.stop()


if __name__ == "__main__":
    main()
