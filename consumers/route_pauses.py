"""Each `pkgq run` obeys `pkgq route pause` / `resume`: the pause watch reads which routes are
paused (telecom.consumer_pauses) every PKGQ_PAUSE_POLL seconds, pauses this process's consumers
of those routes (every partition) and resumes the others. The state lives in Postgres, so
every replica obeys, and a restarted one starts paused (the runner asks before subscribing).

A Postgres outage changes nothing: the consumers keep the state last read (a paused route
stays paused; the others go on, and meet the outage in their own transactions).

The watch also ends a circuit breaker's pause once its `resume_after_s` has passed (every
replica may try; one DELETE wins, audited as `breaker`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import asyncpg
import structlog

from events.partitioning import route_of_key
from infra.observability import ROUTE_PAUSED
from infra.postgres import consumer_pauses
from infra.rabbit.consumer import QueueConsumer

log = structlog.get_logger(__name__)


async def paused_routes(pool: asyncpg.Pool) -> set[str]:
    async with pool.acquire() as conn:
        return set(await consumer_pauses.paused(conn))


class PauseWatch:
    def __init__(
        self,
        pool: asyncpg.Pool,
        consumers: Sequence[QueueConsumer],
        every: float,
        resume_after: Mapping[str, float] | None = None,
    ) -> None:
        """`consumers`: the runner's consumers (standby ones join the list later: it is read
        each round); those that are not `pausable` (the dead-letter ingester) are left alone.
        `resume_after`: routes whose circuit breaker's pause ends by itself, after how many
        seconds (consumers/breaker.py); an operator's pause never does."""
        self._pool = pool
        self._resume_after = dict(resume_after or {})
        self._consumers = consumers
        self._every = every

    async def run(self) -> None:
        while True:
            await self.round()
            await asyncio.sleep(self._every)

    async def round(self) -> None:
        """Read the paused routes once and make this process's consumers agree."""
        try:
            async with asyncio.timeout(max(5.0, 2 * self._every)):
                async with self._pool.acquire() as conn:
                    for route, after in self._resume_after.items():
                        await consumer_pauses.resume_breaker(conn, route, after)
                    paused = set(await consumer_pauses.paused(conn))
        except Exception as exc:  # noqa: BLE001  (an outage: keep the state last read)
            log.warning("pause_watch_failed", error=repr(exc))
            return
        await apply(self._consumers, paused)


async def apply(consumers: Sequence[QueueConsumer], paused: set[str]) -> None:
    """Pause the consumers of the routes in `paused`, resume the others (all at once: a pause
    waits for the consumer's batch in hand)."""
    changes = []
    for consumer in consumers:
        if not consumer.pausable:
            continue
        route = route_of_key(consumer.name)
        if route in paused and not consumer.paused:
            changes.append(consumer.pause())
        elif route not in paused and consumer.paused:
            changes.append(consumer.resume())
        ROUTE_PAUSED.labels(route=route).set(1 if route in paused else 0)
    if changes:
        await asyncio.gather(*changes)
