"""Draining: once a hold on a user is lifted, that user's parked messages are applied in order,
taken from the parking lot and decided by the same loop as a batch from the queue
(DeliveryPipeline._decide_all, Source.PARKING) until none is left or one fails again. Off the
way of a message whose user holds nothing back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING
from uuid import UUID

import structlog

from consumers.delivery.decode import BadDelivery, Delivery, decode_all
from domain.delivery import Fate, Source
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE
from events.routes import Route
from infra.postgres import batch_read, holds
from infra.postgres.pool import Conn
from infra.rabbit.consumer import Decided

log = structlog.get_logger(__name__)

DRAIN_PER_USER = 100
"""Parked messages of one user taken into one drain transaction."""


class Draining:
    """The drain half of consumers/delivery/pipeline.DeliveryPipeline (which sets these)."""

    consumer: str
    route: Route
    _max_body_bytes: int
    _polled_at: float

    if TYPE_CHECKING:

        def _connection(self) -> contextlib.AbstractAsyncContextManager[Conn]: ...

        async def _decide_all(
            self,
            items: Sequence[Delivery | BadDelivery],
            source: Source,
            parked: Mapping[int, int] | None = None,
        ) -> tuple[dict[int, Decided], set[UUID]]: ...

    async def _drain(self, users: set[UUID]) -> int:
        """Apply the parked messages of users whose hold was lifted, in order, while it stays
        lifted; a lifted hold with nothing left behind it is dropped. Returns how many were
        decided. One user's trouble never holds the others back: a drain that fails for
        several users is run again user by user, and only the failing one waits for the
        release poll."""
        total = 0
        while users:
            try:
                async with self._connection() as conn:
                    parked = await holds.first_parked(
                        conn, self.consumer, sorted(users), DRAIN_PER_USER
                    )
                empty = users - {p.user_id for p in parked}
                again = await self._drop_lifted_holds(empty) if empty else []
                if not parked:
                    users = set(again)  # something was parked for them meanwhile
                    continue
                raws = [
                    RawDelivery(
                        body=p.body,
                        message_id=str(p.message_id),
                        message_type=p.message_type,
                        content_type=CONTENT_TYPE,
                        timestamp=None,
                        headers=p.headers,
                    )
                    for p in parked
                ]
                # It decoded when parked; a newer pkgq may differ (then it is buried as bad).
                ready, bad = decode_all(self.route, raws, max_body_bytes=self._max_body_bytes)
                rows = {index: p.id for index, p in enumerate(parked)}
                decided, lifted = await self._decide_all([*ready, *bad], Source.PARKING, rows)
                users = set(lifted) | set(again)
            except Exception as exc:  # noqa: BLE001  (logged; the release poll tries again)
                if len(users) > 1:
                    alone = [await self._drain({user}) for user in sorted(users)]
                    return total + sum(alone)
                log.warning("drain_deferred", users=sorted(map(str, users)), error=repr(exc))
                with contextlib.suppress(Exception):
                    async with self._connection() as conn:
                        await holds.touch(conn, self.consumer, sorted(users))
                return total
            fates = [d.decision.fate for d in decided.values()]
            total += sum(1 for f in fates if f not in (Fate.GIVEN_BACK, Fate.UNDECIDED))
            if {Fate.GIVEN_BACK, Fate.UNDECIDED} & set(fates) or len(fates) < len(raws):
                return total  # cut short (a TTR strike, a rival drain): the poll comes back
        return total

    async def _drop_lifted_holds(self, users: set[UUID]) -> list[UUID]:
        """Drop the lifted holds of these users that have nothing parked behind them (in the
        lock order of a batch: the users' rows, then their holds). Returns the users that do
        have something parked (it came meanwhile)."""
        async with self._connection() as conn, conn.transaction():
            await batch_read.lock_users(conn, users)
            held = await holds.lock_many(conn, self.consumer, sorted(users))
            lifted = [user for user, hold in held.items() if hold.blocker is None]
            return await holds.drop_lifted(conn, self.consumer, lifted)

    async def drain_parked(self) -> int:
        """The consumer's idle task: drain the users whose holds were lifted meanwhile (by an
        operator's discard, or a drain a crash cut short). Every partition consumer of the
        route calls this when idle; it looks at most once a second."""
        if time.monotonic() - self._polled_at < 1.0:
            return 0
        self._polled_at = time.monotonic()
        async with self._connection() as conn:
            users = await holds.releasing_users(conn, self.consumer)
        return await self._drain(set(users))
