"""The one writer: a batch's decisions become rows, table by table (`writes_of`, pure: `Writes`),
and the rows become statements (`write`), inside the batch's transaction.

Statements, in this order (decide.py locked the users, then their holds; nothing here locks
anything else first): inbox claims; items and user rows; usage billed; access (these parts:
infra/postgres/batch_write.py); retries withdrawn; follow-ups and retries; the audit; addresses
and groups finished; dead letters; attempts counted; parking; holds made and lifted; counters.
Consecutive parts share a statement unless they touch the same table (compound.py); the
failure path's go alone. A table with nothing to write sends nothing: a fixed statement count.

What it guarantees (checked in production by `pkgq doctor`): every hold it makes has a way out
written in the same transaction (a retry in the outbox, or the blocker's buried dead letter);
every message it parks has a hold; every failure it counts is retried or buried.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID, uuid4

import structlog

from consumers.unit_of_work import UnitOfWork
from domain.delivery import REPEATS, Decision, Fate, Hold, Source
from events.decoding import message_uuid
from events.envelope import (
    H_ATTEMPT,
    H_FIRST_FAILED_AT,
    H_LAST_ERROR,
    H_PUBLISHER,
    clean_text,
    first_failed_at,
    job_marks,
    jsonable,
    priority_of,
    publisher_of,
    republished_headers,
)
from events.identity import body_user, message_key
from events.routes import UNTRUSTED_PUBLISHER, Route
from infra import faults, observability
from infra.postgres import (
    attempts,
    audit,
    batch_write,
    compound,
    dead_letters,
    holds,
    job_state,
    outbox,
)
from infra.postgres.pool import Conn
from infra.rabbit.consumer import Decided

USAGE_DEDUP_DAYS = 35  # the default of PKGQ_USAGE_DEDUP_DAYS

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Writes:
    """A batch's rows, table by table (an empty one sends no statement)."""

    claims: dict[UUID, batch_write.Claim]
    """Messages recorded in the inbox as applied, by key (events/identity.py)."""
    withdrawn: list[str]
    """Cancel keys of retries no longer wanted (the message was decided again)."""
    retries: list[outbox.OutboxMessage]
    finished: list[job_state.Finished]
    buried: list[dead_letters.NewDeadLetter]
    counted: Counter[tuple[UUID, UUID]]
    """Failures counted in this batch, per message (its key and message_id)."""
    parked: list[holds.NewParked]
    unparked: list[int]
    """Parked rows decided (from the parking lot): they leave it."""
    made: list[holds.NewHold]
    lifted: list[UUID]
    moves: dict[tuple[str, str], int]
    starts: list[observability.Start]  # when each applied message's critical time began
    critical: list[int]  # each applied message's critical-time bucket, for the console


def writes_of(
    route: Route,
    decided: Sequence[Decided],
    now: datetime,
    *,
    source: Source,
    holds_before: dict[UUID, Hold],
    holds_after: dict[UUID, Hold],
    failed_before: set[UUID],
    parked: Mapping[int, int] | None = None,
) -> Writes:
    """The rows a batch's decisions write (see the module docstring). `parked`: from the
    parking lot, each delivery's parked row by index (those decided leave the lot)."""
    consumer = route.short_name
    parked = parked or {}
    made, lifted = _holds(decided, holds_before, holds_after, source)
    starts = observability.critical_starts(decided)
    return Writes(
        claims={
            d.decoded.key: batch_write.Claim(
                d.decoded.envelope.message_id, d.decoded.envelope.user_id
            )
            for d in decided
            if d.decoded and d.decision.claims
        },
        withdrawn=[
            outbox.retry_key(consumer, d.decoded.key)
            for d in decided
            if d.decoded is not None
            and (d.decision.counted or d.decoded.newer or d.decoded.key in failed_before)
            and d.decision.fate not in (Fate.PARKED, Fate.GIVEN_BACK)
        ],
        retries=_retries(route, decided, now),
        finished=_finished(decided),
        buried=_dead_letters(route, decided),
        counted=Counter(
            (d.decoded.key, d.decoded.envelope.message_id)
            for d in decided
            if d.decoded and d.decision.counted
        ),
        parked=_parked(route, decided) if source is Source.QUEUE else [],
        unparked=[
            parked[d.index]
            for d in decided
            if d.decision.fate not in (Fate.PARKED, Fate.GIVEN_BACK) and d.index in parked
        ],
        made=made,
        lifted=lifted,
        moves=batch_write.moves_of(route.name, [d.decision.fate for d in decided], source),
        starts=starts,
        critical=observability.critical_buckets(starts, now),
    )


def _retries(route: Route, decided: Sequence[Decided], now: datetime) -> list[outbox.OutboxMessage]:
    """The next attempt of each message decided RETRY (its last decision in the batch, when a
    copy of it came twice), through the outbox. `x-attempt` on it is for people to read: the
    count is in Postgres (domain/delivery.py)."""
    rows: list[outbox.OutboxMessage] = []
    if not any(d.decision.fate is Fate.RETRIED for d in decided):
        return rows
    last = {d.decoded.key: d.index for d in decided if d.decoded is not None}
    for d in decided:
        decision = d.decision
        if decision.fate is not Fate.RETRIED or d.decoded is None:
            continue
        envelope = d.decoded.envelope
        if last[d.decoded.key] != d.index:
            continue  # a later copy of it was decided after this one
        failure = decision.failure
        assert failure is not None
        assert decision.retry_at is not None
        headers = jsonable(dict(d.raw.headers))
        first_failed = first_failed_at(headers) or now
        rows.append(
            outbox.OutboxMessage(
                route=route.name,
                message_type=route.message_type,
                schema_version=envelope.schema_version,
                body=d.raw.body,
                user_id=envelope.user_id,
                seq=envelope.seq,
                message_id=envelope.message_id,
                headers=republished_headers(
                    headers,
                    {
                        H_ATTEMPT: decision.attempt + 1,
                        H_FIRST_FAILED_AT: first_failed.isoformat(),
                        H_LAST_ERROR: clean_text(failure.summary[:500]),
                        # who sent it first, so that the retry has the message's key
                        H_PUBLISHER: envelope.publisher,
                        **observability.since_marks(d.raw, envelope),  # from its first publication
                    },
                ),
                available_at=decision.retry_at,
                priority=priority_of(headers),
                expires_at=envelope.expires_at,
                cancel_key=outbox.retry_key(route.short_name, d.decoded.key),
                # A dedup key marks it as a retry (the `put` counter leaves retries out); its
                # own suffix keeps it apart from a retry of the same count before a replay.
                dedup_key=f"retry:{route.short_name}:{d.decoded.key}:{uuid4().hex}",
            )
        )
    return rows


def _dead_letters(route: Route, decided: Sequence[Decided]) -> list[dead_letters.NewDeadLetter]:
    """What is buried (or expired), as the dead-letter store keeps it. Once a message decoded,
    its ids are the envelope's (the body's user, the canonical message_id) and its key, so
    holds match. Bad input is filed under the user its body names, if it names one it can be
    read for (else under none): a user header is only a claim, kept in its headers, and a
    hold, a retry or a discard is never matched on it."""
    letters = []
    for d in decided:
        decision = d.decision
        if decision.fate not in (Fate.DEAD_LETTERED, Fate.EXPIRED):
            continue
        failure = decision.failure
        assert failure is not None
        assert decision.reason is not None
        headers = jsonable(dict(d.raw.headers))
        publisher = publisher_of(d.raw.headers, d.raw.publisher)
        message_id, user_id = d.raw.message_id, body_user(d.raw.body)
        uuid = message_uuid(message_id)
        key = message_key(uuid, publisher, user_id) if uuid is not None else None
        if d.decoded is not None:
            message_id, user_id = str(d.decoded.envelope.message_id), d.decoded.envelope.user_id
            key = d.decoded.key
        letters.append(
            dead_letters.NewDeadLetter(
                source="consumer",
                route=route.name,
                consumer=route.short_name,
                message_id=message_id,
                user_id=user_id,
                message_type=d.raw.message_type,
                content_type=d.raw.content_type,
                body=d.raw.body,
                headers=headers,
                reason=decision.reason,
                error_type=failure.error_type,
                error_message=failure.message,
                error_location=failure.location,
                traceback=failure.traceback or None,
                attempts=max(decision.attempt, 1),
                first_failed_at=(
                    first_failed_at(headers) if decision.reason == "max_attempts" else None
                ),
                publisher=publisher,
                message_key=key,
            )
        )
    return letters


def _finished(decided: Sequence[Decided]) -> list[job_state.Finished]:
    """Addresses and group members of messages that will not run again: applied ones are done,
    buried and expired ones failed. An untrusted publisher's job marks fail nothing."""
    finished = []
    for d in decided:
        decision = d.decision
        if (decision.fate is Fate.ACKED or decision.fate in REPEATS) and d.decoded is not None:
            envelope = d.decoded.envelope
            if envelope.address is not None or envelope.group_id is not None:
                finished.append(
                    job_state.Finished(
                        envelope.message_id, envelope.address, envelope.group_id, ok=True
                    )
                )
        elif (
            decision.fate in (Fate.DEAD_LETTERED, Fate.EXPIRED)
            and decision.reason != UNTRUSTED_PUBLISHER
        ):
            failure = decision.failure
            assert failure is not None
            error = f"{decision.reason}: {failure.message}"
            if d.decoded is not None:
                envelope = d.decoded.envelope
                mid, address, group = envelope.message_id, envelope.address, envelope.group_id
            else:
                address, group = job_marks(d.raw.headers)
                try:
                    mid = UUID(str(d.raw.message_id))
                except ValueError:
                    continue
            if address is not None or group is not None:
                finished.append(job_state.Finished(mid, address, group, ok=False, error=error))
    return finished


def _parked(route: Route, decided: Sequence[Decided]) -> list[holds.NewParked]:
    return [
        holds.NewParked(
            user_id=d.decoded.envelope.user_id,
            message_id=d.decoded.envelope.message_id,
            key=d.decoded.key,
            route=route.name,
            message_type=route.message_type,
            body=d.raw.body,
            # stamped with who sent it first, so that the drain finds the message's key
            headers=jsonable(
                {**d.raw.headers, H_PUBLISHER: d.decoded.envelope.publisher}
                | observability.since_marks(d.raw, d.decoded.envelope)  # and its critical start
            ),
        )
        for d in decided
        if d.decision.fate is Fate.PARKED
        and d.decoded is not None
        and d.decoded.envelope.user_id is not None
    ]


def _holds(
    decided: Sequence[Decided],
    before: dict[UUID, Hold],
    after: dict[UUID, Hold],
    source: Source,
) -> tuple[list[holds.NewHold], list[UUID]]:
    """The holds the batch made (a new blocker) and the users whose hold it lifted. From the
    parking lot, every user it drained has its lifted hold dropped when nothing is left parked."""
    last: dict[UUID, Decision] = {}
    blocker_ids: dict[UUID, UUID] = {}
    parked: set[UUID] = set()
    for d in decided:
        user = d.decoded.envelope.user_id if d.decoded is not None else None
        if user is not None and d.decision.holds is not None:
            last[user] = d.decision
            assert d.decoded is not None
            blocker_ids[user] = d.decoded.envelope.message_id
        if user is not None and d.decision.fate is Fate.PARKED:
            parked.add(user)
    made, lifted = [], []
    for user, hold in sorted(after.items()):
        if hold.blocker is None:
            if source is Source.PARKING or before.get(user) != hold or user in parked:
                lifted.append(user)
            if user not in before:
                # Held and lifted within the batch (a copy of the blocker came twice): the
                # hold row is written lifted, so settling it sees what was parked behind it.
                made.append(holds.NewHold(user, None, "releasing"))
            continue
        if before.get(user) == hold and user not in last:
            continue
        decision = last.get(user)
        failure = decision.failure if decision is not None else None
        made.append(
            holds.NewHold(
                user,
                hold.blocker,
                hold.state,
                decision.attempt if decision is not None else 0,
                failure.summary if failure is not None else "",
                blocker_ids.get(user),
            )
        )
    return made, lifted


class ClaimRaceError(Exception):
    """A message applied here was claimed in the inbox meanwhile: the batch runs again."""


async def write(
    conn: Conn,
    route: Route,
    work: UnitOfWork,
    writes: Writes,
    *,
    usage_dedup_days: int = USAGE_DEDUP_DAYS,
) -> list[UUID]:
    """Send a batch's writes. Returns the users whose parked messages may go now.
    `usage_dedup_days`: how long a billing record id billed now is remembered."""
    consumer = route.short_name
    batch = compound.Batch(conn)
    claimed = await batch.add(batch_write.claim_many(consumer, writes.claims))
    for part in batch_write.save_queues(work.queues.values()):
        await batch.add(part)
    await batch.add(batch_write.bill_usages(work.billings_to_write(), usage_dedup_days))
    changes, remaining = batch_write.write_access(work.access_changes, work.remaining_to_write())
    applied = await batch.add(changes)
    await batch.add(remaining)
    # A table with nothing to write is not asked for a part (none would be sent).
    withdrawn = [key for key, _ in work.withdrawn] + writes.withdrawn
    if withdrawn:
        await batch.add(outbox.withdraw_part(withdrawn))
    sent = work.rows_to_write() + writes.retries
    if sent:
        await batch.add(outbox.enqueue_part(sent))
    if work.audit:
        await batch.add(audit.write(work.audit))
    # The failure path's statements go one by one, in this order, after what came before.
    if writes.finished or writes.buried:
        await batch.send()
        await job_state.finish(conn, writes.finished)
        await dead_letters.bury_many(conn, writes.buried)
    if writes.counted:
        await batch.add(attempts.add_many(consumer, writes.counted))
    drain: list[UUID] = []
    if writes.parked or writes.unparked or writes.made or writes.lifted:
        await batch.send()
        await holds.park_many(conn, consumer, writes.parked)
        await holds.unpark(conn, consumer, writes.unparked)
        await holds.hold_many(conn, consumer, writes.made)
        drain = await holds.drop_lifted(conn, consumer, writes.lifted)
    await batch.add(batch_write.count_moves(writes.moves, route.name, writes.critical))
    await batch.send()
    if writes.claims and claimed.get() != len(writes.claims):
        raise ClaimRaceError(f"{len(writes.claims) - claimed.get()} claimed meanwhile")
    stale = set(work.access_changes) - (applied.get() or set())
    for user in sorted(stale):
        work.granted_since.pop(user, None)
        log.info("access_update_stale", user_id=str(user), seq=work.access_changes[user].seq)
    if writes.claims:
        faults.hit(faults.DELIVERY_BEFORE_COMMIT, route=route.name)
    return drain
