"""Two-VM barrier: returns once both guests have reached it (tests/vm/guest-init.sh).

Usage (inside a guest): python3 guest-barrier.py SELF_IP PEER_IP TIMEOUT_SECONDS [PORT]

PORT: 7470 (the barrier before COMMAND) unless given (guest-init.sh's end barrier: 7471).

Each side listens on SELF_IP:PORT and keeps connecting to PEER_IP:PORT until the peer
accepts; it passes when it has both reached the peer and been reached by it. Exit 0 on
success, 1 on timeout. The guests have no other network, so the fixed port is safe.
"""

import socket
import sys
import threading
import time

PORT = 7470


def main() -> int:
    self_ip, peer_ip, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    port = int(sys.argv[4]) if len(sys.argv) > 4 else PORT
    deadline = time.monotonic() + timeout
    server = socket.create_server((self_ip, port))
    server.settimeout(timeout)
    reached_by_peer = threading.Event()

    def accept() -> None:
        while not reached_by_peer.is_set():
            try:
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(10)
                    if conn.recv(5) == b"ready":
                        conn.sendall(b"ok")
                        reached_by_peer.set()
            except OSError:
                if time.monotonic() >= deadline:
                    return

    threading.Thread(target=accept, daemon=True).start()
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((peer_ip, port), timeout=2) as conn:
                conn.sendall(b"ready")
                conn.settimeout(10)
                if conn.recv(2) == b"ok":
                    break
        except OSError:
            time.sleep(0.2)
    else:
        print(f"barrier: {peer_ip}:{port} not reachable in {timeout:.0f} s", file=sys.stderr)
        return 1
    if not reached_by_peer.wait(max(0.0, deadline - time.monotonic())):
        print(f"barrier: the peer never reached {self_ip}:{port}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
