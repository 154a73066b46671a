from __future__ import annotations

import pytest
from whywait.agents.rates import ABSURD, FIRST, RESET, SATURATED, WRAP, RateTracker, counter_delta


@pytest.mark.parametrize("prev,cur,width,sat,expected", [
    (100, 250, 64, False, (150, "")),
    (0xFFFFFFF0, 0x10, 32, False, (0x20, WRAP)),                 # 32-bit wrap
    ((1 << 64) - 5, 10, 64, False, (15, WRAP)),                   # 64-bit wrap
    (18446743919241604546, 5, 64, False, ((1 << 64) - 18446743919241604546 + 5, WRAP)),  # procfs NFS value
    (5_000_000, 12, 64, False, (12, RESET)),                      # driver reload: rate from 0
    (0x7FFFFFF0, 3, 32, False, (3, RESET)),                       # a drop from the lower half is a reset
    (100, 0xFFFFFFFF, 32, True, (None, SATURATED)),               # IB counter stuck at its maximum
    (0xFFFF, 0xFFFF, 16, True, (None, SATURATED)),
    (200, 3, 8, True, (3, RESET)),                                # saturating counters never wrap
])
def test_counter_delta(prev: int, cur: int, width: int, sat: bool, expected: tuple[int | None, str]) -> None:
    assert counter_delta(prev, cur, width, sat) == expected


def test_tracker_rates_and_first_reading() -> None:
    t = RateTracker()
    assert t.update("x", 1000, 10.0).flag == FIRST
    d = t.update("x", 3000, 12.0)
    assert (d.delta, d.per_s, d.flag) == (2000, 1000.0, "")


def test_tracker_reset_is_never_negative() -> None:
    t = RateTracker()
    t.update("rx", 10**12, 0.0)
    d = t.update("rx", 500, 1.0)
    assert d.delta == 500 and d.per_s == 500.0 and d.flag == RESET


def test_tracker_saturated_reports_no_rate_then_recovers_after_clear() -> None:
    t = RateTracker()
    t.update("wait", 10, 0.0, width=32, saturating=True)
    d = t.update("wait", 0xFFFFFFFF, 1.0, width=32, saturating=True)
    assert d.per_s is None and d.flag == SATURATED
    assert t.update("wait", 0xFFFFFFFF, 2.0, width=32, saturating=True).flag == SATURATED
    d = t.update("wait", 7, 3.0, width=32, saturating=True)  # someone cleared the counters
    assert d.delta == 7 and d.flag == RESET


def test_tracker_absurd_rate_is_dropped() -> None:
    t = RateTracker()
    t.update("b", 0, 0.0)
    d = t.update("b", 10**15, 1.0, max_rate=400e9 / 8)
    assert d.per_s is None and d.flag == ABSURD


def test_tracker_same_time_gives_no_rate() -> None:
    t = RateTracker()
    t.update("b", 1, 5.0)
    assert t.update("b", 2, 5.0).per_s is None


def test_forget_missing_drops_unplugged_counters() -> None:
    t = RateTracker()
    t.update("a", 1, 0.0)
    t.update("b", 1, 0.0)
    t.forget_missing()
    t.update("a", 2, 1.0)
    t.forget_missing()
    assert len(t) == 1
