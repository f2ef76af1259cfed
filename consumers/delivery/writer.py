"""The one writer: a batch's decisions become statements, one per table, failures included.

In this order, inside the batch's transaction (whose snapshot locked the users, then their
holds: the lock order lives in snapshot.py, and nothing here locks anything else first):
inbox claims; items and user rows; access; timers and superseded retries withdrawn; follow-up
events and retries; the operators' audit; addresses and groups finished; dead letters; failed
attempts counted; parked messages parked or unparked; holds made; holds lifted; counters.
A statement with nothing to write is not sent, so a batch costs at most a fixed number of
statements, whatever its size and however many of its messages fail.

What it guarantees (checked in production by `pkgq doctor`): every hold it makes has a way out
written in the same transaction (a retry in the outbox, or the blocker's buried dead letter);
every message it parks has a hold; every failure it counts is retried or buried.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import structlog

from consumers.delivery.executor import Decided
from consumers.unit_of_work import UnitOfWork
from domain.delivery import Decision, Fate, Hold, Source
from events.envelope import (
    H_ATTEMPT,
    H_FIRST_FAILED_AT,
    H_LAST_ERROR,
    H_PRIORITY,
    H_USER_ID,
    clean_text,
    header_text,
    job_marks,
    jsonable,
    publisher_of,
    republished_headers,
)
from events.routes import UNTRUSTED_PUBLISHER, Route
from infra import faults
from infra.postgres import (
    access,
    attempts,
    audit,
    dead_letters,
    holds,
    inbox,
    job_state,
    outbox,
    queue_repo,
    transitions,
)
from infra.postgres.pool import Conn

log = structlog.get_logger(__name__)


class ClaimRaceError(Exception):
    """A message applied in memory was claimed in the inbox by someone else meanwhile: the
    batch is rolled back and run again (it is then a duplicate)."""


async def write(
    conn: Conn,
    route: Route,
    work: UnitOfWork,
    decided: Sequence[Decided],
    *,
    source: Source,
    holds_before: dict[UUID, Hold],
    holds_after: dict[UUID, Hold],
    failed_before: set[UUID],
) -> list[UUID]:
    """Write a batch's decisions. Returns the users whose parked messages may go now."""
    consumer = route.short_name
    claims = {
        d.decoded.envelope.message_id: d.decoded.envelope.user_id
        for d in decided
        if d.decoded and d.decision.claims
    }
    if claims:
        claimed = await inbox.claim_many(conn, consumer, claims)
        if len(claimed) != len(claims):
            raise ClaimRaceError(f"{len(claims) - len(claimed)} claimed meanwhile")
    await queue_repo.save(conn, work.queues.values())
    stale = set(work.access_changes)
    stale -= await access.write(conn, work.access_changes, work.remaining_to_write())
    for user in sorted(stale):
        log.info("access_update_stale", user_id=str(user), seq=work.access_changes[user].seq)
    finished_with = [
        outbox.retry_key(consumer, d.decoded.envelope.user_id, d.decoded.envelope.message_id)
        for d in decided
        if d.decoded is not None
        and (d.decision.counted or d.decoded.envelope.message_id in failed_before)
        and d.decision.fate not in (Fate.PARKED, Fate.GIVEN_BACK)
    ]
    await outbox.withdraw(conn, [key for key, _ in work.withdrawn] + finished_with)
    await outbox.enqueue(conn, work.rows_to_write() + _retries(route, decided, work.now))
    await audit.write(conn, work.audit)
    await job_state.finish(conn, _finished(decided))
    await dead_letters.bury_many(conn, _dead_letters(route, decided))
    counted = Counter(
        d.decoded.envelope.message_id for d in decided if d.decoded and d.decision.counted
    )
    await attempts.add_many(conn, consumer, counted)
    if source is Source.QUEUE:
        await holds.park_many(conn, consumer, _parked(route, decided))
    else:
        await holds.unpark(conn, consumer, _unparked(decided))
    made, lifted = _holds(decided, holds_before, holds_after, source)
    await holds.hold_many(conn, consumer, made)
    drain = await holds.settle_lifted(conn, consumer, lifted)
    await transitions.count(conn, _moves(route.name, decided, source))
    if claims:
        faults.hit(faults.DELIVERY_BEFORE_COMMIT, route=route.name)
    return drain


def _retries(route: Route, decided: Sequence[Decided], now: datetime) -> list[outbox.OutboxMessage]:
    """The next attempt of each message decided RETRY (its last decision in the batch, when a
    copy of it came twice), through the outbox. `x-attempt` on it is for people to read: the
    count is in Postgres (domain/delivery.py)."""
    rows: list[outbox.OutboxMessage] = []
    if not any(d.decision.fate is Fate.RETRY for d in decided):
        return rows
    last = {d.decoded.envelope.message_id: d.index for d in decided if d.decoded is not None}
    for d in decided:
        if d.decoded is None or last[d.decoded.envelope.message_id] != d.index:
            continue
        decision = d.decision
        if decision.fate is not Fate.RETRY or d.decoded is None:
            continue
        envelope = d.decoded.envelope
        failure = decision.failure
        assert failure is not None
        assert decision.retry_at is not None
        headers = jsonable(dict(d.raw.headers))
        first_failed = _first_failed_at(headers) or now
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
                    },
                ),
                available_at=decision.retry_at,
                priority=_priority(headers),
                expires_at=envelope.expires_at,
                cancel_key=outbox.retry_key(
                    route.short_name, envelope.user_id, envelope.message_id
                ),
                # A dedup key marks it as a retry (the `put` counter leaves retries out); its
                # own suffix keeps it apart from a retry of the same count before a replay.
                dedup_key=f"retry:{route.short_name}:{envelope.message_id}:{uuid4().hex}",
            )
        )
    return rows


def _dead_letters(route: Route, decided: Sequence[Decided]) -> list[dead_letters.NewDeadLetter]:
    """What is buried (or expired), as the dead-letter store keeps it. Once a message decoded,
    its ids are the envelope's (the body's user, the canonical message_id), so holds match."""
    letters = []
    for d in decided:
        decision = d.decision
        if decision.fate not in (Fate.BURIED, Fate.EXPIRED):
            continue
        failure = decision.failure
        assert failure is not None
        assert decision.reason is not None
        headers = jsonable(dict(d.raw.headers))
        message_id, user_id = d.raw.message_id, _user_of(d.raw.headers)
        if d.decoded is not None:
            message_id, user_id = str(d.decoded.envelope.message_id), d.decoded.envelope.user_id
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
                    _first_failed_at(headers) if decision.reason == "max_attempts" else None
                ),
                publisher=publisher_of(d.raw.headers, d.raw.publisher),
            )
        )
    return letters


def _finished(decided: Sequence[Decided]) -> list[job_state.Finished]:
    """Addresses and group members of messages that will not run again: applied ones are done,
    buried and expired ones failed. An untrusted publisher's job marks fail nothing."""
    finished = []
    for d in decided:
        decision = d.decision
        if decision.fate in (Fate.APPLIED, Fate.DUPLICATE_ORDER) and d.decoded is not None:
            envelope = d.decoded.envelope
            if envelope.address is not None or envelope.group_id is not None:
                finished.append(
                    job_state.Finished(
                        envelope.message_id, envelope.address, envelope.group_id, ok=True
                    )
                )
        elif (
            decision.fate in (Fate.BURIED, Fate.EXPIRED) and decision.reason != UNTRUSTED_PUBLISHER
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
            route=route.name,
            message_type=route.message_type,
            body=d.raw.body,
            headers=jsonable(dict(d.raw.headers)),
        )
        for d in decided
        if d.decision.fate is Fate.PARKED
        and d.decoded is not None
        and d.decoded.envelope.user_id is not None
    ]


def _unparked(decided: Sequence[Decided]) -> list[UUID]:
    """Parked messages the drain decided (applied, buried, ...): they leave the lot. (A parked
    message's raw message_id is the parked row's uuid, so even bad input has one.)"""
    return [
        d.decoded.envelope.message_id if d.decoded is not None else UUID(str(d.raw.message_id))
        for d in decided
        if d.decision.fate not in (Fate.PARKED, Fate.GIVEN_BACK)
    ]


def _holds(
    decided: Sequence[Decided],
    before: dict[UUID, Hold],
    after: dict[UUID, Hold],
    source: Source,
) -> tuple[list[holds.NewHold], list[UUID]]:
    """The holds the batch made (a new blocker) and the users whose hold it lifted. From the
    parking lot, every user it drained is settled (dropped when nothing is left parked)."""
    last: dict[UUID, Decision] = {}
    parked: set[UUID] = set()
    for d in decided:
        user = d.decoded.envelope.user_id if d.decoded is not None else None
        if user is not None and d.decision.holds is not None:
            last[user] = d.decision
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
            )
        )
    return made, lifted


def _moves(route: str, decided: Sequence[Decided], source: Source) -> dict[tuple[str, str], int]:
    """Transition counts (bury and ttl are counted by a trigger on the dead-letter store). A
    parked message was counted as taken when it was parked."""
    fates = [d.decision.fate for d in decided if d.decision.fate is not Fate.GIVEN_BACK]
    taken = len(fates) if source is Source.QUEUE else 0
    acked = sum(1 for f in fates if f in (Fate.APPLIED, Fate.DUPLICATE_ORDER))
    retried = sum(1 for f in fates if f is Fate.RETRY)
    # seed 004's "release": a taken message put back to wait (here: a retry scheduled)
    return {(route, "take"): taken, (route, "ack"): acked, (route, "release"): retried}


def _priority(headers: dict[str, Any]) -> int:
    value = headers.get(H_PRIORITY, 0)
    return value if isinstance(value, int) and 0 <= value <= 2 else 0


def _user_of(headers: Any) -> UUID | None:
    value = header_text(headers, H_USER_ID, 64)
    try:
        return UUID(value) if value is not None else None
    except ValueError:
        return None


def _first_failed_at(headers: dict[str, Any]) -> datetime | None:
    value = headers.get(H_FIRST_FAILED_AT)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
