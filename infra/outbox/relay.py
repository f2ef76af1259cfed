"""The outbox relay: publish committed outbox rows to RabbitMQ, in order, at least once.

Each round is one Postgres transaction:
1. lease every free partition that has due rows (transaction-scoped advisory locks);
2. read the due rows of those partitions in id order (a later statement, so it sees the
   previous lease holder's commit);
3. publish them with confirms and `mandatory`: one user's rows one after another, different
   users concurrently; a user's chain stops at its first failure so nothing overtakes it;
4. mark the confirmed rows published, commit (which releases the leases).

A crash anywhere before the commit leaves the rows unpublished and they are sent again: the
consumers' inbox absorbs the duplicates. Rows of one user share a partition, and a partition
has one holder at a time, so two relays never interleave one user's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import defaultdict
from uuid import UUID

import asyncpg
import structlog
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_TRACEPARENT
from infra import tracing
from infra.observability import RELAY_LAG, RELAYED
from infra.outbox.housekeeping import housekeeping_forever
from infra.postgres import job_state, outbox
from infra.postgres.outbox import ClaimedRow
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.topology import declare_all, routing_key_for
from infra.settings import Settings
from infra.systemd_notify import Notifier
from infra.transient import is_transient

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "pkgq_outbox"


class Relay:
    def __init__(
        self,
        settings: Settings,
        pool: asyncpg.Pool,
        connection: AbstractRobustConnection,
        worker_id: UUID | None = None,
    ) -> None:
        """`worker_id`: the registered worker this relay runs in (Services.worker_id); its
        housekeeping jobs then run under leases (infra/outbox/housekeeping.py)."""
        self._settings = settings
        self._pool = pool
        self._connection = connection
        self._worker_id = worker_id
        self._wake = asyncio.Event()
        self._publisher: Publisher | None = None
        self._listener: asyncpg.Connection | None = None
        self.published = 0

    async def open(self) -> None:
        """Declare the topology (so every route is routable) and open the confirming channel."""
        channel = await self._connection.channel()
        await declare_all(channel, self._settings)
        await channel.close()
        self._publisher = await Publisher.open(self._connection, self._settings.exchange)

    async def ready(self) -> bool:
        """Publishing channel open and the Postgres pool usable (for /readyz)."""
        if self._publisher is None or not self._publisher.is_open:
            return False
        async with self._pool.acquire(timeout=2) as conn:
            return bool(await conn.fetchval("SELECT true"))

    async def run(self, stop: asyncio.Event) -> None:
        if self._publisher is None:
            await self.open()
        systemd = Notifier()
        systemd.start_watchdog()
        systemd.ready("relaying")
        sweeper = asyncio.create_task(
            housekeeping_forever(self._settings, self._pool, self._worker_id, stop),
            name="housekeeping",
        )
        pause = 0.5
        try:
            while not stop.is_set():
                await self._ensure_listener()
                self._wake.clear()  # before the round: a NOTIFY during it wakes the next one
                try:
                    sent = await self.relay_once()
                    pause = 0.5
                except Exception as exc:
                    # The rows are our own data, so there is no poison message to set aside:
                    # a failing round is logged and retried with back-off, never fatal.
                    if is_transient(exc):
                        log.warning("relay_round_failed", error=repr(exc), retry_in_s=pause)
                    else:
                        log.exception("relay_round_error", retry_in_s=pause)
                    await self._drop_listener()
                    await _wait(stop, pause)
                    pause = min(pause * 2, 30.0)
                    continue
                if sent >= self._settings.relay_batch_size:
                    continue  # more may be waiting
                await _wait_any(stop, self._wake, self._settings.relay_poll_interval)
        finally:
            systemd.stopping()
            await systemd.stop_watchdog()
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await self._drop_listener()
            if self._publisher is not None:
                with contextlib.suppress(Exception):
                    await self._publisher.close()

    async def relay_once(self) -> int:
        """One round: lease, claim, publish, mark. Returns how many rows were published."""
        assert self._publisher is not None
        async with self._pool.acquire() as conn, conn.transaction():
            partitions = await outbox.lease_partitions(conn, outbox.PARTITIONS)
            if not partitions:
                return 0
            rows = await outbox.claim_due(conn, partitions, self._settings.relay_batch_size)
            expired = [r for r in rows if r.expires_at is not None and r.ttl_ms == 0]
            if expired:
                await job_state.expire_rows(conn, expired)
                log.warning("expired_unpublished", count=len(expired))
                rows = [r for r in rows if r not in expired]
            done, failed, error = await self._publish(rows)
            await outbox.mark_published(conn, done)
            await outbox.mark_failed(conn, failed, error)
        if done:
            log.debug("relayed", published=len(done), failed=len(failed))
        self.published += len(done)
        return len(done)

    async def _publish(self, rows: list[ClaimedRow]) -> tuple[list[int], list[int], str]:
        chains: dict[UUID | None, list[ClaimedRow]] = defaultdict(list)
        for row in rows:
            chains[row.user_id].append(row)
        done: list[int] = []
        failed: list[int] = []
        errors: list[str] = []

        async def send_chain(chain: list[ClaimedRow]) -> None:
            assert self._publisher is not None
            for row in chain:
                incoming = row.headers.get(H_TRACEPARENT)
                with tracing.publishing(
                    row.route,
                    str(row.message_id),
                    incoming if isinstance(incoming, str) else None,
                    row.available_at,
                ) as traceparent:
                    headers = row.headers
                    if traceparent is not None and traceparent != incoming:
                        headers = {**row.headers, H_TRACEPARENT: traceparent}
                    message = build_message(
                        row.body,
                        message_id=row.message_id,
                        message_type=row.message_type,
                        headers=headers,
                        priority=row.priority,
                        expiration_ms=row.ttl_ms if row.expires_at is not None else None,
                    )
                    try:
                        await self._publisher.publish(
                            message, routing_key_for(self._settings, row.route, row.user_id)
                        )
                    except Exception as exc:  # noqa: BLE001  (the row stays pending: retried)
                        failed.append(row.id)
                        errors.append(repr(exc))
                        log.warning(
                            "publish_failed", message_id=str(row.message_id), error=repr(exc)
                        )
                        return
                done.append(row.id)
                RELAYED.inc()
                if row.available_at is not None:
                    RELAY_LAG.observe(max(0.0, time.time() - row.available_at.timestamp()))
                self._maybe_crash(len(done))

        await asyncio.gather(*(send_chain(c) for c in chains.values()))
        return done, failed, "; ".join(errors[:3])

    def _maybe_crash(self, confirmed_in_batch: int) -> None:
        limit = self._settings.fault_kill_relay_after
        if limit is not None and self.published + confirmed_in_batch >= limit:
            os.kill(os.getpid(), signal.SIGKILL)  # crash test: confirmed, not marked

    async def _ensure_listener(self) -> None:
        if self._listener is not None and not self._listener.is_closed():
            return
        try:
            self._listener = await asyncpg.connect(self._settings.postgres_dsn)
            await self._listener.add_listener(NOTIFY_CHANNEL, self._on_notify)
        except Exception as exc:  # noqa: BLE001  (polling covers for a missing listener)
            log.warning("listen_failed", error=repr(exc))
            self._listener = None

    async def _drop_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=2)
            self._listener = None

    def _on_notify(self, *_: object) -> None:
        self._wake.set()


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
