"""A user's timeline: what pkgq recorded about one user, from every table that records it, in
one order (newest first), a page at a time.

Each source is one branch of a UNION ALL, read backwards along its own (user_id, time) index
(migration 0019) and cut to the page size before the union is sorted, so a page costs a few
short index ranges whatever the tables' sizes (tests/integration/test_user_timeline.py runs
EXPLAIN on it). The order is (at, rank, key), descending: `at` is the row's own time, `rank`
orders the sources within one instant from cause to effect (a received message before what its
transaction wrote), `key` is unique within a source. The cursor is the last row's triple.

What is not recorded cannot be shown: the inbox keeps no body (its row says which consumer
applied which message_id when); an item's consumption has no time of its own (the events
around it show it); holds and parked messages exist only while they last; the outbox, the inbox
and billed usage are pruned by retention (infra/postgres/retention.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from events import bounded_json
from infra.postgres.pool import Conn

BODY_KEPT = 4096
"""Bytes of a body read for its one-line summary: never the whole of a large body."""

RANKS = {
    "inbox": 1,
    "operator": 2,
    "audit": 3,
    "item": 4,
    "activation": 5,
    "usage": 6,
    "dead_letter": 7,
    "hold": 8,
    "parked": 9,
    "outbox": 10,
}
"""Within one instant (one transaction's now()), cause before effect."""

_TIME_LAST = datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page starts: strictly after (older than) this row of the order."""

    at: datetime
    rank: int
    key: str

    def cursor(self) -> str:
        micros = int(self.at.timestamp()) * 1_000_000 + self.at.microsecond
        return f"{micros}.{self.rank}.{self.key}"


def position_of(cursor: str) -> Position:
    """A cursor (`Position.cursor`) read back; ValueError when it is not one."""
    micros, rank, key = cursor.split(".", 2)
    if not (micros.isascii() and micros.isdigit() and rank.isascii() and rank.isdigit()):
        raise ValueError(f"{cursor!r} is not a timeline cursor")
    seconds, fraction = divmod(int(micros), 1_000_000)
    at = datetime.fromtimestamp(seconds, UTC).replace(microsecond=fraction)
    return Position(at, int(rank), key)


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing that happened to the user. `source` is the table (inbox, outbox, item,
    activation, usage, audit, operator, dead_letter, hold, parked), `kind` what happened."""

    at: datetime
    source: str
    kind: str
    key: str
    message_id: UUID | None
    route: str | None
    item_id: int | None
    dead_letter_id: int | None
    body: bytes | None
    detail: dict[str, Any]

    @property
    def position(self) -> Position:
        return Position(self.at, RANKS[self.source], self.key)


@dataclass(frozen=True, slots=True)
class Page:
    entries: list[Entry]
    more: bool
    """Whether older entries follow (the last entry's position is the next page's cursor)."""


def _branch(rank: int, select: str, table: str, where: str, at: str, key: str) -> str:
    """One source: its rows for user $1 before the cursor ($2, $3, $4), newest first, $5 at
    most. `at <= $2` is the index range; the row comparison settles ties at the cursor."""
    return f"""(
        SELECT {at} AS at, {rank} AS rank, {key} AS key, {select}
        FROM {table}
        WHERE {where} AND {at} <= $2 AND ({at}, {rank}, {key}) < ($2, $3, $4)
        ORDER BY {at} DESC, {key} DESC
        LIMIT $5)"""


def _body(column: str) -> str:
    return f"substring({column} FROM 1 FOR {BODY_KEPT})"


_ID = "lpad({}::text, 19, '0')"
_BRANCHES = (
    _branch(
        RANKS["inbox"],
        "'inbox' AS source, 'received' AS kind, coalesce(x.sent_as, x.message_id) AS message_id, "
        "'telecom.' || x.consumer AS route, "
        "NULL::bigint AS item_id, NULL::bigint AS dead_letter_id, NULL::bytea AS body, "
        "jsonb_build_object('consumer', x.consumer) AS detail",
        "telecom.inbox x",
        "x.user_id = $1",
        "x.processed_at",
        "x.consumer || ':' || x.message_id::text",
    ),
    _branch(
        RANKS["operator"],
        "'operator', o.action, o.message_id, NULL, o.item_id, o.dead_letter_id, NULL, "
        "o.detail || jsonb_build_object('actor', o.actor)",
        "telecom.operator_actions o",
        "o.user_id = $1",
        "o.at",
        _ID.format("o.id"),
    ),
    # An operator's action on one of the user's dead letters names the dead letter, not always
    # the user (a replay or discard from the dead-letter pages): found through it.
    _branch(
        RANKS["operator"],
        "'operator', o.action, o.message_id, NULL, o.item_id, o.dead_letter_id, NULL, "
        "o.detail || jsonb_build_object('actor', o.actor)",
        "telecom.dead_letters d JOIN telecom.operator_actions o ON o.dead_letter_id = d.id",
        "d.user_id = $1 AND o.user_id IS NULL",
        "o.at",
        _ID.format("o.id"),
    ),
    _branch(
        RANKS["audit"],
        "'audit', a.action, a.message_id, NULL, a.item_id, NULL, NULL, jsonb_build_object("
        "'delta', a.delta, 'reason', a.reason, 'operator', a.operator, 'publisher', a.publisher)",
        "telecom.item_audit a",
        "a.user_id = $1",
        "a.at",
        _ID.format("a.id"),
    ),
    _branch(
        RANKS["item"],
        "'item', 'created', NULL, NULL, i.id, NULL, NULL, jsonb_build_object("
        "'package', i.package_name, 'by_order', i.by_order, 'status', i.status)",
        "telecom.package_queue i",
        "i.user_id = $1",
        "i.created_at",
        _ID.format("i.id"),
    ),
    _branch(
        RANKS["activation"],
        "'activation', 'activated', NULL, NULL, i.id, NULL, NULL, jsonb_build_object("
        "'package', i.package_name, 'expire_at', i.expire_at, 'status', i.status)",
        "telecom.package_queue i",
        "i.user_id = $1 AND i.activated_at IS NOT NULL",
        "i.activated_at",
        _ID.format("i.id"),
    ),
    _branch(
        RANKS["usage"],
        "'usage', 'billed', u.message_id, NULL, u.item_id, NULL, NULL, jsonb_build_object("
        "'usage_id', u.usage_id, 'upload', u.upload, 'download', u.download, "
        "'recorded_at', u.recorded_at)",
        "telecom.usage_billed u",
        "u.user_id = $1",
        "u.billed_at",
        "u.usage_id",
    ),
    _branch(
        RANKS["dead_letter"],
        "'dead_letter', e.kind, d.message_uuid, d.route, NULL, d.id, "
        + _body("d.body")
        + ", jsonb_build_object('reason', d.reason, 'error_type', d.error_type, "
        "'error', left(d.error_message, 300), 'status', d.status, 'attempts', d.attempts, "
        "'replay_count', d.replay_count, 'by', e.who, 'message_type', d.message_type)",
        "telecom.dead_letters d CROSS JOIN LATERAL (VALUES "
        "('dead_lettered', d.first_failed_at, NULL), ('replayed', d.replayed_at, d.replayed_by), "
        "('discarded', d.discarded_at, d.discarded_by), ('superseded', d.superseded_at, NULL)"
        ") AS e(kind, at, who)",
        "d.user_id = $1 AND e.at IS NOT NULL",
        "e.at",
        _ID.format("d.id") + " || ':' || e.kind",
    ),
    _branch(
        RANKS["hold"],
        "'hold', 'held_' || h.state, h.blocker, 'telecom.' || h.consumer, NULL, NULL, NULL, "
        "jsonb_build_object('consumer', h.consumer, 'attempts', h.attempts, "
        "'last_error', left(h.last_error, 300), 'updated_at', h.updated_at)",
        "telecom.holds h",
        "h.user_id = $1",
        "h.since",
        "h.consumer",
    ),
    _branch(
        RANKS["parked"],
        "'parked', 'parked', coalesce(p.sent_as, p.message_id) AS message_id, p.route, NULL, NULL, "
        + _body("p.body")
        + ", jsonb_build_object('consumer', p.consumer, 'message_type', p.message_type)",
        "telecom.parked p",
        "p.user_id = $1",
        "p.parked_at",
        _ID.format("p.id"),
    ),
    _branch(
        RANKS["outbox"],
        "'outbox', CASE WHEN b.dedup_key LIKE 'replay:%' THEN 'replay' "
        "WHEN b.dedup_key LIKE 'retry:%' THEN 'retry' "
        "WHEN b.available_at > b.created_at THEN 'scheduled' ELSE 'published' END, "
        "b.message_id, b.route, NULL, "
        "CASE WHEN b.dedup_key LIKE 'replay:%' THEN split_part(b.dedup_key, ':', 2)::bigint END, "
        + _body("b.body")
        + ", jsonb_build_object('message_type', b.message_type, 'available_at', b.available_at, "
        "'published_at', b.published_at, 'attempt', b.headers->'x-attempt', "
        "'last_error', b.headers->>'x-pkgq-last-error', 'publish_error', b.last_error)",
        "telecom.outbox b",
        "b.user_id = $1",
        "b.created_at",
        _ID.format("b.id"),
    ),
)
TIMELINE_SQL = (
    "SELECT * FROM (\n"
    + "\n    UNION ALL ".join(_BRANCHES)
    + "\n) t ORDER BY at DESC, rank DESC, key DESC LIMIT $5"
)
"""The page statement: $1 user, ($2, $3, $4) the cursor, $5 the page size plus one."""


async def page(conn: Conn, user_id: UUID, after: Position | None, size: int) -> Page:
    """Up to `size` entries of the user's timeline, newest first, older than `after`."""
    start = after or Position(_TIME_LAST, 0, "")
    rows = await conn.fetch(TIMELINE_SQL, user_id, start.at, start.rank, start.key, size + 1)
    entries = [
        Entry(
            at=r["at"],
            source=r["source"],
            kind=r["kind"],
            key=r["key"],
            message_id=r["message_id"],
            route=r["route"],
            item_id=r["item_id"],
            dead_letter_id=r["dead_letter_id"],
            body=bytes(r["body"]) if r["body"] is not None else None,
            detail=bounded_json.detail_of(r["detail"]),
        )
        for r in rows[:size]
    ]
    return Page(entries, len(rows) > size)


async def explain(conn: Conn, user_id: UUID, size: int) -> str:
    """The plan of a first page (EXPLAIN, not run): what the index-use test reads."""
    lines = await conn.fetch("EXPLAIN " + TIMELINE_SQL, user_id, _TIME_LAST, 0, "", size + 1)
    return "\n".join(r[0] for r in lines)
