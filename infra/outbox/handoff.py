"""The hand-off: a batch's follow-up events published by the process that committed them, right
after the commit, with the relay as the fallback.

Through the relay, a follow-up waits for the relay's wake (a NOTIFY at the commit), a round's
lease and claim, and only then is published. A batch that hands its follow-ups off publishes
them itself as soon as it has committed, on a confirming channel of its own process, and marks
them published in one statement (`outbox.settle_handed`). What the relay guarantees still holds:

- A user's order. The insert hands a user's rows off only if none of the user's earlier rows is
  unpublished (read under the user's lock, which every writer of a user's follow-ups holds:
  `outbox.enqueue_part`), and all of them or none (`outbox.handoff_wanted`). The relay leaves a
  handed-off row, and every later row of its user, alone until it is published or its
  `handed_until` has passed (`outbox.claim_due`). Within a hand-off each user's rows go in
  order, each after the one before is confirmed, and a chain stops at its first failure, as in
  the relay.
- Nothing lost. The rows are committed before they are handed off. A failed publish, and a row
  not sent in time, go back to the relay at once (the settle wakes it); a process that dies
  leaves its rows to the relay when their time runs out.
- Never sent once the relay may take it. The process sends a row only before its deadline:
  from a moment before the batch's transaction began (whose clock sets `handed_until`),
  PKGQ_HANDOFF_S less MARGIN_S. A row both sent (a confirm lost, a settle that failed) reaches
  the consumers twice; their inbox drops the copy, which comes after the first.
- A route's pause waits for the batches under way and for the rows they handed off
  (`outbox.pause_route`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from uuid import UUID, uuid4

import asyncpg
import structlog
from aio_pika.abc import AbstractRobustConnection

from infra.observability import HANDED_OFF
from infra.outbox.sending import send_row
from infra.postgres import outbox
from infra.postgres.outbox import ClaimedRow, HandedRow
from infra.rabbit.connection import open_amqp
from infra.rabbit.publisher import Publisher, PublishFailedError
from infra.settings import Settings

log = structlog.get_logger(__name__)

MARGIN_S = 1.0
"""How long before a row's `handed_until` its process stops sending it (at most half the
window): room for the two clocks' moments, the process's taken before the transaction began."""
CLOSE_WAIT_S = 5.0
"""How long closing waits for hand-offs under way (the rest goes to the relay in time)."""


class Handoff:
    """The hand-offs of one process (every route's pipeline shares it)."""

    def __init__(
        self,
        settings: Settings,
        pool: asyncpg.Pool,
        connection: AbstractRobustConnection | None = None,
    ) -> None:
        """`connection`: the broker connection to publish on; None, one of its own, opened
        when first needed. A process's consumers should not share theirs: the broker stops
        reading a publishing connection during a resource alarm, and their acks, which let it
        drain the queues, would stop with it."""
        self.window = settings.handoff_s
        self.limit = settings.handoff_max_rows
        self.in_flight = 0
        """Rows handed off to this process and not yet settled."""
        self._settings = settings
        self._pool = pool
        self._connection = connection
        self._owned: AbstractRobustConnection | None = None
        self._publisher: Publisher | None = None
        self._opening = asyncio.Lock()
        self._tasks: set[asyncio.Task[list[int]]] = set()
        self.identity = uuid4()
        """This process's, in the rows handed off to it (outbox `handed_by`)."""
        self._tails: dict[UUID, asyncio.Future[bool]] = {}
        """Per user with rows under way here: whether the latest of them were all published
        (set once their confirms are in). A later hand-off of the user's rows waits for it."""

    def deadline(self, began: float) -> float:
        """The last moment (time.monotonic) to send rows handed off by a transaction that began
        after `began`."""
        return began + self.window - min(MARGIN_S, self.window / 2)

    def room(self) -> int:
        """How many more rows a batch may hand off now (PKGQ_HANDOFF_MAX_ROWS less those under
        way). A burst beyond it goes through the relay, whose process publishes on another
        core while this one consumes: handing off every row of a burst made this process
        the bottleneck (docs/explanation/performance.md)."""
        return max(0, self.limit - self.in_flight)

    def reserve(self, rows: Sequence[HandedRow]) -> Reservation:
        """Take the rows' places behind the rows of the same users handed off here before.
        Called inside the batch's transaction, under its users' locks, so the places are in the
        order the users' transactions commit; then `hand` after the commit, or `drop` if it
        failed."""
        loop = asyncio.get_running_loop()
        before: dict[UUID, asyncio.Future[bool]] = {}
        after: dict[UUID, asyncio.Future[bool]] = {}
        for user in {r.message.user_id for r in rows if r.message.user_id is not None}:
            if (tail := self._tails.get(user)) is not None:
                before[user] = tail
            after[user] = self._tails[user] = loop.create_future()
        return Reservation(list(rows), before, after)

    def hand(self, reservation: Reservation, deadline: float) -> None:
        """Publish the reserved rows, now committed, in the background; settle them when done.
        A user's rows go after the user's rows handed off here before (the insert let them be
        handed off behind those: `outbox.enqueue_part`), and only if those were published."""
        rows = reservation.rows
        self.in_flight += len(rows)
        task = asyncio.get_running_loop().create_task(
            self._publish_counted(rows, deadline, reservation.before, reservation.after)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def drop(self, reservation: Reservation) -> None:
        """The batch did not commit: its places pass on what came before them."""
        for user, place in reservation.after.items():
            earlier = reservation.before.get(user)
            if earlier is None:
                self._settle_place(user, place, True)
            else:
                earlier.add_done_callback(partial(self._pass_on, user, place))

    def _pass_on(
        self, user: UUID, place: asyncio.Future[bool], earlier: asyncio.Future[bool]
    ) -> None:
        self._settle_place(user, place, not earlier.cancelled() and earlier.result())

    def _settle_place(self, user: UUID, place: asyncio.Future[bool], published: bool) -> None:
        if not place.done():
            place.set_result(published)
        self._forget(user, place)

    def _forget(self, user: UUID, place: asyncio.Future[bool]) -> None:
        if self._tails.get(user) is place and place.done():
            del self._tails[user]

    async def _publish_counted(
        self,
        rows: list[HandedRow],
        deadline: float,
        before: dict[UUID, asyncio.Future[bool]],
        after: dict[UUID, asyncio.Future[bool]],
    ) -> list[int]:
        try:
            return await self.publish(rows, deadline, before, after)
        finally:
            self.in_flight -= len(rows)
            for user, place in after.items():
                self._settle_place(user, place, False)  # if its chain did not say already

    async def publish(
        self,
        rows: list[HandedRow],
        deadline: float,
        before: dict[UUID, asyncio.Future[bool]] | None = None,
        after: dict[UUID, asyncio.Future[bool]] | None = None,
    ) -> list[int]:
        """Publish the rows, each user's in order (after `before[user]` says the user's rows
        handed off earlier were published; `after[user]` then says whether these were), then
        mark the published ones and give the rest back to the relay. Returns the ids
        published. Never raises."""
        published: list[int] = []
        error: str | None = None
        try:
            publisher = await self._open()
            published, error = await self._send(
                publisher, rows, deadline, before or {}, after or {}
            )
        except Exception as exc:  # noqa: BLE001  (the rows go back to the relay)
            error = repr(exc)
        done = set(published)
        given_back = [r.id for r in rows if r.id not in done]
        HANDED_OFF.labels(outcome="published").inc(len(published))
        if given_back:
            HANDED_OFF.labels(outcome="given_back").inc(len(given_back))
            log.warning("handoff_given_back", rows=len(given_back), error=error)
        try:
            async with self._pool.acquire() as conn:
                await outbox.settle_handed(conn, published, given_back, error)
        except Exception as exc:  # noqa: BLE001  (the relay takes the rows when their time runs out)
            log.warning(
                "handoff_settle_failed", published=len(published), rows=len(rows), error=repr(exc)
            )
        return published

    async def _open(self) -> Publisher:
        async with self._opening:  # one channel, however many hand-offs ask at once
            return await self._open_once()

    async def _open_once(self) -> Publisher:
        if self._publisher is None or not self._publisher.is_open:
            wait = self._settings.relay_confirm_timeout
            connection = self._connection or self._owned
            if connection is None:
                connection = self._owned = await asyncio.wait_for(
                    open_amqp(self._settings, "pkgq-handoff"), timeout=wait
                )
            self._publisher = await asyncio.wait_for(
                Publisher.open(
                    connection,
                    self._settings.exchange,
                    user_id=self._settings.amqp_user,
                    confirm_timeout=self._settings.relay_confirm_timeout,
                ),
                timeout=wait,
            )
        return self._publisher

    async def _send(
        self,
        publisher: Publisher,
        rows: list[HandedRow],
        deadline: float,
        before: dict[UUID, asyncio.Future[bool]],
        after: dict[UUID, asyncio.Future[bool]],
    ) -> tuple[list[int], str | None]:
        chains: dict[UUID | None, list[HandedRow]] = defaultdict(list)
        for row in rows:
            chains[row.message.user_id].append(row)
        published: list[int] = []
        errors: list[str] = []

        async def send_chain(user: UUID | None, chain: list[HandedRow]) -> None:
            sent = 0
            if user is None or await _published_before(before.get(user), deadline):
                sent = await send_rows(chain)
            if user is not None and (done := after.get(user)) and not done.done():
                done.set_result(sent == len(chain))

        async def send_rows(chain: list[HandedRow]) -> int:
            for sent, row in enumerate(chain):
                if time.monotonic() > deadline or self._publisher is not publisher:
                    return sent  # late, or the channel failed: the rest goes back to the relay
                try:
                    await send_row(publisher, self._settings, _claimed(row))
                except Exception as exc:  # noqa: BLE001  (this row and the rest go back)
                    errors.append(repr(exc))
                    if not (isinstance(exc, PublishFailedError) and exc.returned):
                        await self._drop(publisher)  # never publish on it again
                    return sent
                published.append(row.id)
            return len(chain)

        await asyncio.gather(*(send_chain(u, c) for u, c in chains.items()))
        return published, "; ".join(errors[:3]) or None

    async def _drop(self, publisher: Publisher) -> None:
        if self._publisher is publisher:
            self._publisher = None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(publisher.close(), timeout=2)

    async def close(self) -> None:
        """Wait a little for hand-offs under way, then close the channel."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=CLOSE_WAIT_S)
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._publisher.close(), timeout=2)
            self._publisher = None
        if self._owned is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._owned.close(), timeout=2)
            self._owned = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """A batch's handed-off rows and their users' places (Handoff.reserve)."""

    rows: list[HandedRow]
    before: dict[UUID, asyncio.Future[bool]]
    """Per user: whether the user's rows handed off here before were all published."""
    after: dict[UUID, asyncio.Future[bool]]
    """Per user: whether these were (for the user's next rows)."""


async def _published_before(earlier: asyncio.Future[bool] | None, deadline: float) -> bool:
    """Whether the user's rows handed off here before were all published (True if there are
    none), waiting for them until `deadline` at most."""
    if earlier is None:
        return True
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            return await asyncio.shield(earlier)
    except TimeoutError:
        return False


def _claimed(row: HandedRow) -> ClaimedRow:
    message = row.message
    return ClaimedRow(
        id=row.id,
        message_id=message.message_id,
        route=message.route,
        message_type=message.message_type,
        user_id=message.user_id,
        body=message.body,
        headers=message.headers,
        priority=message.priority,
        seq=message.seq,
    )
