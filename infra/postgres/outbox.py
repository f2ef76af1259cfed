"""The outbox table: messages committed with the state change that caused them.

Writers insert rows inside their transaction; the relay (infra/outbox/relay.py) claims due rows
partition by partition, publishes them and marks them published.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from events.envelope import Envelope
from events.outgoing import Outgoing
from infra.postgres import queue_repo
from infra.postgres.compound import Part, part_of, run
from infra.postgres.pool import Conn, columns, from_row
from infra.postgres.pruning import Rule

RETENTION = Rule("outbox", "telecom.outbox", "id", "published_at < {cutoff}")


PARTITIONS = 64
"""Fixed lease slots (the `partition` column is derived from user_id in SQL)."""
RELAY_LOCK_CLASS = 0x706B6772
"""Advisory-lock class of relay partition leases; the object id is the partition."""
HANDOFF_LOCK_CLASS = queue_repo.HANDOFF_LOCK_CLASS


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    route: str
    message_type: str
    schema_version: int
    body: bytes
    user_id: UUID | None
    seq: int | None = None
    message_id: UUID = field(default_factory=uuid4)
    headers: dict[str, Any] = field(default_factory=dict)
    available_at: datetime | None = None
    cancel_key: str | None = None
    dedup_key: str | None = None
    """Set on retries and replays: a second insert with the same key is ignored."""
    priority: int = 0
    """0-2, higher is more urgent: claimed first by the relay, and the AMQP priority."""
    expires_at: datetime | None = None
    """TTL: not published after this; recorded as expired instead."""


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    message_id: UUID
    route: str
    message_type: str
    user_id: UUID | None
    body: bytes
    headers: dict[str, Any]
    available_at: datetime | None = None
    priority: int = 0
    expires_at: datetime | None = None
    seq: int | None = None
    ttl_ms: int | None = None
    """Milliseconds left of the TTL when claimed (0: expired, never published)."""


def from_envelope(
    route_name: str,
    envelope: Envelope,
    body: bytes,
    *,
    extra_headers: dict[str, Any] | None = None,
    available_at: datetime | None = None,
    cancel_key: str | None = None,
    priority: int = 0,
    expires_at: datetime | None = None,
) -> OutboxMessage:
    """The outbox row of a new message: ids, type and headers from its envelope."""
    return OutboxMessage(
        route=route_name,
        message_type=envelope.message_type,
        schema_version=envelope.schema_version,
        body=body,
        user_id=envelope.user_id,
        seq=envelope.seq,
        message_id=envelope.message_id,
        headers={**envelope.headers(), **(extra_headers or {})},
        available_at=available_at,
        cancel_key=cancel_key,
        priority=priority,
        expires_at=expires_at,
    )


def from_outgoing(
    out: Outgoing, *, seq: int | None, attempt: int = 1, traceparent: str | None = None
) -> OutboxMessage:
    envelope = Envelope(
        message_id=uuid4(),
        message_type=out.route.message_type,
        schema_version=out.route.schema_version,
        user_id=out.body.user_id,
        seq=seq,
        attempt=attempt,
        traceparent=traceparent,
    )
    return from_envelope(
        out.route.name,
        envelope,
        out.body.model_dump_json().encode(),
        available_at=out.due_at,
        cancel_key=out.cancel_key,
    )


@dataclass(frozen=True, slots=True)
class HandedRow:
    """A row handed off to the process that wrote it: its id, and what to publish."""

    id: int
    message: OutboxMessage


@dataclass(frozen=True, slots=True)
class Added:
    """What an insert of outbox rows did: how many it added (a `dedup_key` already there is
    skipped) and the rows it handed off to the writing process (ids, in order)."""

    count: int
    handed: list[tuple[int, UUID]] = field(default_factory=list)
    """(id, message_id) of each row handed off (infra/outbox/handoff.py)."""


async def enqueue(conn: Conn, messages: Sequence[OutboxMessage]) -> int:
    """Insert the messages in order. Returns how many were inserted: a message whose
    `dedup_key` is already there is skipped."""
    added = await run(conn, enqueue_part(messages))
    return added.count if added is not None else 0


def handoff_wanted(messages: Sequence[OutboxMessage], now: datetime) -> list[bool]:
    """Per message, whether its batch asks to hand it off to the process that writes it
    (infra/outbox/handoff.py), a pure function of the batch's rows. A user's rows are asked
    for together or not at all: each of its rows due now must be a plain follow-up (no delay,
    cancel key, dedup key or TTL), since a row the relay publishes must not be overtaken by a
    later row of the same user. Rows for later (timers, retries) are never handed off and hold
    nothing back. Whether they are handed off in the end is the insert's to say
    (`enqueue_part`): only if none of the user's earlier rows is unpublished and due, and the
    route is not paused."""
    refused: set[UUID | None] = {None}
    for m in messages:
        due_now = m.available_at is None or m.available_at <= now
        plain = m.available_at is None and m.cancel_key is None and m.dedup_key is None
        if due_now and not (plain and m.expires_at is None):
            refused.add(m.user_id)
    return [m.user_id not in refused and m.available_at is None for m in messages]


def enqueue_part(
    messages: Sequence[OutboxMessage],
    *,
    handoff_s: float = 0.0,
    now: datetime | None = None,
    handoff_room: int = 0,
    handoff_by: UUID | None = None,
) -> Part[Added] | None:
    """`enqueue` as a part of a batch's write statement (infra/postgres/compound.py).
    `handoff_s` > 0: the rows `handoff_wanted` asks for (as of the transaction's clock `now`)
    are handed off for that many seconds to process `handoff_by`, if there are at most
    `handoff_room` of them, their route is not paused, and none of their user's earlier rows
    waits (read under the user's lock, which every writer of a user's follow-ups holds) but
    rows under way in that same process, which publishes the new ones after them."""
    if not messages:
        return None
    wanted = [False] * len(messages)
    if handoff_s > 0 and now is not None and handoff_by is not None:
        asked = handoff_wanted(messages, now)
        if sum(asked) <= handoff_room:
            wanted = asked
    return part_of(
        """
        INSERT INTO telecom.outbox
            (message_id, route, message_type, schema_version, user_id, seq, body, headers,
             available_at, cancel_key, dedup_key, priority, expires_at, handed_until,
             handed_by)
        SELECT m.message_id, m.route, m.message_type, m.schema_version, m.user_id, m.seq, m.body,
               m.headers::jsonb, coalesce(m.available_at, now()), m.cancel_key, m.dedup_key,
               m.priority, m.expires_at,
               CASE WHEN h.handed THEN now() + make_interval(secs => $15) END,
               CASE WHEN h.handed THEN $16::uuid END
        FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::uuid[], $6::bigint[],
                    $7::bytea[], $8::text[], $9::timestamptz[], $10::text[], $11::text[],
                    $12::smallint[], $13::timestamptz[], $14::bool[])
             WITH ORDINALITY AS m(message_id, route, message_type, schema_version, user_id, seq,
                                  body, headers, available_at, cancel_key, dedup_key, priority,
                                  expires_at, wanted, ord)
             CROSS JOIN LATERAL (
                 SELECT m.wanted
                    AND m.route NOT IN (SELECT route FROM telecom.route_pauses)
                    AND NOT EXISTS (
                        SELECT 1 FROM telecom.outbox e
                        WHERE e.user_id = m.user_id AND e.published_at IS NULL
                          AND e.available_at <= now()
                          AND (e.handed_by IS DISTINCT FROM $16::uuid
                               OR e.handed_until IS NULL OR e.handed_until <= now()))
                    AS handed
             ) AS h
        ORDER BY m.ord
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING id, message_id, handed_until IS NOT NULL AS handed
        """,
        (
            *columns(messages, "message_id", "route", "message_type", "schema_version"),
            *columns(messages, "user_id", "seq", "body"),
            [json.dumps(m.headers) for m in messages],
            *columns(messages, "available_at", "cancel_key", "dedup_key", "priority"),
            *columns(messages, "expires_at"),
            wanted,
            handoff_s,
            handoff_by,
        ),
        # Its triggers count the puts (in transition_counts' 'put' rows, which no part writes)
        # and NOTIFY the relay, both when the statement ends (a relay woken for handed-off rows
        # only finds nothing due). It reads route_pauses.
        ("outbox", "route_pauses"),
        name="outbox_added",
        result=(
            "(SELECT ROW(count(*), coalesce(array_agg(id ORDER BY id) FILTER (WHERE handed), "
            "'{}'), coalesce(array_agg(message_id ORDER BY id) FILTER (WHERE handed), '{}')) "
            "FROM outbox_added)"
        ),
        decode=_added,
    )


def _added(row: Any) -> Added:
    count, ids, message_ids = row
    return Added(int(count), list(zip(ids, message_ids, strict=True)))


async def withdraw(conn: Conn, cancel_keys: Sequence[str]) -> int:
    """Delete still-unpublished scheduled rows by cancel key. Returns how many were withdrawn."""
    return await run(conn, withdraw_part(cancel_keys)) or 0


def withdraw_part(cancel_keys: Sequence[str]) -> Part[int] | None:
    """`withdraw` as a part of a batch's write statement. It never shares one with
    `enqueue_part` (both touch `outbox`): rows added after it are not withdrawn."""
    if not cancel_keys:
        return None
    return part_of(
        """
        DELETE FROM telecom.outbox WHERE cancel_key = ANY($1::text[]) AND published_at IS NULL
        RETURNING 1
        """,
        (list(cancel_keys),),
        ("outbox",),
        name="outbox_withdrawn",
        result="(SELECT count(*) FROM outbox_withdrawn)",
        decode=int,
    )


def retry_key(consumer: str, user_id: UUID | None, message_id: UUID) -> str:
    """The cancel key of a message's pending retry on a consumer (see `withdraw`): at most one
    is pending. The user is part of it: a copy of the message_id published for another user
    never withdraws this user's retry."""
    return f"retry:{consumer}:{user_id}:{message_id}"


async def withdraw_retries_of(conn: Conn, dead_letter_ids: Sequence[int]) -> int:
    """Withdraw the unpublished retries of these dead letters' messages on their consumers."""
    if not dead_letter_ids:
        return 0
    status = await conn.execute(
        """
        DELETE FROM telecom.outbox o USING telecom.dead_letters d
        WHERE d.id = ANY($1::bigint[]) AND o.published_at IS NULL
          AND o.cancel_key = 'retry:' || d.consumer || ':' || coalesce(d.user_id::text, 'None')
                             || ':' || d.message_uuid::text
        """,
        list(dead_letter_ids),
    )
    return int(status.split()[-1])


async def lease_partitions(conn: Conn, limit: int) -> list[int]:
    """Inside a transaction: take the advisory lease of every free partition with due rows.

    The leases last until the transaction ends. Reading rows must happen in a later statement, so
    that its snapshot is taken after the lease (and so after the previous holder's commit).
    """
    rows = await conn.fetch(
        """
        WITH due AS (
            SELECT p FROM generate_series(0, $2 - 1) AS p
            WHERE EXISTS (
                SELECT 1 FROM telecom.outbox o
                WHERE o.partition = p AND o.published_at IS NULL AND o.available_at <= now()
                  AND o.route NOT IN (SELECT route FROM telecom.route_pauses)
                  AND (o.handed_until IS NULL OR o.handed_until <= now())
            ) OR EXISTS (  -- expired rows are taken out whether paused or scheduled
                SELECT 1 FROM telecom.outbox o
                WHERE o.partition = p AND o.published_at IS NULL AND o.expires_at <= now()
            )
            ORDER BY random()
        )
        SELECT p FROM due WHERE pg_try_advisory_xact_lock($1, p) LIMIT $3
        """,
        RELAY_LOCK_CLASS,
        PARTITIONS,
        limit,
    )
    return [r["p"] for r in rows]


async def claim_due(conn: Conn, partitions: Sequence[int], batch_size: int) -> list[ClaimedRow]:
    # A row handed off to the process that wrote it (infra/outbox/handoff.py) is that
    # process's until its `handed_until`, and so is every later row of its user: published
    # now, such a row could reach its queue before the handed-off one.
    # The due set comes from the (partition, available_at) index and is then put in id order.
    # Walking pending rows in id order instead would step over every future timer on each round
    # (measured: 49 ms with 200k timers pending, against 1.2 ms this way).
    rows = await conn.fetch(
        """
        WITH due AS MATERIALIZED (
            SELECT id, priority FROM telecom.outbox o
            WHERE partition = ANY($1::int[]) AND published_at IS NULL AND available_at <= now()
              AND route NOT IN (SELECT route FROM telecom.route_pauses)
              AND (handed_until IS NULL OR handed_until <= now())
              -- nor any row behind a row of its user handed off to the process that wrote it
              AND NOT EXISTS (
                  SELECT 1 FROM telecom.outbox h
                  WHERE h.user_id = o.user_id AND h.published_at IS NULL AND h.id < o.id
                    AND h.handed_until > now())
            UNION  -- rows whose TTL ran out, even if paused or scheduled later: to be expired
            SELECT id, priority FROM telecom.outbox
            WHERE partition = ANY($1::int[]) AND published_at IS NULL AND expires_at <= now()
        )
        SELECT id, message_id, route, message_type, user_id, body, headers, available_at,
               priority, expires_at, seq,
               greatest(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint AS ttl_ms
        FROM telecom.outbox
        WHERE id IN (SELECT id FROM due ORDER BY priority DESC, id LIMIT $2)
          AND published_at IS NULL  -- re-checked after a lock wait, unlike the CTE's filter
        ORDER BY priority DESC, id
        FOR UPDATE
        """,
        list(partitions),
        batch_size,
    )
    return [from_row(ClaimedRow, r) for r in rows]


async def mark_published(conn: Conn, ids: Sequence[int]) -> None:
    if ids:
        await conn.execute(
            "UPDATE telecom.outbox SET published_at = now() WHERE id = ANY($1::bigint[])", list(ids)
        )


async def mark_failed(conn: Conn, ids: Sequence[int], error: str) -> None:
    if ids:
        await conn.execute(
            "UPDATE telecom.outbox SET publish_attempts = publish_attempts + 1, last_error = $2 "
            "WHERE id = ANY($1::bigint[])",
            list(ids),
            error[:2000],
        )


async def settle_handed(
    conn: Conn, published: Sequence[int], given_back: Sequence[int], error: str | None
) -> None:
    """After a hand-off (infra/outbox/handoff.py): mark the rows its process published, and
    give the others back to the relay at once (with the publish's error, if one failed) rather
    than when their time runs out. One statement, which wakes the relays if it gave a row back
    or if a published row's user has rows that waited behind it."""
    await conn.execute(
        """
        WITH published AS (
            UPDATE telecom.outbox SET published_at = now()
            WHERE id = ANY($1::bigint[]) AND published_at IS NULL
            RETURNING user_id
        ), given_back AS (
            UPDATE telecom.outbox
            SET handed_until = NULL,
                publish_attempts = publish_attempts + ($3::text IS NOT NULL)::int,
                last_error = coalesce($3, last_error)
            WHERE id = ANY($2::bigint[]) AND published_at IS NULL
            RETURNING 1
        )
        SELECT pg_notify('pkgq_outbox', '')
        WHERE EXISTS (SELECT 1 FROM given_back) OR EXISTS (
            SELECT 1 FROM telecom.outbox o
            WHERE o.user_id IN (SELECT user_id FROM published) AND o.published_at IS NULL
              AND o.handed_until IS NULL AND o.available_at <= now())
        """,
        list(published),
        list(given_back),
        error[:2000] if error is not None else None,
    )


async def withdraw_messages(
    conn: Conn, message_ids: Sequence[UUID]
) -> list[tuple[str, UUID | None, UUID]]:
    """Delete the messages that are not published yet. Returns the rows withdrawn, as (route,
    user_id, message_id): what each was, to release the hold it may be (holds.Blocker)."""
    rows = await conn.fetch(
        "DELETE FROM telecom.outbox WHERE message_id = ANY($1::uuid[]) AND published_at IS NULL "
        "RETURNING route, user_id, message_id",
        list(message_ids),
    )
    return [(r["route"], r["user_id"], r["message_id"]) for r in rows]


async def mark_expired(conn: Conn, ids: Sequence[int]) -> None:
    """Rows whose TTL ran out before they were published: never to be published."""
    await conn.execute(
        "UPDATE telecom.outbox SET published_at = now(), last_error = 'expired: not published' "
        "WHERE id = ANY($1::bigint[])",
        list(ids),
    )


async def emit(
    conn: Conn,
    user_id: UUID,
    outgoing: Sequence[Outgoing],
    *,
    traceparent: str | None = None,
) -> list[OutboxMessage]:
    """Number `outgoing` in the user's event sequence and insert it (user row must be locked)."""
    if not outgoing:
        return []
    seqs = await queue_repo.next_seqs(conn, user_id, len(outgoing))
    messages = [
        from_outgoing(out, seq=seq, traceparent=traceparent)
        for out, seq in zip(outgoing, seqs, strict=True)
    ]
    await enqueue(conn, messages)
    return messages


async def pause_route(conn: Conn, route: str, who: str) -> bool:
    """Hold the route's rows back from the relays. False: it was paused already.

    Returns once every relay round that was under way has finished (it takes each partition's
    lease in turn) and every row of the route handed off to a consumer's process is published
    or back with the relays, so no row of the route is published after this returns."""
    paused = bool(
        await conn.fetchval(
            "INSERT INTO telecom.route_pauses (route, paused_by) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING RETURNING true",
            route,
            who,
        )
    )
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1, p) FROM generate_series(0, $2 - 1) AS p",
            RELAY_LOCK_CLASS,
            PARTITIONS,
        )
        # Every batch that may hand rows off holds this lock shared from its start
        # (queue_repo.lock_users): the batches under way end first, and the later ones see
        # the pause, so they hand off none of the route's rows.
        await conn.execute("SELECT pg_advisory_xact_lock($1, 0)", HANDOFF_LOCK_CLASS)
    # Rows handed off before are their processes' until published or until their time runs
    # out (the processes stop publishing before it does): the relays, which see the pause,
    # have them after that.
    while True:
        waiting = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM telecom.outbox WHERE route = $1 "
            "AND published_at IS NULL AND handed_until > now())",
            route,
        )
        if not waiting:
            return paused
        await asyncio.sleep(0.05)


async def resume_route(conn: Conn, route: str) -> bool:
    status = await conn.execute("DELETE FROM telecom.route_pauses WHERE route = $1", route)
    await conn.execute("SELECT pg_notify('pkgq_outbox', '')")  # wake the relays
    return status.endswith(" 1")


async def route_status(conn: Conn, route: str) -> dict[str, object]:
    row = await conn.fetchrow(
        """
        SELECT (SELECT paused_at FROM telecom.route_pauses WHERE route = $1) AS paused_at,
               (SELECT paused_by FROM telecom.route_pauses WHERE route = $1) AS paused_by,
               (SELECT count(*) FROM telecom.outbox
                WHERE route = $1 AND published_at IS NULL) AS pending
        """,
        route,
    )
    assert row is not None  # a SELECT without FROM returns one row
    return dict(row)
