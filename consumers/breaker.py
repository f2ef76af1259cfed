"""The circuit breaker of one route in one `pkgq run` process (PKGQ_BREAKER, or a route's
`breaker` in PKGQ_ROUTES_FILE): it watches the fates of the route's batches and, when the
decision (domain/breaker.py) trips, pauses the route as an operator would
(telecom.consumer_pauses, `automatic`), so every replica's pause watch stops consuming it within
PKGQ_PAUSE_POLL seconds and its messages wait on the broker in order.

Reset: `pkgq route resume` or the console (audited), or by itself after `resume_after_s` when
set (consumers/route_pauses.py); it trips again if the failures go on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import asyncpg
import structlog

from domain.breaker import FAILURES, BreakerRule, FailureWindow, Reading
from events.decoding import RawDelivery
from infra.observability import BREAKER_TRIPS
from infra.postgres import consumer_pauses
from infra.rabbit.consumer import Decided, Processor
from infra.route_config import BreakerSettings

log = structlog.get_logger(__name__)


def rule_of(settings: BreakerSettings) -> BreakerRule:
    return BreakerRule(settings.failure_rate, settings.min_deliveries, settings.window_s)


class Breaker:
    def __init__(
        self, pool: asyncpg.Pool, route: str, settings: BreakerSettings, worker: str
    ) -> None:
        self._pool = pool
        self._route = route
        self._rule = rule_of(settings)
        self._who = f"breaker@{worker}"
        self._window = FailureWindow(settings.window_s)
        self._tripping: asyncio.Task[None] | None = None

    def wrap(self, processor: Processor) -> Processor:
        """`processor`, whose batches' fates the breaker watches."""

        async def watched(raws: Sequence[RawDelivery]) -> list[Decided]:
            results = await processor(raws)
            self.observe(results)
            return results

        return watched

    def observe(self, results: Sequence[Decided]) -> None:
        now = time.monotonic()
        # What pkgq refused (bad input, an untrusted publisher, a domain rule, an unknown
        # version, an expired message) is no failure of the route: it is left out entirely.
        decisions = [r.decision for r in results]
        self._window.add(
            now, (d.fate for d in decisions if d.counts_against_route or d.fate not in FAILURES)
        )
        reading = self._window.reading(now)
        if self._tripping is None and reading.trips(self._rule):
            self._tripping = asyncio.create_task(self._trip(reading), name="breaker-trip")

    async def _trip(self, reading: Reading) -> None:
        rule = self._rule
        reason = (
            f"circuit breaker: {reading.failed} of {reading.counted} deliveries failed in the "
            f"last {rule.window_s:g} s ({reading.rate:.0%} >= {rule.failure_rate:.0%})"
        )
        try:
            async with self._pool.acquire() as conn:
                paused = await consumer_pauses.pause(
                    conn, self._route, self._who, reason, automatic=True
                )
        except Exception as exc:  # noqa: BLE001  (the next batch's reading tries again)
            log.warning("breaker_trip_failed", route=self._route, error=repr(exc))
        else:
            self._window.clear()  # resumed later, it judges what comes after
            if paused:
                BREAKER_TRIPS.labels(route=self._route).inc()
                log.warning("breaker_tripped", route=self._route, reason=reason)
        finally:
            self._tripping = None
