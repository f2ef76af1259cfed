"""The dead-letter store: every message that could not be applied, why, and what became of it.

Rows are written by the consumers (bad input, broken domain rules, retries exhausted) and by the
dead-letter ingester (messages the broker dead-lettered on its own). Operators list, group,
replay and discard them with `pkgq dlq …` (consumers/cli/dlq.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from events import bounded_json
from infra.postgres import holds, outbox
from infra.postgres.dead_letter_filing import MAX_STORED_BODY as MAX_STORED_BODY
from infra.postgres.dead_letter_filing import VOLATILE_HEADERS as VOLATILE_HEADERS
from infra.postgres.dead_letter_filing import NewDeadLetter as NewDeadLetter
from infra.postgres.dead_letter_filing import bury as bury
from infra.postgres.dead_letter_filing import bury_many as bury_many
from infra.postgres.holds import HOLD_KEY
from infra.postgres.pool import Conn

STATUSES = ("buried", "replayed", "discarded", "superseded")
"""`superseded`: its message was applied by its consumer since (or before) it was filed; it is
never replayed (migration 0014)."""


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


HELD_BACK = f"""
    (SELECT count(*) FROM telecom.parked p
     JOIN telecom.holds h ON h.consumer = p.consumer AND h.user_id = p.user_id
     WHERE p.consumer = d.consumer AND h.user_id = d.user_id AND {HOLD_KEY} = d.message_key
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
        f"""
        SELECT 1 FROM telecom.holds h
        WHERE (h.consumer, h.user_id, {HOLD_KEY}) IN (
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


_PURGEABLE = f"""
    WHERE d.status IN ('replayed', 'discarded', 'superseded')
      AND greatest(d.last_failed_at, d.replayed_at, d.discarded_at, d.superseded_at)
          < now() - $1::interval
      AND NOT EXISTS (
          SELECT 1 FROM telecom.holds h
          WHERE h.consumer = d.consumer AND h.user_id = d.user_id AND {HOLD_KEY} = d.message_key)
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
