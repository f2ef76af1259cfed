"""The circuit breaker's decision: a failure rate over a window of counted deliveries."""

from __future__ import annotations

from domain.breaker import BreakerRule, FailureWindow
from domain.delivery import Fate

RULE = BreakerRule(failure_rate=0.5, min_deliveries=4, window_s=60)


def test_it_trips_at_the_rate_once_enough_deliveries_were_counted() -> None:
    window = FailureWindow(RULE.window_s)
    window.add(0, [Fate.DEAD_LETTERED, Fate.RETRIED, Fate.DEAD_LETTERED])
    assert not window.reading(0).trips(RULE)  # 3 of 3 failed, but fewer than 4 counted
    window.add(1, [Fate.ACKED])
    reading = window.reading(1)
    assert (reading.counted, reading.failed) == (4, 3)
    assert reading.trips(RULE)


def test_it_stays_closed_below_the_rate() -> None:
    window = FailureWindow(RULE.window_s)
    window.add(0, [Fate.ACKED, Fate.ACKED, Fate.ACKED, Fate.DEAD_LETTERED])
    assert window.reading(0).rate == 0.25
    assert not window.reading(0).trips(RULE)


def test_what_nothing_was_tried_on_is_not_counted() -> None:
    window = FailureWindow(RULE.window_s)
    window.add(
        0, [Fate.DUPLICATE, Fate.PARKED, Fate.CANCELLED, Fate.GIVEN_BACK, Fate.DEAD_LETTERED]
    )
    assert (window.reading(0).counted, window.reading(0).failed) == (1, 1)


def test_failures_older_than_the_window_are_forgotten() -> None:
    window = FailureWindow(RULE.window_s)
    window.add(0, [Fate.DEAD_LETTERED] * 10)
    window.add(30, [Fate.ACKED] * 4)
    assert window.reading(59).trips(RULE)
    reading = window.reading(61)
    assert (reading.counted, reading.failed) == (4, 0)
    assert not reading.trips(RULE)


def test_a_cleared_window_starts_afresh() -> None:
    window = FailureWindow(RULE.window_s)
    window.add(0, [Fate.DEAD_LETTERED] * 10)
    window.clear()
    assert window.reading(0).counted == 0
