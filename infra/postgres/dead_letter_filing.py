"""Filing a dead letter: every message that could not be applied, as the store keeps it.

A filed dead letter is a record, not a slot: nothing filed later changes its body, headers,
publisher, reason or status (an operator's decision included). The same message (its key:
events/identity.py) with the same bytes failing again while its letter is still buried counts
as a repeat of that letter; anything else is a filing of its own: another publisher's or
user's message under the same message_id, or this message failing again after an operator
replayed or discarded its letter. A broker dead letter delivered twice to the ingester is the
same event, counted as a repeat.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from events.decoding import message_uuid
from events.envelope import clean_text
from events.identity import message_key
from events.routes import UNTRUSTED_PUBLISHER
from infra.postgres.pool import Conn

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
        """What tells two filings of one dead message apart from two dead messages. A consumer's
        letter of a message with a key: its consumer, key and bytes (a repeat while its letter
        is buried; stored with a suffix of its own, so that a filing after an operator replayed
        or discarded the letter is a row beside it: `stored_key`). An untrusted publisher's
        letters are marked so. A broker's: its message_id, verified publisher, death headers
        and body, so one death delivered twice is one letter."""
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

    @property
    def filed_by_key(self) -> bool:
        """A consumer's letter of a message with a key: a repeat is found by its key and bytes
        among the buried letters, and each filing is a row of its own."""
        return self.source == "consumer" and _key_of(self) is not None

    def stored_key(self) -> str:
        """The unique key it is stored under (see `dedup_key`)."""
        key = clean_text(self.dedup_key())
        return f"{key}:{uuid4().hex}" if self.filed_by_key else key


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
    per distinct `dedup_key` (the last of a key's letters in `buried` is the one stored).

    A filed dead letter is a record: a later filing never changes its body, headers,
    publisher, reason or status. The same message with the same bytes failing again while its
    letter is buried counts as a repeat of it (`repeats`, `last_failed_at`, `attempts`); a
    message that fails again after a replay or a discard is filed anew, beside the record of
    what the operator did. A broker dead letter delivered twice to the ingester is the same
    event (a repeat). A message_id is no proof of identity: another publisher's or user's
    message under it has a key, and so letters, of its own.
    """
    # One filing of a key's letters in one batch, its last (the same bytes, its count since).
    letters = list({clean_text(d.dedup_key()): d for d in buried}.values())
    if not letters:
        return []
    rows = await conn.fetch(
        """
        WITH x AS (
            SELECT * FROM unnest(
                $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::uuid[],
                $7::text[], $8::text[], $9::bytea[], $10::text[], $11::text[], $12::text[],
                $13::text[], $14::text[], $15::text[], $16::int[], $17::timestamptz[],
                $18::bigint[], $19::text[], $20::uuid[], $21::text[], $22::uuid[], $23::bool[])
                WITH ORDINALITY AS d(k, src, r, c, m, u, t, ct, b, h, rs, et, em, el, tb, a, ff,
                                     bs, sha, mu, pub, mk, by_key, ord)
        ), repeated AS (
            -- the same message, the same bytes, its letter still buried: a repeat of it
            UPDATE telecom.dead_letters d SET
                repeats = d.repeats + 1,
                attempts = greatest(d.attempts, x.a),
                last_failed_at = now()
            FROM x
            WHERE x.by_key AND d.source = 'consumer' AND d.status = 'buried'
              AND d.consumer = x.c AND d.message_key = x.mk AND d.body_sha256 = x.sha
              AND (d.reason = 'untrusted_publisher') = (x.rs = 'untrusted_publisher')
            RETURNING d.id, x.ord
        ), filed AS (
            INSERT INTO telecom.dead_letters
                (dedup_key, source, route, consumer, message_id, user_id, message_type,
                 content_type, body, headers, reason, error_type, error_message, error_location,
                 traceback, attempts, first_failed_at, body_size, body_sha256, message_uuid,
                 publisher, message_key, status)
            SELECT k, src, r, c, m, u, t, ct, b, h::jsonb, rs, et, em, el, tb, a,
                   coalesce(ff, now()), bs, sha, mu, pub, mk,
                   -- applied already (a broker copy of a message its consumer took)
                   CASE WHEN EXISTS (SELECT 1 FROM telecom.inbox i
                                     WHERE i.consumer = c AND i.message_id = mk)
                        THEN 'superseded' ELSE 'buried' END::telecom.dead_letter_status
            FROM x WHERE ord NOT IN (SELECT ord FROM repeated)
            ORDER BY ord
            -- a broker's dead letter delivered again: the same event
            ON CONFLICT (dedup_key) DO UPDATE SET
                repeats = dead_letters.repeats + 1,
                attempts = greatest(dead_letters.attempts, excluded.attempts),
                last_failed_at = now()
            RETURNING id
        )
        SELECT id FROM filed UNION SELECT id FROM repeated
        """,
        [d.stored_key() for d in letters],
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
        [d.filed_by_key for d in letters],
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
