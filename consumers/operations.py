"""What an operator does, in one place: the console (`pkgq web`) and the CLI (`pkgq user …`,
`pkgq dlq …`) call these, so nothing is written twice.

Every action runs in one Postgres transaction with its audit row (telecom.operator_actions, and
the dead letter's replayed_by / discarded_by): cancels and quota adjustments are put in the
outbox as commands on telecom.package_cancel and telecom.quota_adjust, published by the relay
like any other command and applied by their consumers, which write the item audit.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from events.models import AdjustQuota, CancelPackage, WireModel
from events.routes import PACKAGE_CANCEL, QUOTA_ADJUST, ROUTES, Route
from infra.jobs import put
from infra.postgres import dead_letters, holds, invariants, operator_actions, queue_repo, replay
from infra.postgres.pool import Conn
from infra.transient import transient_retrying

BATCH = 200
"""Dead letters replayed or discarded per transaction in a bulk action."""
T = TypeVar("T")


class UnknownItemError(LookupError):
    def __init__(self, item_id: int) -> None:
        super().__init__(f"no queue item {item_id}")
        self.item_id = item_id


class EditRefusedError(ValueError):
    """An edited body that cannot be replayed, with what to do about it."""


class UnknownHoldError(LookupError):
    def __init__(self, consumer: str, user_id: UUID) -> None:
        super().__init__(f"no hold on consumer {consumer!r} for user {user_id}")


class HoldReleaseRefusedError(ValueError):
    """A hold that is not orphaned, with why and what to do instead."""


async def _item_command(
    conn: Conn,
    route: Route,
    item_id: int,
    who: str,
    make: Callable[[UUID], WireModel],
    detail: dict[str, Any],
    message_id: UUID | None,
    owner: UUID | None,
) -> UUID:
    if owner is None:
        owner = await queue_repo.item_owner(conn, item_id)
    if owner is None:
        raise UnknownItemError(item_id)
    body = make(owner)  # validated by its model: a reason too long is refused here
    result = await put(conn, route, body, message_id=message_id)
    await operator_actions.record(
        conn,
        operator_actions.Entry(
            actor=who,
            action="cancel" if route is PACKAGE_CANCEL else "adjust_quota",
            user_id=owner,
            item_id=item_id,
            message_id=result.message_id,
            detail=detail,
        ),
    )
    return result.message_id


async def cancel_item(
    conn: Conn,
    item_id: int,
    who: str,
    reason: str | None = None,
    *,
    message_id: UUID | None = None,
    owner: UUID | None = None,
) -> UUID:
    """Inside a transaction: put a CancelPackage for the item in the outbox, recorded as `who`'s.
    Returns its message_id. UnknownItemError if there is no such item. `message_id`: the
    command's own (a form's one-time id, so that posting it twice sends it once). `owner`: the
    item's user when the caller has read it already (the console, for its 404 and its way
    back), so it is not read twice; an item never changes hands, so a read before the
    transaction is as good as one in it (neither locks anything)."""
    return await _item_command(
        conn,
        PACKAGE_CANCEL,
        item_id,
        who,
        lambda owner: CancelPackage(user_id=owner, item_id=item_id, reason=reason, operator=who),
        {"reason": reason},
        message_id,
        owner,
    )


async def adjust_quota(
    conn: Conn,
    item_id: int,
    delta: int,
    who: str,
    reason: str | None = None,
    *,
    message_id: UUID | None = None,
    owner: UUID | None = None,
) -> UUID:
    """Inside a transaction: put an AdjustQuota (DELTA bytes, may be < 0) in the outbox
    (`message_id` and `owner` as for cancel_item)."""
    return await _item_command(
        conn,
        QUOTA_ADJUST,
        item_id,
        who,
        lambda owner: AdjustQuota(
            user_id=owner, item_id=item_id, delta=delta, reason=reason, operator=who
        ),
        {"delta": delta, "reason": reason},
        message_id,
        owner,
    )


def validate_edit(route_name: str, text: str) -> WireModel:
    """An edited body checked against its route's model (strict JSON, as the consumer decodes
    it). Raises EditRefusedError for an unknown route, pydantic's ValidationError otherwise."""
    route = ROUTES.get(route_name)
    if route is None:
        raise EditRefusedError(f"route {route_name!r} is not a pkgq route")
    return route.model.model_validate_json(text)


async def edit_and_replay(
    conn: Conn, dead_letter_id: int, text: str, who: str, *, pkgq_user: str
) -> replay.ReplayResult:
    """Inside a transaction: replay a buried dead letter with a corrected body.

    The body is validated against the route's current model first (ValidationError: nothing
    happens) and replayed as that version, whatever version the buried one was (a v1 usage
    record may gain a usage_id).
    It keeps its message_id, so a hold it blocks still holds the user's later messages until the
    corrected message is applied, and the dead letter keeps the body it was buried with; the
    audit row keeps both. It keeps its publisher too: an edit makes nobody's message pkgq's own
    (a refusal says why, as for a replay; `pkgq_user`: pkgq's AMQP user)."""
    row = await dead_letters.get(conn, dead_letter_id)
    if row is None:
        raise EditRefusedError(f"no dead letter {dead_letter_id}")
    if row["status"] != "buried":
        raise EditRefusedError(f"dead letter {dead_letter_id} is {row['status']}, not buried")
    model = validate_edit(row["route"], text)
    if row["user_id"] is not None and model.user_id != row["user_id"]:
        raise EditRefusedError(
            f"the edit changes user_id from {row['user_id']} to {model.user_id}: its user's "
            "order would be broken; publish a new message for the other user instead"
        )
    body = model.model_dump_json().encode()
    results = await replay.replay(
        conn,
        [dead_letter_id],
        who,
        pkgq_user=pkgq_user,
        edits={dead_letter_id: replay.Edit(body, model.user_id)},
    )
    result = results[0] if results else None
    if result is None or not result.replayed:
        raise EditRefusedError(result.detail if result else "not replayed")
    await operator_actions.record(
        conn,
        operator_actions.Entry(
            actor=who,
            action="edit_replay",
            user_id=model.user_id,
            dead_letter_id=dead_letter_id,
            message_id=_uuid(row["message_id"]),
            detail={
                "route": row["route"],
                "original_body": bytes(row["body"]).decode("utf-8", "replace"),
                "edited_body": json.loads(body),
            },
        ),
    )
    return result


async def release_hold(
    conn: Conn,
    consumer: str,
    user_id: UUID,
    who: str,
    *,
    blocker: UUID | None = None,
    graces: invariants.Graces = invariants.GRACES,
) -> invariants.HoldWayOut:
    """Inside a transaction: release a hold, matched by its consumer and user, with an audit
    row. Its blocker is dropped (state `releasing`), and the consumer's release poll applies
    what is parked behind it, in order. `blocker`: the one the operator was shown; a hold that
    waits on another message by now is refused. Returns the hold as it was: its
    `release_warning` says what was pending (a retry on its way, a buried dead letter) and
    what becomes of it. A hold with a way out is released too: nothing anyone publishes can
    make an operator's release refuse.

    UnknownHoldError: no such hold. HoldReleaseRefusedError: it is being released already, or
    it waits on another blocker than the one the operator was shown."""
    found = await invariants.hold_way_out(conn, consumer, user_id, graces=graces, lock=True)
    if found is None:
        raise UnknownHoldError(consumer, user_id)
    if found.blocker is None:
        raise HoldReleaseRefusedError("the hold is being released already (its blocker is done)")
    if blocker is not None and found.blocker != blocker:
        raise HoldReleaseRefusedError(
            f"the hold waits on message {found.blocker} now, not {blocker}: look again"
        )
    if not await holds.release_hold(conn, consumer, user_id, found.blocker):
        raise HoldReleaseRefusedError("the hold changed meanwhile: look again")
    await operator_actions.record(
        conn,
        operator_actions.Entry(
            actor=who,
            action="release_hold",
            user_id=user_id,
            message_id=found.blocker,
            detail={
                "consumer": consumer,
                "blocker": found.blocker,
                "state": found.state,
                "attempts": found.attempts,
                "last_error": found.last_error,
                "since": found.since,
                "parked": found.parked,
                "warning": found.release_warning,
            },
        ),
    )
    return found


async def in_batches(
    conn: Conn,
    ids: Sequence[int],
    step: Callable[[Conn, list[int]], Awaitable[T]],
    on_batch: Callable[[int], None] | None = None,
) -> list[T]:
    """Run `step` over `ids` in transactions of BATCH on `conn`; a batch hit by a deadlock or a
    blip is run again. Returns each committed batch's result; `on_batch(size)` after each."""
    results: list[T] = []
    for start in range(0, len(ids), BATCH):
        batch = list(ids[start : start + BATCH])
        async for attempt in transient_retrying():
            with attempt:
                async with conn.transaction():
                    result = await step(conn, batch)
        results.append(result)
        if on_batch is not None:
            on_batch(len(batch))
    return results


@dataclass(frozen=True, slots=True)
class BulkResult:
    done: int
    skipped: list[replay.ReplayResult]


async def replay_batch(
    conn: Conn,
    ids: list[int],
    who: str,
    *,
    pkgq_user: str,
    force: bool = False,
    transition: str = "dig",
) -> list[replay.ReplayResult]:
    """Inside a transaction: replay these dead letters through the outbox (their replayed_by
    says who) with an audit row for the batch. `pkgq_user`: pkgq's AMQP user (see
    replay.replay: what anyone else published on a pkgq-only route is refused, with why)."""
    results = await replay.replay(
        conn, ids, who, pkgq_user=pkgq_user, force=force, transition=transition
    )
    await _record_bulk(conn, "replay", who, ids, sum(r.replayed for r in results))
    return results


async def discard_batch(conn: Conn, ids: list[int], who: str) -> int:
    """Inside a transaction: discard these buried dead letters (what they held back is
    released in order) with an audit row for the batch."""
    done = await dead_letters.discard(conn, ids, who)
    await _record_bulk(conn, "discard", who, ids, done)
    return done


async def replay_ids(conn: Conn, ids: Sequence[int], who: str, *, pkgq_user: str) -> BulkResult:
    """Replay these buried dead letters, once each, in batches (`pkgq_user`: see replay_batch)."""

    async def step(c: Conn, batch: list[int]) -> list[replay.ReplayResult]:
        return await replay_batch(c, batch, who, pkgq_user=pkgq_user)

    flat = [r for batch in await in_batches(conn, ids, step) for r in batch]
    return BulkResult(sum(r.replayed for r in flat), [r for r in flat if not r.replayed])


async def discard_ids(conn: Conn, ids: Sequence[int], who: str) -> int:
    """Discard these buried dead letters, in batches."""

    async def step(c: Conn, batch: list[int]) -> int:
        return await discard_batch(c, batch, who)

    return sum(await in_batches(conn, ids, step))


async def _record_bulk(conn: Conn, action: str, who: str, ids: list[int], done: int) -> None:
    await operator_actions.record(
        conn,
        operator_actions.Entry(
            actor=who,
            action="replay" if action == "replay" else "discard",
            dead_letter_id=ids[0] if len(ids) == 1 else None,
            detail={"ids": ids, "done": done},
        ),
    )


def _uuid(value: str | None) -> UUID | None:
    try:
        return UUID(value or "")
    except ValueError:
        return None
