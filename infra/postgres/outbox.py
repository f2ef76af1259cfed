"""The outbox table: messages committed with the state change that caused them.

Writers insert rows inside their transaction; the relay (infra/outbox/relay.py) claims due rows
partition by partition, publishes them and marks them published.
"""

from __future__ import annotations

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


async def enqueue(conn: Conn, messages: Sequence[OutboxMessage]) -> int:
    """Insert the messages in order. Returns how many were inserted: a message whose
    `dedup_key` is already there is skipped."""
    return await run(conn, enqueue_part(messages)) or 0


def enqueue_part(messages: Sequence[OutboxMessage]) -> Part[int] | None:
    """`enqueue` as a part of a batch's write statement (infra/postgres/compound.py)."""
    if not messages:
        return None
    return part_of(
        """
        INSERT INTO telecom.outbox
            (message_id, route, message_type, schema_version, user_id, seq, body, headers,
             available_at, cancel_key, dedup_key, priority, expires_at)
        SELECT m.message_id, m.route, m.message_type, m.schema_version, m.user_id, m.seq, m.body,
               m.headers::jsonb, coalesce(m.available_at, now()), m.cancel_key, m.dedup_key,
               m.priority, m.expires_at
        FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::uuid[], $6::bigint[],
                    $7::bytea[], $8::text[], $9::timestamptz[], $10::text[], $11::text[],
                    $12::smallint[], $13::timestamptz[])
             WITH ORDINALITY AS m(message_id, route, message_type, schema_version, user_id, seq,
                                  body, headers, available_at, cancel_key, dedup_key, priority,
                                  expires_at, ord)
        ORDER BY m.ord
        ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
        RETURNING 1
        """,
        (
            *columns(messages, "message_id", "route", "message_type", "schema_version"),
            *columns(messages, "user_id", "seq", "body"),
            [json.dumps(m.headers) for m in messages],
            *columns(messages, "available_at", "cancel_key", "dedup_key", "priority"),
            *columns(messages, "expires_at"),
        ),
        # Its triggers count the puts (in transition_counts' 'put' rows, which no part writes)
        # and NOTIFY the relay, both when the statement ends.
        ("outbox",),
        name="outbox_added",
        result="(SELECT count(*) FROM outbox_added)",
        decode=int,
    )


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


def retry_key(consumer: str, key: UUID) -> str:
    """The cancel key of a message's pending retry on a consumer (see `withdraw`): at most one
    is pending. `key` is the message's (events/identity.py): a copy of its message_id sent by
    another publisher or for another user never withdraws this one's retry."""
    return f"retry:{consumer}:{key}"


async def withdraw_retries_of(conn: Conn, dead_letter_ids: Sequence[int]) -> int:
    """Withdraw the unpublished retries of these dead letters' messages (by key) on their
    consumers."""
    if not dead_letter_ids:
        return 0
    status = await conn.execute(
        """
        DELETE FROM telecom.outbox o USING telecom.dead_letters d
        WHERE d.id = ANY($1::bigint[]) AND o.published_at IS NULL
          AND o.cancel_key = 'retry:' || d.consumer || ':' || d.message_key::text
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
    # The due set comes from the (partition, available_at) index and is then put in id order.
    # Walking pending rows in id order instead would step over every future timer on each round
    # (measured: 49 ms with 200k timers pending, against 1.2 ms this way).
    rows = await conn.fetch(
        """
        WITH due AS MATERIALIZED (
            SELECT id, priority FROM telecom.outbox
            WHERE partition = ANY($1::int[]) AND published_at IS NULL AND available_at <= now()
              AND route NOT IN (SELECT route FROM telecom.route_pauses)
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


async def withdraw_members(
    conn: Conn, group_id: UUID, message_ids: Sequence[UUID]
) -> list[tuple[UUID, str | None, UUID | None]]:
    """Delete the group's member messages (and their retries) that are not published yet: the
    rows under these message_ids that carry the group's mark (pkgq's own: another publisher's
    copy under a member's id keeps its marks only as claims, and is not the group's). Returns
    the rows withdrawn, as (message_id, cancel_key, user_id): a retry's cancel key
    (`retry_key`) and user say which hold it may be (holds.blocker_of_retry)."""
    rows = await conn.fetch(
        "DELETE FROM telecom.outbox WHERE message_id = ANY($1::uuid[]) AND published_at IS NULL "
        "AND headers ->> 'x-pkgq-group' = $2 RETURNING message_id, cancel_key, user_id",
        list(message_ids),
        str(group_id),
    )
    return [(r["message_id"], r["cancel_key"], r["user_id"]) for r in rows]


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
    lease in turn), so no row of the route is published after this returns."""
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
    return paused


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
