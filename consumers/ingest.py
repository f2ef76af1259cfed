"""The dead-letter ingester: files what reaches `telecom.dlx` in the dead-letter store, in the
form consumers/dead_letter_forms.py gives it (three kinds of message arrive there: the broker's
dead letters, pkgq's last-resort copies, and unroutable commands). Each is stored in one
statement and then acked; a redelivery updates the same row (never its body). Headers are data:
whatever their type, size or depth, a dead letter is filed, in a safe form (no headers) if
Postgres refuses it as it is, and acked. The ingester never requeues a message because of what
it carries.

Failures while filing (docs/explanation/retries.md):
- an outage (Postgres unreachable, no pooled connection within 10 s) is raised at once: the
  consumer's one loop (infra/transient.until_done) tries the delivery again and waits the
  outage out, and it is filed as it is afterwards;
- a blip while filing a letter in full (finishing its job too: a deadlock with a worker
  finishing the same job, a serialization failure) runs the whole filing again: FILING_TRIES
  tries at most, after the same short jittered pauses as until_done's quick tries (at most
  0.75 s in all). That loop is the ingester's own and means something else: when it runs out
  (a job row locked for good), or on any other error there, the letter is filed without
  finishing its job, never requeued for ever;
- that filing is tried once: a blip there too raises FilingFailedError, which no loop retries
  in place (until_done raises it at once): the dead-letter queue's consumer gives the delivery
  back after a pause (infra/rabbit/last_resort.py) and it is filed when it comes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Sequence
from uuid import UUID

import asyncpg
import structlog
from aio_pika.abc import AbstractChannel, AbstractQueue, AbstractRobustConnection

from consumers.dead_letter_forms import (
    BROKER_REASONS,
    UNROUTABLE,
    first_publisher,
    safe_form,
    to_dead_letter,
)
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import job_marks, without_pkgq_marks
from events.routes import UNTRUSTED_PUBLISHER
from infra.postgres import dead_letters, holds, job_state
from infra.postgres.pool import Conn, forget_if_demoted
from infra.rabbit.consumer import Decided, Processor, QueueConsumer
from infra.rabbit.topology import declare_exchanges
from infra.settings import Settings
from infra.transient import is_outage, is_transient, quick_pause_s

__all__ = [
    "BROKER_REASONS",
    "FILING_TRIES",
    "UNROUTABLE",
    "DeadLetterStoreUnavailableError",
    "FilingFailedError",
    "first_publisher",
    "ingester",
    "make_ingester",
    "safe_form",
    "to_dead_letter",
]

log = structlog.get_logger(__name__)

FILING_TRIES = 5
"""Tries of a dead letter's filing in full (its job finished too) while each meets a blip;
then it is filed without finishing its job (see the module docstring)."""


class FilingFailedError(RuntimeError):
    """A dead letter could not be filed even without finishing its job (a blip there too): not
    transient, so no loop retries it in place; the delivery is given back and filed again."""


class DeadLetterStoreUnavailableError(ConnectionError):
    """No pooled connection within 10 s: an outage (the pool exhausted or the server hangs),
    waited out by the consumer, as a route's pipeline does."""


def make_ingester(
    pool: asyncpg.Pool, trusted_publisher: str | None = None, main_exchange: str | None = None
) -> Processor:
    async def ingest_all(raws: Sequence[RawDelivery]) -> list[Decided]:
        return [Decided.of(i, raw, await ingest(raw)) for i, raw in enumerate(raws)]

    async def ingest(raw: RawDelivery) -> Fate:
        dead = to_dead_letter(raw, trusted_publisher, main_exchange)
        if trusted_publisher is not None and raw.publisher != trusted_publisher:
            # Stored without an outsider's pkgq marks, so a replay (sent as pkgq) cannot make
            # them pkgq's own.
            stripped = without_pkgq_marks(dead.headers)
            if stripped is not None:
                dead = dataclasses.replace(dead, headers=stripped)
        dead_id, filed = await file(raw, dead)
        dead = filed
        log.warning(
            "dead_letter_ingested",
            id=dead_id,
            source=dead.source,
            reason=dead.reason,
            dead_route=dead.route,
        )
        return Fate.DEAD_LETTERED

    async def file(
        raw: RawDelivery, dead: dead_letters.NewDeadLetter
    ) -> tuple[int, dead_letters.NewDeadLetter]:
        """File it in full, running the whole filing again on a blip (FILING_TRIES tries at
        most): the letter keeps its full form, and its address and group still hear. Then
        without finishing its job. An outage is raised at once (see the module docstring)."""
        for tries in range(1, FILING_TRIES + 1):
            if tries > 1:
                await asyncio.sleep(quick_pause_s(tries - 1))
            try:
                return await store(raw, dead, finish=True)
            except Exception as exc:
                if is_outage(exc):
                    raise  # waited out by the consumer, then filed as it is
                error = exc
                if not is_transient(exc):
                    break
        # Still failing after the tries (a job row locked for good, a statement timeout):
        # filed without telling its address and group, rather than requeued for ever.
        log.error("dead_letter_filed_without_finishing_its_job", error=repr(error)[:500])
        try:
            return await store(raw, dead, finish=False)
        except Exception as exc:
            if is_transient(exc) and not is_outage(exc):
                raise FilingFailedError(f"filing without its job met a blip: {exc!r}") from exc
            raise

    async def store(
        raw: RawDelivery, dead: dead_letters.NewDeadLetter, *, finish: bool
    ) -> tuple[int, dead_letters.NewDeadLetter]:
        try:
            return await _store(raw, dead, finish=finish)
        except Exception as exc:
            await forget_if_demoted(pool, exc)  # a failed-over primary: reconnect, not reuse
            raise

    async def _store(
        raw: RawDelivery, dead: dead_letters.NewDeadLetter, *, finish: bool
    ) -> tuple[int, dead_letters.NewDeadLetter]:
        try:
            conn = await pool.acquire(timeout=10)
        except TimeoutError as exc:
            raise DeadLetterStoreUnavailableError("no Postgres connection within 10 s") from exc
        try:
            async with conn.transaction():
                return await _store_on(conn, raw, dead, finish=finish)
        finally:
            await pool.release(conn)

    async def _store_on(
        conn: Conn, raw: RawDelivery, dead: dead_letters.NewDeadLetter, *, finish: bool
    ) -> tuple[int, dead_letters.NewDeadLetter]:
        try:
            async with conn.transaction():  # a savepoint: the fallback below can follow
                dead_id = await dead_letters.bury(conn, dead)
                # Addressed and grouped messages failed for good: waiters and groups hear
                # (not from a forgery: its headers say nothing true about pkgq's jobs).
                if finish and dead.reason != UNTRUSTED_PUBLISHER:
                    trusted = trusted_publisher in (None, raw.publisher)
                    # An outsider's unroutable message names no job of pkgq's at all.
                    if trusted or dead.reason != UNROUTABLE:
                        await _finish(conn, raw, dead, marks_believed=trusted)
        except Exception as exc:
            if is_outage(exc) or (finish and is_transient(exc)):
                raise  # a blip is retried in `file`; an outage is waited out by the consumer
            # Something in it Postgres will not store as given: keep the message anyway,
            # in its safe form, rather than send it round the queue for ever.
            log.error("dead_letter_stored_degraded", error=repr(exc)[:500])  # noqa: TRY400
            dead = dataclasses.replace(
                safe_form(raw, f"Postgres refused it: {type(exc).__name__}"),
                publisher=dead.publisher,
            )
            dead_id = await dead_letters.bury(conn, dead)
        return dead_id, dead

    return ingest_all


async def _finish(
    conn: Conn, raw: RawDelivery, dead: dead_letters.NewDeadLetter, *, marks_believed: bool
) -> None:
    """The message failed for good: its address and group hear so, and an expired retry (it
    will never come) blocks its user's later messages no more. `marks_believed`: whether its
    address and group headers are pkgq's own (events.envelope.JOB_MARKS); an outsider's dead
    letter names no job of pkgq's, whatever its headers say."""
    if dead.reason == "expired" and marks_believed:  # pkgq's own retry, not a lookalike
        with contextlib.suppress(ValueError):
            await holds.release_expired_retry(conn, UUID(str(dead.message_id)))
    address, group = job_marks(raw.headers) if marks_believed else (None, None)
    error = f"{dead.reason}: {dead.error_message}"
    await job_state.finish_failed(conn, dead.message_id, address, group, error)


INGEST_PREFETCH = 32
"""The most dead letters the ingester has sent ahead: it files one at a time, so a deeper
buffer only holds more bodies in memory (PKGQ_PREFETCH applies if lower)."""


def ingester(
    settings: Settings, pool: asyncpg.Pool, connection: AbstractRobustConnection
) -> QueueConsumer:
    """The consumer of `pkgq.dead_letters`."""

    async def declare(channel: AbstractChannel) -> AbstractQueue:
        await declare_exchanges(channel, settings)
        return await channel.declare_queue(settings.dead_letter_queue, passive=True)

    return QueueConsumer(
        settings.dead_letter_queue,
        declare,
        settings,
        connection,
        make_ingester(pool, settings.amqp_user, settings.exchange),
        None,  # nowhere further to send a copy: failures are requeued after a pause
        prefetch=min(settings.prefetch, INGEST_PREFETCH),
    )
