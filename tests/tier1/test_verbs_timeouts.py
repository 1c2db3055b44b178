"""The RC retry budget follows the caller's liveness rule (transport/verbs.qp_timeout_for): a
QP never fails a peer that the daemon (dead_after_ms) or the benchmark (its timeout) still
waits for, since on a busy host (the two-VM tier) a late ACK failed the QP first."""

from __future__ import annotations

import pytest

from rdmasched.transport.verbs import DEFAULT_QP_TIMEOUT, DEFAULT_RETRY_CNT, qp_timeout_for


def budget_ms(t: int, retry_cnt: int = DEFAULT_RETRY_CNT) -> float:
    return 4.096e-3 * (1 << t) * (1 + retry_cnt)


@pytest.mark.parametrize("patience_ms", [1, 100, 470, 500, 1000, 10_000, 60_000, 3_600_000])
def test_the_budget_lasts_the_patience_and_no_longer_than_needed(patience_ms: int) -> None:
    t = qp_timeout_for(patience_ms)
    assert DEFAULT_QP_TIMEOUT <= t <= 31
    assert budget_ms(t) >= patience_ms or t == 31
    if t > DEFAULT_QP_TIMEOUT:  # the smallest that lasts: one less would not
        assert budget_ms(t - 1) < patience_ms


def test_the_daemons_defaults() -> None:
    assert qp_timeout_for(500) == 15  # dead_after_ms 500: 134 ms a try, 0.94 s in all
    assert budget_ms(DEFAULT_QP_TIMEOUT) < 500 <= budget_ms(15)
    assert qp_timeout_for(10_000) == 19  # the two-VM tier's 10 s, the bench's timeout
    assert qp_timeout_for(10**12) == 31  # the exponent's bound
