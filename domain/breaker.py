"""The circuit breaker's decision (pure): whether a route's recent failure rate is high enough
to pause its consumption (MassTransit's kill switch). The consumers feed it each batch's fates;
the runner pauses the route when it trips (consumers/breaker.py).

A failure is a delivery that was retried, dead-lettered, undecided or expired because the
handler could not apply it (a handler error, a TTR, an outage). What pkgq refused before or
without the handler's fault (bad input, an untrusted publisher, a broken domain rule, a data
error its own values cause, an unknown version, a message past its TTL) is left out by the
caller: it says nothing of the route, and anyone who can publish could otherwise pause it for
everyone. Duplicates, repeats, parked and cancelled messages are neither a failure nor a
success (nothing was tried), and a give-back is neither (it comes back)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from domain.delivery import Fate

FAILURES = frozenset({Fate.RETRIED, Fate.DEAD_LETTERED, Fate.UNDECIDED, Fate.EXPIRED})
COUNTED = FAILURES | {Fate.ACKED}
"""What the rate is taken over: what was tried, and either applied or not."""


@dataclass(frozen=True, slots=True)
class BreakerRule:
    failure_rate: float
    """Trip at this share of failures (0 < rate <= 1) ..."""
    min_deliveries: int
    """... over at least this many counted deliveries ..."""
    window_s: float
    """... within the last this many seconds."""


@dataclass(frozen=True, slots=True)
class Reading:
    counted: int
    failed: int

    @property
    def rate(self) -> float:
        return self.failed / self.counted if self.counted else 0.0

    def trips(self, rule: BreakerRule) -> bool:
        return self.counted >= rule.min_deliveries and self.rate >= rule.failure_rate


class FailureWindow:
    """Counted and failed deliveries of the last `window_s` seconds, in one-second buckets
    (`now`: any monotonic clock in seconds, given by the caller)."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._buckets: deque[tuple[int, int, int]] = deque()  # (second, counted, failed)

    def add(self, now: float, fates: Iterable[Fate]) -> None:
        counted = failed = 0
        for fate in fates:
            if fate in COUNTED:
                counted += 1
                failed += fate in FAILURES
        if not counted:
            return
        second = int(now)
        if self._buckets and self._buckets[-1][0] == second:
            _, c, f = self._buckets.pop()
            counted, failed = counted + c, failed + f
        self._buckets.append((second, counted, failed))

    def reading(self, now: float) -> Reading:
        while self._buckets and self._buckets[0][0] <= now - self._window_s:
            self._buckets.popleft()
        return Reading(sum(c for _, c, _ in self._buckets), sum(f for _, _, f in self._buckets))

    def clear(self) -> None:
        self._buckets.clear()
