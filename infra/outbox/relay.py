"""The outbox relay: publish committed outbox rows to RabbitMQ, in order, at least once.

Each round is one Postgres transaction:
1. lease free partitions that have due rows (transaction-scoped advisory locks), at most
   LEASE_LIMIT of them, so that another round can lease the rest;
2. read the due rows of those partitions in id order (a later statement, so it sees the
   previous lease holder's commit);
3. publish them with confirms and `mandatory`: every user's chain at once, so a round has as
   many publishes in flight on the channel as it has users, but within a chain a row is sent
   only after the row before it is confirmed; a chain stops at its first failure;
4. mark the confirmed rows published, commit (which releases the leases).

While a round waits for its confirms, `run` starts the next one (ROUNDS_IN_FLIGHT), which
leases other partitions: its claim and publishes overlap the first round's, and the first
round's mark and commit overlap its publishes.

A crash anywhere before the commit leaves the rows unpublished and they are sent again: the
consumers' inbox absorbs the duplicates. Rows of one user share a partition, and a partition
has one holder at a time (two rounds of one relay are two transactions, like two relays), so
nothing ever interleaves one user's events.

Why a user's next row waits for the previous row's confirm: infra/outbox/chains.py.

A channel that failed a publish is never used again (a partitioned node can leave a channel
open that confirms nothing, for ever): a confirm that does not come within
PKGQ_RELAY_CONFIRM_TIMEOUT, a nack or a closed channel ends the round, and the next round waits
for a fresh channel (after a timeout, a fresh connection too, through the node list or the load
balancer: infra/rabbit/connection.py). So while the broker is healthy no row waits longer than
one confirm timeout plus a reconnect. A watchdog counts the relay stalled after
PKGQ_RELAY_STALL_AFTER seconds without a healthy round (metric, /readyz, an error log) and
reconnects it.

A round that fails (Postgres or the broker away, a bug) leaves its rows due, and the next
round comes after a pause: FIRST_ROUND_PAUSE_S, doubling up to 2 s (OUTAGE_LONGEST_PAUSE_S),
cut short when the process's probe finds the database back or `stop` is set; for as long as
rounds fail (the rows are pkgq's own data: there is nothing to set aside). A channel that
cannot be renewed yet is tried again after renewal.RENEW_RETRY_PAUSES (0.25 s to 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import structlog
from aio_pika.abc import AbstractRobustConnection

from infra.dependencies import POSTGRES, RABBITMQ, dependencies
from infra.observability import RELAY_RENEWALS, RELAY_STALLED, RELAYED
from infra.outbox import chains, renewal
from infra.outbox.housekeeping import housekeeping_forever
from infra.outbox.listener import OutboxListener
from infra.postgres import job_state, outbox
from infra.postgres.outbox import ClaimedRow
from infra.postgres.pool import forget_if_demoted
from infra.rabbit.connection import reconnect
from infra.rabbit.publisher import Publisher
from infra.rabbit.setting_up import through_outages
from infra.rabbit.topology import declare_all
from infra.settings import Settings
from infra.systemd_notify import Notifier
from infra.transient import (
    OUTAGE_LONGEST_PAUSE_S,
    OutagePauses,
    StoppingError,
    dependency_of,
    is_transient,
    needs_operator,
)

log = structlog.get_logger(__name__)

FIRST_ROUND_PAUSE_S = 0.5
"""The pause after a failed round; it doubles while the failure lasts, up to 2 s."""

ROUNDS_IN_FLIGHT = 2
"""Rounds one relay runs at once while there is a backlog. Each round holds its own leases."""
LEASE_LIMIT = outbox.PARTITIONS // ROUNDS_IN_FLIGHT
"""Partitions one round leases at most: the rest stay free for the next round (or relay)."""


@dataclass(frozen=True, slots=True)
class RoundResult:
    published: int
    more: bool
    """The round was full (a whole batch, or LEASE_LIMIT partitions) and nothing in it failed:
    more rows are probably due, so go on at once rather than wait for a NOTIFY or the poll."""


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
        self._listener = OutboxListener(settings, self._wake)
        self._renew: str | None = None
        """Set when a publish failed: "channel" or "connection", what to replace before the
        next round."""
        self._renew_failures = 0
        self._healthy_at = time.monotonic()
        self.stalled = False
        self.published = 0

    async def open(self) -> None:
        """Declare the topology (so every route is routable) and open the confirming channel."""
        channel = await self._connection.channel()
        try:
            await declare_all(channel, self._settings)
        finally:
            with contextlib.suppress(Exception):  # bounded: the connection may be gone
                await asyncio.wait_for(channel.close(), timeout=2)
        await self._open_publisher()

    async def _open_publisher(self) -> None:
        self._publisher = await Publisher.open(
            self._connection,
            self._settings.exchange,
            user_id=self._settings.amqp_user,
            confirm_timeout=self._settings.relay_confirm_timeout,
        )

    def ready(self) -> bool:
        """Publishing channel open and the relay not stalled (for /readyz, which asks Postgres
        on connections of its own: a probe must not take one of the relay's)."""
        return self._publisher is not None and self._publisher.is_open and not self.stalled

    async def run(self, stop: asyncio.Event) -> None:
        if self._publisher is None:  # a connection lost meanwhile is waited out
            try:
                await through_outages(self._connection, self.open, stop, what="relay publisher")
            except StoppingError:
                return
        systemd = Notifier()
        systemd.start_watchdog()
        systemd.ready("relaying")
        sweeper = asyncio.create_task(
            housekeeping_forever(self._settings, self._pool, self._worker_id, stop),
            name="housekeeping",
        )
        watchdog = asyncio.create_task(self._watch(stop), name="relay-watchdog")
        try:
            await self._relay_until(stop)
        finally:
            systemd.stopping()
            await systemd.stop_watchdog()
            for task in (sweeper, watchdog):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self._listener.drop()
            if self._publisher is not None:
                with contextlib.suppress(Exception):
                    await self._publisher.close()

    async def _relay_until(self, stop: asyncio.Event) -> None:
        """Rounds until `stop`: back to back, up to ROUNDS_IN_FLIGHT at once, while rows keep
        coming; otherwise one, then a wait for a NOTIFY or the poll interval."""
        in_flight: list[asyncio.Task[RoundResult]] = []
        more = False
        # capped short: once the network is back the next round comes within 2 s
        pauses = OutagePauses(FIRST_ROUND_PAUSE_S, OUTAGE_LONGEST_PAUSE_S)
        try:
            while not stop.is_set():
                if not in_flight:
                    if self._renew is not None and not await self._renewed(stop):
                        continue
                    await self._listener.ensure()
                    # Cleared before a wave of rounds, not before each: a NOTIFY while any of
                    # them runs may be for rows none of them saw, and must wake the next wave.
                    self._wake.clear()
                    more = False
                claimed: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
                in_flight.append(asyncio.create_task(self._round(claimed.set_result)))
                waiters: list[asyncio.Future[Any]] = [claimed, in_flight[-1]]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                full = claimed.done() and claimed.result()
                claimed.cancel()  # still pending only if the round failed before its claim
                if full and len(in_flight) < ROUNDS_IN_FLIGHT:
                    continue  # a backlog: lease the next partitions while this round publishes
                # With the newest round busy on a full claim, wait for the oldest only.
                awaited, in_flight = (in_flight[:1], in_flight[1:]) if full else (in_flight, [])
                results = await asyncio.gather(*awaited, return_exceptions=True)
                errors = [r for r in results if isinstance(r, BaseException)]
                more = more or any(isinstance(r, RoundResult) and r.more for r in results)
                if errors:
                    # The rows are our own data, so there is no poison message to set aside:
                    # a failing round is logged and retried with back-off, never fatal.
                    await asyncio.gather(*in_flight, return_exceptions=True)
                    in_flight = []
                    await forget_if_demoted(self._pool, errors[0])
                    self._log_round_error(errors[0], pauses.current)
                    if is_transient(errors[0]):
                        dependencies().down(
                            dependency_of(errors[0]),
                            errors[0],
                            f"rows stay due; next round within {pauses.current:g} s",
                            "relay",
                        )
                    await self._listener.drop()
                    # Cut short when the process's probe finds Postgres back (a failover).
                    await pauses.wait(errors[0], stop)
                    continue
                if self._renew is not None:
                    # A publish failed: finish the rounds under way, then wait for a fresh
                    # channel (at the top of the loop) rather than fail row after row.
                    await asyncio.gather(*in_flight, return_exceptions=True)
                    in_flight = []
                    await renewal.wait(stop, renewal.RENEW_PAUSE)
                    continue
                pauses.reset()
                dependencies().up(POSTGRES, "relay")
                dependencies().up(RABBITMQ, "relay")
                self._healthy()
                if in_flight or more:
                    continue
                await renewal.wait_any(stop, self._wake, self._settings.relay_poll_interval)
        finally:
            # A round holds leases and unmarked confirms: let it finish, never abandon it.
            await asyncio.gather(*in_flight, return_exceptions=True)

    def _healthy(self) -> None:
        self._healthy_at = time.monotonic()
        if self.stalled:
            self.stalled = False
            RELAY_STALLED.set(0)
            log.info("relay_recovered")

    async def _watch(self, stop: asyncio.Event) -> None:
        """Count the relay stalled when no round has been healthy for relay_stall_after
        seconds: say so (metric, /readyz, an error), and reconnect to the broker, once per
        period, in case what hangs is the connection itself."""
        limit = self._settings.relay_stall_after
        reconnected_at = 0.0
        while not stop.is_set():
            await renewal.wait(stop, min(1.0, limit / 4))
            now = time.monotonic()
            silent = now - self._healthy_at
            if silent < limit:
                continue
            if not self.stalled:
                self.stalled = True
                RELAY_STALLED.set(1)
            if now - reconnected_at >= limit:
                reconnected_at = now
                log.error("relay_stalled", silent_s=round(silent), action="reconnect")
                self._renew = "connection"
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(reconnect(self._connection), timeout=limit)

    async def _renewed(self, stop: asyncio.Event) -> bool:
        """Renew the publisher; if the broker cannot give a channel yet (its connection is
        still reconnecting after a restart or a lost node), say so and pause briefly instead
        of failing the relay: it tries again on the next turn of the loop. Anything else (a
        missing exchange, a refused permission) ends the relay as before, so that its restart
        declares the topology again or an operator is told."""
        try:
            await self._renew_publisher()
        except Exception as exc:
            if not renewal.broker_unavailable(exc, self._connection):
                raise
            pause = renewal.RENEW_RETRY_PAUSES[
                min(self._renew_failures, len(renewal.RENEW_RETRY_PAUSES) - 1)
            ]
            self._renew_failures += 1
            log.warning("relay_renewal_failed", kind=self._renew, error=repr(exc), retry_in_s=pause)
            await renewal.wait(stop, pause)
            return False
        self._renew_failures = 0
        return True

    async def _renew_publisher(self) -> None:
        """Replace the publishing channel after a failed publish (and the connection, after a
        confirm that never came): never publish on a channel that stopped confirming."""
        kind, self._renew = self._renew, None
        if self._renew_failures == 0:  # counted once per renewal, not once per retry
            RELAY_RENEWALS.labels(kind=kind).inc()
            log.warning("relay_channel_renewed", kind=kind)
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._publisher.close(), timeout=2)
            self._publisher = None
        try:
            if kind == "connection":
                await asyncio.wait_for(reconnect(self._connection), timeout=renewal.CONNECT_WAIT)
                kind = "channel"  # a new connection is made: a retry only needs a channel
            await asyncio.wait_for(self._open_publisher(), timeout=renewal.CONNECT_WAIT)
        except Exception:
            # Not yet: try again, keeping a connection renewal the watchdog asked for meanwhile.
            self._renew = "connection" if "connection" in (kind, self._renew) else kind
            raise

    @staticmethod
    def _log_round_error(error: BaseException, retry_in_s: float) -> None:
        if needs_operator(error):  # a missing grant: rows wait, and someone must know
            log.error("relay_round_failed", error=repr(error), retry_in_s=retry_in_s)
        elif is_transient(error):
            # the first of an outage; then the dependency report warns at a slowing rate
            first = retry_in_s <= FIRST_ROUND_PAUSE_S
            (log.warning if first else log.debug)(
                "relay_round_failed", error=repr(error), retry_in_s=retry_in_s
            )
        else:
            log.error("relay_round_error", exc_info=error, retry_in_s=retry_in_s)

    async def relay_once(self) -> int:
        """One round: lease, claim, publish, mark. Returns how many rows were published."""
        return (await self._round()).published

    async def _round(self, on_claimed: Callable[[bool], object] | None = None) -> RoundResult:
        """One round. `on_claimed(full)` is called once the round holds its rows: `full` if it
        claimed a whole batch or leased LEASE_LIMIT partitions (more are probably due)."""
        assert self._publisher is not None
        batch_size = self._settings.relay_batch_size
        async with self._pool.acquire() as conn, conn.transaction():
            partitions = await outbox.lease_partitions(conn, LEASE_LIMIT)
            rows = await outbox.claim_due(conn, partitions, batch_size) if partitions else []
            full = len(rows) >= batch_size or len(partitions) >= LEASE_LIMIT
            if on_claimed is not None:
                on_claimed(full)
            if not rows:
                return RoundResult(0, more=full)
            expired = [r for r in rows if r.expires_at is not None and r.ttl_ms == 0]
            if expired:
                await job_state.expire_rows(conn, expired, self._settings.amqp_user)
                log.warning("expired_unpublished", count=len(expired))
                rows = [r for r in rows if r not in expired]
            done, failed, error = await self._publish(rows)
            await outbox.mark_published(conn, done)
            await outbox.mark_failed(conn, failed, error)
        if done:
            RELAYED.inc(len(done))
            log.debug("relayed", published=len(done), failed=len(failed))
        self.published += len(done)
        return RoundResult(len(done), more=full and not failed)

    async def _publish(self, rows: list[ClaimedRow]) -> tuple[list[int], list[int], str]:
        """Publish a round's rows, each user's chain in order (infra/outbox/chains.py)."""
        return await chains.publish_in_chains(
            rows, self._send, lambda: self._renew is not None, self._publish_failed
        )

    def _publish_failed(self, exc: BaseException) -> None:
        self._renew = renewal.renewal_for(exc, self._renew)

    async def _send(self, row: ClaimedRow) -> None:
        """Publish one row and return once it is confirmed (raise if it is not)."""
        assert self._publisher is not None
        await chains.send_row(self._publisher, self._settings, row)
