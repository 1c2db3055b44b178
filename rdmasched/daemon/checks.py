"""Argument checks of the `Node` API, run in the caller's thread before anything is queued.

One place for every check, so that every entry point rejects the same things the same way:
integers must be real `int`s (not `bool`, not `float`: `submit(1.5)` must not become task 1)
within the range of the wire field they travel in; nodes are named by id or by name;
payloads are dicts that msgpack can encode within the metadata bound. Errors are
`ArgumentTypeError` (a `TypeError`) or `ArgumentError` (a `ValueError`); an unknown node is
the cluster's `ConfigError`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from rdmasched._wire import pack_meta
from rdmasched.cluster import ClusterConfig
from rdmasched.errors import ArgumentError, ArgumentTypeError, MessageError
from rdmasched.limits import U64_MAX as U64_MAX  # (node.py and client.py import it from here)


def check_int(name: str, value: object, lo: int = 0, hi: int = U64_MAX) -> int:
    """`value` as an int in lo..hi, or ArgumentTypeError / ArgumentError naming `name`."""
    if type(value) is not int:
        # an int subclass (IntEnum) or an integer type (numpy's): its plain value; never a
        # float (which would be truncated) nor a bool
        try:
            if isinstance(value, bool) or type(value).__name__ == "bool_":
                raise TypeError
            value = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise ArgumentTypeError(
                f"{name} must be an integer, not {type(value).__name__} {value!r}"
            ) from None
    if not lo <= value <= hi:
        raise ArgumentError(f"{name} must be {_span(lo, hi)}, not {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be True or False, not {value!r}")
    return value


def check_node(cluster: ClusterConfig, name: str, value: object) -> int:
    """A node given by id or by name, as its id (ConfigError if the cluster has none)."""
    if isinstance(value, str):
        return cluster.node(value).id
    return cluster.node(check_int(name, value, 0, U64_MAX)).id


def check_payload(payload: object) -> None:
    """A task payload: None, or a dict msgpack can encode within the metadata bound."""
    if payload is None:
        return
    if not isinstance(payload, dict):
        raise ArgumentTypeError(f"payload must be a dict or None, not {type(payload).__name__}")
    try:
        pack_meta(payload)
    except MessageError as exc:
        raise ArgumentError(f"payload: {exc}") from None


def check_callable(name: str, fn: object) -> Callable[..., Any]:
    if not callable(fn):
        raise ArgumentTypeError(f"{name} must be callable, not {type(fn).__name__} {fn!r}")
    return fn


def _span(lo: int, hi: int) -> str:
    def p(v: int) -> str:
        for e in (31, 32, 63, 64):
            if v == (1 << e) - 1:
                return f"2**{e}-1"
        return str(v)

    return f"{p(lo)}..{p(hi)}"
