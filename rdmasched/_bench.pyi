"""Typing stub for the Cython module rdmasched._bench (cython/rdmasched/_bench.pyx)."""

from array import array

from rdmasched._ring import RxLane, TxLane

def floor_pingpong(
    address: int, pinger: bool, iters: int, timeout_s: float = 10.0
) -> array[int] | None: ...
def echo(rx: RxLane, tx: TxLane, count: int, timeout_s: float = 10.0) -> int: ...
def ping(rx: RxLane, tx: TxLane, iters: int, timeout_s: float = 10.0) -> array[int]: ...
