"""Draining parked messages: once a user's hold is lifted (its blocker applied, replayed and
applied, or discarded by an operator), the user's parked messages are applied one transaction
each, in order, until one fails (it becomes the new blocker) or none is left (the hold is
dropped)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from uuid import UUID

import structlog

from consumers.delivery.admission import Admission
from consumers.delivery.apply import (
    BLIP_RETRIES,
    Applier,
    ClaimRaceError,
    TimedOutError,
    pause_after_blip,
)
from consumers.delivery.decode import decode_all
from consumers.delivery.failures import Failures
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE
from events.routes import Route
from infra.postgres import holds, queue_repo, strikes, transitions
from infra.postgres.pool import Conn
from infra.transient import is_outage, is_transient

log = structlog.get_logger(__name__)

Connect = Callable[[], AbstractAsyncContextManager[Conn]]


class ParkingLot:
    """The parked messages of one route's consumer."""

    def __init__(
        self,
        route: Route,
        applier: Applier,
        failures: Failures,
        connect: Connect,
        *,
        max_body_bytes: int,
    ) -> None:
        self.route = route
        self.consumer = route.short_name
        self._applier = applier
        self._failures = failures
        self._connect = connect
        self._max_body_bytes = max_body_bytes
        self._polled_at = -1e9

    async def drain(self, user_id: UUID) -> int:
        """Apply the user's parked messages in order while the hold stays lifted."""
        applied = 0
        while True:
            try:
                if await self._drain_one(user_id):
                    applied += 1
                    continue
            except _ParkedTimedOutError as timed_out:
                # Rolled back, so still parked (it is not on the broker): count the strike,
                # and bury it once it has struck out.
                await self._strike(user_id, timed_out.parked, timed_out.raw, timed_out.error)
                return applied
            log.info("parked_drained_or_blocked", user_id=str(user_id), applied=applied)
            return applied

    async def _drain_one(self, user_id: UUID) -> bool:
        """Apply the user's first parked message. False: none left (the hold is dropped), or
        the hold is blocked again. A transaction that fails on something other than an outage
        (a blip that persists, a constraint the write-back broke) makes it the new blocker, as
        on the queue path: run again with that failure recorded as its own."""
        known: dict[int, Exception] = {}
        for attempt in range(BLIP_RETRIES + 1):
            try:
                return await self._drain_first(user_id, known)
            except _ParkedTimedOutError:
                raise
            except Exception as exc:
                if is_outage(exc) or known:
                    raise
                if (
                    is_transient(exc) or isinstance(exc, ClaimRaceError)
                ) and attempt < BLIP_RETRIES:
                    await pause_after_blip(attempt + 1)
                    continue
                log.warning("parked_failed_alone", user_id=str(user_id), error=repr(exc))
                known = {0: exc}
        return await self._drain_first(user_id, known)

    async def _drain_first(self, user_id: UUID, known: dict[int, Exception]) -> bool:
        async with self._connect() as conn, conn.transaction():
            await queue_repo.lock_user(conn, user_id)  # a batch's lock order: user, then hold
            hold = await holds.lock(conn, self.consumer, user_id)
            if hold is None or hold.blocker is not None:
                return False
            parked = await holds.pop_parked(conn, self.consumer, user_id)
            if parked is None:
                await holds.drop(conn, self.consumer, user_id)
                return False
            raw = RawDelivery(
                body=parked.body,
                message_id=str(parked.message_id),
                message_type=parked.message_type,
                content_type=CONTENT_TYPE,
                timestamp=None,
                headers=parked.headers,
            )
            # It decoded when parked; a newer pkgq may differ (then it is buried as bad input).
            ready, bad = decode_all(self.route, [(0, raw)], max_body_bytes=self._max_body_bytes)
            try:
                await self._applier.run(conn, ready, bad, known, Admission.FROM_PARKING)
            except TimedOutError as exc:
                raise _ParkedTimedOutError(parked, raw, exc) from exc  # rolls back the pop
            return True

    async def drain_lifted(self) -> int:
        """Apply what operators released (a discarded blocker) or a crash left half-drained.

        One user's trouble does not stop the others: a failing user goes to the back of the
        line (its hold's `updated_at` moves) and is tried again on the next round.

        Every partition consumer of the route calls this when idle; they share this lot, so
        it looks at most once a second however many partitions there are."""
        if time.monotonic() - self._polled_at < 1.0:
            return 0
        self._polled_at = time.monotonic()
        async with self._connect() as conn:
            users = await holds.releasing_users(conn, self.consumer)
        total = 0
        for user in users:
            try:
                total += await self.drain(user)
            except Exception as exc:  # noqa: BLE001  (logged; the next round tries again)
                log.warning("drain_failed", user_id=str(user), error=repr(exc))
                with contextlib.suppress(Exception):
                    async with self._connect() as conn:
                        await holds.touch(conn, self.consumer, user)
        return total

    async def _strike(
        self, user_id: UUID, parked: holds.ParkedMessage, raw: RawDelivery, exc: TimedOutError
    ) -> None:
        """A parked message ran past the TTR while being drained: the transaction was rolled
        back (it is still parked); count the strike, and bury it once it has struck out."""
        async with self._connect() as conn, conn.transaction():
            count = await strikes.strike(conn, self.consumer, parked.message_id)
            await transitions.count_one(conn, self.route.name, "ttr")
            if count < self._failures.policy.max_attempts:
                log.warning("ttr_exceeded_parked", user_id=str(user_id), strikes=count)
                return
            await queue_repo.lock_user(conn, user_id)  # the lock order of a batch: user, hold
            await holds.lock(conn, self.consumer, user_id)
            first = await holds.pop_parked(conn, self.consumer, user_id)
            if first is None or first.message_id != parked.message_id:
                return  # drained meanwhile by someone else
            ready, _ = decode_all(self.route, [(0, raw)], max_body_bytes=self._max_body_bytes)
            await self._failures.give_up(conn, ready[0].decoded, raw, exc.error, "ttr", None, count)


class _ParkedTimedOutError(Exception):
    def __init__(self, parked: holds.ParkedMessage, raw: RawDelivery, error: TimedOutError) -> None:
        super().__init__(str(error))
        self.parked = parked
        self.raw = raw
        self.error = error
