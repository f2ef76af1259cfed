"""The dead-letter store: every message that could not be applied, why, and what became of it.

Rows are written by the consumers (bad input, broken domain rules, retries exhausted) and by the
dead-letter ingester (messages the broker dead-lettered on its own). Operators list, group,
replay and discard them with `pkgq dlq …` (consumers/cli/dlq.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from events import bounded_json
from events.decoding import message_uuid
from events.envelope import clean_text
from events.identity import message_key
from events.routes import UNTRUSTED_PUBLISHER
from infra.postgres import holds, outbox
from infra.postgres.pool import Conn

STATUSES = ("buried", "replayed", "discarded", "superseded")
"""`superseded`: its message was applied by its consumer since (or before) it was filed; it is
never replayed (migration 0014)."""
MAX_STORED_BODY = 64 * 1024
"""A longer body is stored as its first 64 KiB, with its full size and sha256."""


@dataclass(frozen=True, slots=True)
class NewDeadLetter:
    source: str
    """`consumer` (pkgq gave up on it) or `broker` (RabbitMQ dead-lettered it)."""
    route: str
    consumer: str
    message_id: str | None
    user_id: UUID | None
    message_type: str | None
    content_type: str | None
    body: bytes
    headers: dict[str, Any]
    """JSON-ready (events.envelope.jsonable)."""
    reason: str
    error_type: str
    error_message: str
    error_location: str = ""
    traceback: str | None = None
    attempts: int = 1
    first_failed_at: datetime | None = None
    publisher: str | None = None
    """Who published the message first, as the broker verified it (events.envelope.publisher_of:
    its AMQP user_id, or `unverified`); None: not known. A replay on a route only pkgq publishes
    is refused unless it is pkgq (infra/postgres/replay.py)."""
    message_key: UUID | None = None
    """The message's key (events/identity.py: message_id, first publisher, the body's user);
    None when its message_id is no UUID. Holds, retries and the inbox match it on this."""

    def dedup_key(self) -> str:
        """One row per dead message, while it is buried: the same message (its key) with the
        same bytes failing again counts as a repeat of it. Another publisher's or user's
        message under the same message_id has another key, so a letter of its own; so has
        this message once an operator replayed or discarded its letter (the unique index
        covers buried rows only: migration 0022), so the operator's decision stands."""
        if self.source == "consumer" and self.message_id:
            untrusted = "untrusted:" if self.reason == UNTRUSTED_PUBLISHER else ""
            known_as = _key_of(self) or f"{self.message_id}:{self.publisher}"
            digest = hashlib.sha256(self.body).hexdigest()[:32]
            return f"{untrusted}{self.consumer}:{known_as}:{digest}"
        if self.source == "broker":
            # Its message_id and verified publisher too: two messages with the same body and
            # headers, dead-lettered from one queue for one reason, are two letters.
            who = [_death_identity(self.headers), self.message_id, self.publisher]
            identity = json.dumps(who, sort_keys=True).encode()
        else:
            identity = json.dumps(self.headers, sort_keys=True).encode()
        raw = identity + b"\0" + self.body
        return f"{self.source}:{self.consumer}:{hashlib.sha256(raw).hexdigest()}"


VOLATILE_HEADERS = frozenset({"x-delivery-count"})
"""Headers a copy of the same broker dead letter may carry differently: a quorum dead-letter
queue counts its own redeliveries (a killed ingester) in `x-delivery-count`."""


def _death_identity(headers: dict[str, Any]) -> dict[str, Any]:
    """A broker dead letter's headers without what differs between two copies of the one death:
    `x-delivery-count`, and the `time` of each `x-death` entry. A quorum queue's at-least-once
    dead-lettering sends a message again when the target's confirm is lost (a node killed, a
    leader elected), and stamps the copy anew. Two deaths of one message in one queue for one
    reason still differ: their `x-death` counts do."""
    kept = {k: v for k, v in headers.items() if k not in VOLATILE_HEADERS}
    deaths = kept.get("x-death")
    if isinstance(deaths, list):
        kept["x-death"] = [
            {k: v for k, v in d.items() if k != "time"} if isinstance(d, dict) else d
            for d in deaths
        ]
    return kept


async def bury(conn: Conn, dead: NewDeadLetter) -> int:
    """Store one dead letter (see `bury_many`). Returns its id."""
    (dead_letter_id,) = await bury_many(conn, [dead])
    return dead_letter_id


async def bury_many(conn: Conn, buried: Sequence[NewDeadLetter]) -> list[int]:
    """Store dead letters in one statement. Returns their ids (in no particular order), one
    per distinct dedup key as stored (the first of a key's letters is the one stored).

    A filed dead letter is a record: a later filing never changes its body, headers,
    publisher, reason or status. The same message with the same bytes failing again while its
    letter is buried counts as a repeat of it (`repeats`, `last_failed_at`, `attempts`); a
    message that fails again after a replay or a discard is filed anew, beside the record of
    what the operator did. A broker dead letter delivered twice to the ingester is the same
    event (a repeat). A message_id is no proof of identity: another publisher's or user's
    message under it has a key, and so letters, of its own.
    """
    letters: list[NewDeadLetter] = []
    keys: set[str] = set()
    for letter in buried:  # the first of a key's letters is the record
        if (key := clean_text(letter.dedup_key())) not in keys:
            keys.add(key)
            letters.append(letter)
    if not letters:
        return []
    rows = await conn.fetch(
        """
        INSERT INTO telecom.dead_letters
            (dedup_key, source, route, consumer, message_id, user_id, message_type,
             content_type, body, headers, reason, error_type, error_message, error_location,
             traceback, attempts, first_failed_at, body_size, body_sha256, message_uuid,
             publisher, message_key, status)
        SELECT k, src, r, c, m, u, t, ct, b, h::jsonb, rs, et, em, el, tb, a,
               coalesce(ff, now()), bs, sha, mu, pub, mk,
               -- applied already (a broker copy of a message its consumer took): superseded
               CASE WHEN EXISTS (SELECT 1 FROM telecom.inbox i
                                 WHERE i.consumer = c AND i.message_key = mk)
                    THEN 'superseded' ELSE 'buried' END::telecom.dead_letter_status
        FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::uuid[],
                    $7::text[], $8::text[], $9::bytea[], $10::text[], $11::text[], $12::text[],
                    $13::text[], $14::text[], $15::text[], $16::int[], $17::timestamptz[],
                    $18::bigint[], $19::text[], $20::uuid[], $21::text[], $22::uuid[])
             WITH ORDINALITY AS d(k, src, r, c, m, u, t, ct, b, h, rs, et, em, el, tb, a, ff,
                                  bs, sha, mu, pub, mk, ord)
        ORDER BY ord
        ON CONFLICT (dedup_key) WHERE status = 'buried' OR source <> 'consumer' DO UPDATE SET
            repeats = dead_letters.repeats + 1,
            attempts = greatest(dead_letters.attempts, excluded.attempts),
            last_failed_at = now()
        RETURNING id
        """,
        [clean_text(d.dedup_key()) for d in letters],
        [d.source for d in letters],
        [clean_text(d.route) for d in letters],
        [clean_text(d.consumer) for d in letters],
        [_clean(d.message_id) for d in letters],
        [d.user_id for d in letters],
        [_clean(d.message_type) for d in letters],
        [_clean(d.content_type) for d in letters],
        [d.body[:MAX_STORED_BODY] for d in letters],
        [json.dumps(d.headers) for d in letters],
        [clean_text(d.reason) for d in letters],
        [clean_text(d.error_type[:500]) for d in letters],
        [clean_text(d.error_message[:4000]) for d in letters],
        [clean_text(d.error_location[:500]) for d in letters],
        [_clean(d.traceback[-16000:] if d.traceback else None) for d in letters],
        [max(-(2**31), min(d.attempts, 2**31 - 1)) for d in letters],
        [d.first_failed_at for d in letters],
        [len(d.body) for d in letters],
        [hashlib.sha256(d.body).hexdigest() for d in letters],
        [message_uuid(d.message_id) for d in letters],
        [_clean(d.publisher) for d in letters],
        [_key_of(d) for d in letters],
    )
    return [int(r["id"]) for r in rows]


def _key_of(letter: NewDeadLetter) -> UUID | None:
    """A letter's key as given, else worked out from its message_id, publisher and user."""
    if letter.message_key is not None:
        return letter.message_key
    uuid = message_uuid(letter.message_id)
    return None if uuid is None else message_key(uuid, letter.publisher, letter.user_id)


def _clean(value: str | None) -> str | None:
    return None if value is None else clean_text(value)


@dataclass(frozen=True, slots=True)
class Filter:
    """Which dead letters an operator command applies to. Empty fields match everything."""

    ids: Sequence[int] = ()
    route: str | None = None
    error: str | None = None
    """Case-insensitive substring of the reason, error type or error message."""
    group: str | None = None
    user_id: UUID | None = None
    since: datetime | None = None
    older_than: datetime | None = None
    status: str | None = None
    limit: int | None = None

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []

        def add(sql: str, value: Any) -> None:
            args.append(value)
            clauses.append(sql.replace("$?", f"${len(args)}"))

        if self.ids:
            add("d.id = ANY($?::bigint[])", list(self.ids))
        if self.route:
            add("d.route = $?", self.route)
        if self.error:  # a literal substring: % and _ typed by an operator are not wildcards
            literal = self.error.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            add(
                "(d.reason || ' ' || d.error_type || ' ' || d.error_message) ILIKE $?",
                f"%{literal}%",
            )
        if self.group:
            add("d.group_key = $?", self.group)
        if self.user_id:
            add("d.user_id = $?", self.user_id)
        if self.since:
            add("d.last_failed_at >= $?", self.since)
        if self.older_than:
            add("d.last_failed_at < $?", self.older_than)
        if self.status:
            add("d.status = $?::telecom.dead_letter_status", self.status)
        return (" AND ".join(clauses) or "true"), args


HELD_BACK = """
    (SELECT count(*) FROM telecom.parked p
     JOIN telecom.holds h ON h.consumer = p.consumer AND h.user_id = p.user_id
     WHERE p.consumer = d.consumer AND h.user_id = d.user_id AND h.blocker_key = d.message_key
       AND d.status = 'buried')
"""


async def find(conn: Conn, which: Filter) -> list[dict[str, Any]]:
    """Matching dead letters, oldest first, with how many parked messages each holds back."""
    where, args = which.where()
    limit = f"LIMIT {int(which.limit)}" if which.limit else ""
    rows = await conn.fetch(
        f"""
        SELECT d.id, d.status::text AS status, d.route, d.consumer, d.message_id, d.user_id,
               d.reason, d.error_type, d.error_message, d.error_location, d.group_key,
               d.attempts, d.first_failed_at, d.last_failed_at, d.source, d.replay_count,
               d.replayed_at, d.replayed_by, d.discarded_at, d.discarded_by, d.publisher,
               {HELD_BACK} AS held_back
        FROM telecom.dead_letters d
        WHERE {where}
        ORDER BY d.first_failed_at, d.id
        {limit}
        """,
        *args,
    )
    return [dict(r) for r in rows]


async def get(conn: Conn, dead_letter_id: int) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        f"""
        SELECT d.*, d.status::text AS status, d.headers::text AS headers, {HELD_BACK} AS held_back
        FROM telecom.dead_letters d WHERE d.id = $1
        """,
        dead_letter_id,
    )
    return None if row is None else dict(row)


async def groups(conn: Conn, status: str | None = "buried") -> list[dict[str, Any]]:
    """Failures grouped by reason, error type and the code location that raised them."""
    where, args = Filter(status=status).where()
    rows = await conn.fetch(
        f"""
        SELECT d.group_key, d.reason, d.error_type, d.error_location, count(*) AS count,
               array_agg(DISTINCT d.route ORDER BY d.route) AS routes,
               min(d.first_failed_at) AS first_seen, max(d.last_failed_at) AS last_seen,
               (array_agg(d.error_message ORDER BY d.last_failed_at DESC))[1] AS example
        FROM telecom.dead_letters d
        WHERE {where}
        GROUP BY d.group_key, d.reason, d.error_type, d.error_location
        ORDER BY count(*) DESC, max(d.last_failed_at) DESC
        """,
        *args,
    )
    return [dict(r) for r in rows]


def as_dict(value: Any) -> dict[str, Any]:
    """A jsonb value, whether or not the connection has the JSON codec (pool.py) installed."""
    return dict(bounded_json.detail_of(value)) if value else {}


async def lock_holds(conn: Conn, ids: Sequence[int]) -> None:
    """Lock the holds these dead letters block (each on its own consumer and user: see
    holds.release_discarded), before the dead letters themselves: the order a delivery takes
    them in, so that an operator command and a delivery cannot deadlock."""
    await conn.execute(
        """
        SELECT 1 FROM telecom.holds h
        WHERE (h.consumer, h.user_id, h.blocker_key) IN (
            SELECT d.consumer, d.user_id, d.message_key FROM telecom.dead_letters d
            WHERE d.id = ANY($1::bigint[]))
        ORDER BY h.consumer, h.user_id
        FOR UPDATE OF h
        """,
        list(ids),
    )


async def lock_replayable(conn: Conn, ids: Sequence[int], statuses: Sequence[str]) -> list[Any]:
    """Inside a transaction: lock the dead letters with these ids and statuses, oldest first,
    with what a replay needs of them."""
    rows: list[Any] = await conn.fetch(
        """
        SELECT id, route, message_id, user_id, message_type, body, headers::text AS headers,
               replay_count, reason, body_size, status::text AS status, publisher,
               message_key
        FROM telecom.dead_letters
        WHERE id = ANY($1::bigint[]) AND status::text = ANY($2::text[])
        ORDER BY first_failed_at, id
        FOR UPDATE
        """,
        list(ids),
        list(statuses),
    )
    return rows


async def mark_replayed(conn: Conn, ids: Sequence[int], who: str) -> None:
    await conn.execute(
        """
        UPDATE telecom.dead_letters
        SET status = 'replayed', replay_count = replay_count + 1, replayed_at = now(),
            replayed_by = $2
        WHERE id = ANY($1::bigint[])
        """,
        list(ids),
        who,
    )


async def discard(conn: Conn, ids: Sequence[int], who: str) -> int:
    """Inside a transaction: give up on buried dead letters; release what they held back."""
    await lock_holds(conn, ids)
    discarded = await conn.fetch(
        """
        UPDATE telecom.dead_letters
        SET status = 'discarded', discarded_at = now(), discarded_by = $2
        WHERE id = ANY($1::bigint[]) AND status = 'buried'
        RETURNING id
        """,
        list(ids),
        who,
    )
    gone = [row["id"] for row in discarded]
    # A copy of the message that came again after its burial may have failed and be waiting
    # for a retry: given up on, it is not retried behind the operator's back.
    await outbox.withdraw_retries_of(conn, gone)
    await holds.release_discarded(conn, gone)
    return len(discarded)


async def purge(conn: Conn, older_than: timedelta) -> int:
    """Delete replayed and discarded dead letters last touched before `older_than` ago.

    Buried ones are never purged: discard them first, so that nothing is dropped unseen. Nor
    is a replayed one whose message still holds its user back (its replay is being retried).
    """
    status = await conn.execute(f"DELETE FROM telecom.dead_letters d {_PURGEABLE}", older_than)
    return int(status.split()[-1])


_PURGEABLE = """
    WHERE d.status IN ('replayed', 'discarded', 'superseded')
      AND greatest(d.last_failed_at, d.replayed_at, d.discarded_at, d.superseded_at)
          < now() - $1::interval
      AND NOT EXISTS (
          SELECT 1 FROM telecom.holds h
          WHERE h.consumer = d.consumer AND h.user_id = d.user_id AND h.blocker_key = d.message_key)
"""
"""The dead letters `purge` deletes ($1: how old they must be)."""


async def count_purgeable(conn: Conn, older_than: timedelta) -> int:
    """How many dead letters `purge(conn, older_than)` would delete now (`dlq purge --dry-run`)."""
    count = await conn.fetchval(
        f"SELECT count(*) FROM telecom.dead_letters d {_PURGEABLE}", older_than
    )
    return int(count)


async def find_by_message_id(conn: Conn, message_id: str) -> dict[str, Any] | None:
    """The dead letter of a message (its id, reason and error), if one is filed."""
    row = await conn.fetchrow(
        "SELECT id, reason, error_message FROM telecom.dead_letters WHERE message_id = $1 "
        "ORDER BY id LIMIT 1",
        message_id,
    )
    return None if row is None else dict(row)
