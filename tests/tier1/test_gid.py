"""GID choice and routability: the pure parts of the verbs control plane (no RDMA)."""

from __future__ import annotations

import ipaddress

import pytest

from rdmasched.errors import ConfigError
from rdmasched.transport.verbs import GidEntry, check_route, choose_gid, gid_from_text


def g(index: int, text: str, kind: str = "RoCE v2") -> GidEntry:
    return GidEntry(index, ipaddress.IPv6Address(text).packed, kind, 1, "eth0")


LINK_LOCAL = g(0, "fe80::1:2:3:4")
V4 = g(1, "::ffff:192.0.2.1")
V4_V1 = g(2, "::ffff:192.0.2.1", "RoCE v1")


def test_default_is_the_roce_v2_ipv4_gid() -> None:
    assert choose_gid([LINK_LOCAL, V4_V1, V4]) is V4


def test_index_overrides_the_default() -> None:
    assert choose_gid([LINK_LOCAL, V4], 0) is LINK_LOCAL


def test_missing_index_lists_the_table() -> None:
    with pytest.raises(ConfigError, match=r"GID index 5 of rxe0 port 1 .*::ffff:192\.0\.2\.1"):
        choose_gid([LINK_LOCAL, V4], 5, device="rxe0")


def test_no_ipv4_gid_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"no RoCE v2 GID with an IPv4 address.*--gid-index"):
        choose_gid([LINK_LOCAL, V4_V1], device="rxe0")


def test_infiniband_uses_index_0() -> None:
    ib = g(0, "fe80::2c9:300:1:2", "IB")
    assert choose_gid([ib], link_layer="InfiniBand") is ib


def test_routes() -> None:
    check_route(V4, ipaddress.IPv6Address("::ffff:192.0.2.7").packed)
    check_route(LINK_LOCAL, ipaddress.IPv6Address("fe80::9").packed)
    with pytest.raises(ConfigError, match="cannot route"):
        check_route(V4, ipaddress.IPv6Address("fe80::9").packed)
    with pytest.raises(ConfigError, match="cannot route"):
        check_route(LINK_LOCAL, ipaddress.IPv6Address("::ffff:192.0.2.7").packed)
    with pytest.raises(ConfigError, match="empty GID"):
        check_route(V4, bytes(16))


def test_gid_text_forms() -> None:
    assert gid_from_text("0000:0000:0000:0000:0000:ffff:c000:0201") == V4.gid
    assert gid_from_text("::ffff:192.0.2.1") == V4.gid
    assert V4.text == "::ffff:192.0.2.1" and V4.ipv4 == "192.0.2.1"


def test_ib_write_lat_table_is_parsed() -> None:
    from rdmasched.bench.verbs_latency import parse_ib_write_lat, perftest_row

    header = (
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
        "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
    )
    values = (
        " 64     1000          3.10           40.00        4.20               4.50"
        "            1.00            9.00                   30.00"
    )
    out = "\n".join(["-" * 80, header, values, "-" * 80])
    st = parse_ib_write_lat(out)
    assert st["t_typical"] == 4.20 and st["p999"] == 30.00 and st["iterations"] == 1000
    row = perftest_row([st])
    assert (row.p50_us, row.p99_us, row.min_us) == (8.40, 18.00, 6.20)  # round trip = 2x
    with pytest.raises(ValueError):
        parse_ib_write_lat("Couldn't connect to 192.0.2.1:18515")
