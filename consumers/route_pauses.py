"""Each `pkgq run` obeys `pkgq route pause` / `resume`: the pause watch reads which routes are
paused (telecom.consumer_pauses) every PKGQ_PAUSE_POLL seconds, pauses this process's consumers
of those routes (every partition) and resumes the others. The state lives in Postgres, so
every replica obeys, and a restarted one starts paused (the runner has the watch read them
before it starts a consumer).

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
        self.paused: frozenset[str] = frozenset()
        """The paused routes as last read: kept through a Postgres outage."""

    async def run(self) -> None:
        while True:
            await self.round()
            await asyncio.sleep(self._every)

    async def read(self) -> frozenset[str]:
        """Read the paused routes (ending first the breaker's pauses whose time has come) into
        `paused`, the one way they are read. Raises if Postgres does not answer in time:
        `paused` then stays as last read."""
        async with asyncio.timeout(max(5.0, 2 * self._every)):
            async with self._pool.acquire() as conn:
                for route, after in self._resume_after.items():
                    await consumer_pauses.resume_breaker(conn, route, after)
                self.paused = frozenset(await consumer_pauses.paused(conn))
        return self.paused

    def holds(self, consumer: QueueConsumer) -> bool:
        """Whether a pause, as last read, holds the consumer (never one not `pausable`)."""
        return consumer.pausable and route_of_key(consumer.name) in self.paused

    async def round(self) -> None:
        """Read the paused routes once and make this process's consumers agree."""
        try:
            await self.read()
        except Exception as exc:  # noqa: BLE001  (an outage: keep the state last read)
            log.warning("pause_watch_failed", error=repr(exc), paused=sorted(self.paused))
            return
        await self._apply()

    async def _apply(self) -> None:
        """Pause the consumers a pause holds, resume the others (all at once: a pause waits
        for the consumer's batch in hand)."""
        changes = []
        for consumer in self._consumers:
            if not consumer.pausable:
                continue
            held = self.holds(consumer)
            if held and not consumer.paused:
                changes.append(consumer.pause())
            elif not held and consumer.paused:
                changes.append(consumer.resume())
            ROUTE_PAUSED.labels(route=route_of_key(consumer.name)).set(1 if held else 0)
        if changes:
            await asyncio.gather(*changes)
