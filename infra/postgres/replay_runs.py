"""Replay runs (migration 0026): a paced replay of many dead letters as a record, its frozen set
(the letters it was started on, in the order it sends them), its progress and its state.

What failed again is read from the dead letters themselves, set-based: a replayed message that
is dead-lettered again is filed as a new letter (infra/postgres/dead_letter_filing.py: a letter
is a record, never overwritten), of the same consumer and message key, filed after the run sent
it. One that was applied marks its letter `superseded` (infra/postgres/inbox.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra.postgres.pool import Conn

STATES = ("running", "stopped_failing", "stopped_breaker", "done", "cancelled")
RESUMABLE = ("stopped_failing", "stopped_breaker", "cancelled")
STALE_AFTER_S = 60.0
"""A `running` run whose runner has not written for this long is taken to be gone (its
process killed): it may be resumed."""


@dataclass(frozen=True, slots=True)
class NewRun:
    ids: Sequence[int]
    """The frozen set, in the order it is sent (oldest first)."""
    started_by: str
    description: str
    transition: str
    rate: float | None
    check_first: int
    max_failed: float
    min_decided: int


async def create(conn: Conn, run: NewRun) -> int:
    """Record a run and its frozen set (in one transaction). Returns its id."""
    async with conn.transaction():
        run_id: int = await conn.fetchval(
            """
            INSERT INTO telecom.replay_runs
                (started_by, description, transition, rate, check_first, max_failed,
                 min_decided, total, routes)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                    ARRAY(SELECT DISTINCT route FROM telecom.dead_letters
                          WHERE id = ANY($9::bigint[]) ORDER BY route))
            RETURNING id
            """,
            run.started_by,
            run.description,
            run.transition,
            run.rate,
            run.check_first,
            run.max_failed,
            run.min_decided,
            len(run.ids),
            list(run.ids),
        )
        await conn.execute(
            """
            INSERT INTO telecom.replay_run_letters (run_id, position, dead_letter_id)
            SELECT $1, p, i FROM unnest($2::bigint[]) WITH ORDINALITY AS x(i, p)
            """,
            run_id,
            list(run.ids),
        )
    return run_id


async def get(conn: Conn, run_id: int) -> dict[str, Any] | None:
    row = await conn.fetchrow(
        """
        SELECT r.*,
               extract(epoch FROM coalesce(r.finished_at, now()) - r.leg_started_at)::float8
                   AS leg_seconds,
               extract(epoch FROM now() - r.heartbeat_at)::float8 AS silent_seconds
        FROM telecom.replay_runs r WHERE r.id = $1
        """,
        run_id,
    )
    return None if row is None else dict(row)


async def recent(conn: Conn, limit: int = 50) -> list[dict[str, Any]]:
    """The latest runs, newest first."""
    rows = await conn.fetch(
        """
        SELECT r.*,
               extract(epoch FROM coalesce(r.finished_at, now()) - r.leg_started_at)::float8
                   AS leg_seconds,
               extract(epoch FROM now() - r.heartbeat_at)::float8 AS silent_seconds
        FROM telecom.replay_runs r ORDER BY r.id DESC LIMIT $1
        """,
        limit,
    )
    return [dict(r) for r in rows]


async def begin_leg(
    conn: Conn, run_id: int, who: str, rate: float | None = None
) -> dict[str, Any] | None:
    """Resume a stopped run (or one whose runner is gone): a new leg, `running` again, from
    its pending letters (`rate`: a new rate, else its own). None when it cannot be resumed (no
    such run, done, or running)."""
    row = await conn.fetchrow(
        """
        UPDATE telecom.replay_runs SET
            state = 'running', leg = leg + 1, leg_started_at = now(), leg_sent = 0,
            heartbeat_at = now(), finished_at = NULL, rate = coalesce($5, rate),
            reason = 'resumed by ' || $2 || coalesce(' after: ' || reason, '')
        WHERE id = $1
          AND (state = ANY($3::text[])
               OR (state = 'running' AND heartbeat_at < now() - make_interval(secs => $4)))
        RETURNING id
        """,
        run_id,
        who,
        list(RESUMABLE),
        STALE_AFTER_S,
        rate,
    )
    return None if row is None else await get(conn, run_id)


async def pending(conn: Conn, run_id: int, limit: int) -> list[int]:
    """The next dead letters the run is to send, in its order."""
    rows = await conn.fetch(
        """
        SELECT dead_letter_id FROM telecom.replay_run_letters
        WHERE run_id = $1 AND state = 'pending' ORDER BY position LIMIT $2
        """,
        run_id,
        limit,
    )
    return [int(r["dead_letter_id"]) for r in rows]


async def mark(
    conn: Conn, run_id: int, leg: int, sent: Sequence[int], skipped: Sequence[tuple[int, str]]
) -> None:
    """Inside the batch's transaction: these letters were sent (or skipped, with why), and
    the run's counts and heartbeat follow."""
    await conn.execute(
        """
        WITH done AS (
            SELECT i AS id, 'sent' AS state, NULL::text AS detail FROM unnest($3::bigint[]) i
            UNION ALL
            SELECT i, 'skipped', d FROM unnest($4::bigint[], $5::text[]) AS s(i, d)
        ), marked AS (
            UPDATE telecom.replay_run_letters l SET
                state = done.state, detail = done.detail, leg = $2, sent_at = clock_timestamp()
            FROM done
            WHERE l.run_id = $1 AND l.dead_letter_id = done.id AND l.state = 'pending'
            RETURNING l.state
        )
        UPDATE telecom.replay_runs SET
            sent = sent + (SELECT count(*) FROM marked WHERE state = 'sent'),
            leg_sent = leg_sent + (SELECT count(*) FROM marked WHERE state = 'sent'),
            skipped = skipped + (SELECT count(*) FROM marked WHERE state = 'skipped'),
            heartbeat_at = now()
        WHERE id = $1
        """,
        run_id,
        leg,
        list(sent),
        [i for i, _ in skipped],
        [d for _, d in skipped],
    )


_OUTCOMES = """
    SELECT l.position, l.leg,
           d.status = 'superseded' AS applied,
           EXISTS (SELECT 1 FROM telecom.dead_letters n
                   WHERE n.consumer = d.consumer AND n.message_key = d.message_key
                     AND n.id <> d.id AND n.last_failed_at >= l.sent_at
                     AND NOT EXISTS (SELECT 1 FROM telecom.replay_run_letters o
                                     WHERE o.run_id = l.run_id AND o.dead_letter_id = n.id))
               AS failed
    FROM telecom.replay_run_letters l
    JOIN telecom.dead_letters d ON d.id = l.dead_letter_id
    WHERE l.run_id = $1 AND l.state = 'sent'
"""


@dataclass(frozen=True, slots=True)
class Outcomes:
    """What became of the run's sent messages: all of them, and its current leg's first
    `check_first` (its window)."""

    applied: int
    failed_again: int
    window_sent: int
    window_applied: int
    window_failed: int


async def outcomes(conn: Conn, run_id: int) -> Outcomes:
    """Read what became of the run's sent messages (one statement), and keep the counts in
    the run's record (the console reads them there); a running run's heartbeat with them (its
    runner looks every second, waiting for a verdict too)."""
    row = await conn.fetchrow(
        f"""
        WITH r AS (SELECT leg, check_first FROM telecom.replay_runs WHERE id = $1),
        o AS ({_OUTCOMES}),
        w AS (SELECT o.* FROM o, r WHERE o.leg = r.leg ORDER BY o.position
              LIMIT (SELECT check_first FROM r)),
        kept AS (
            UPDATE telecom.replay_runs SET
                failed_again = (SELECT count(*) FROM o WHERE failed),
                applied = (SELECT count(*) FROM o WHERE applied AND NOT failed),
                heartbeat_at = CASE WHEN state = 'running' THEN now() ELSE heartbeat_at END
            WHERE id = $1
        )
        SELECT (SELECT count(*) FROM o WHERE applied AND NOT failed) AS applied,
               (SELECT count(*) FROM o WHERE failed) AS failed_again,
               (SELECT count(*) FROM w) AS window_sent,
               (SELECT count(*) FROM w WHERE applied AND NOT failed) AS window_applied,
               (SELECT count(*) FROM w WHERE failed) AS window_failed
        """,
        run_id,
    )
    if row is None:  # one row, always
        raise LookupError(f"no replay run {run_id}")
    return Outcomes(**{k: int(v) for k, v in dict(row).items()})


async def tripped_breakers(conn: Conn, run_id: int) -> list[dict[str, Any]]:
    """The routes of the run whose circuit breaker paused them (telecom.consumer_pauses,
    `automatic`), with the breaker's reason."""
    rows = await conn.fetch(
        """
        SELECT p.route, p.reason, p.paused_at FROM telecom.consumer_pauses p
        JOIN telecom.replay_runs r ON p.route = ANY(r.routes)
        WHERE r.id = $1 AND p.automatic ORDER BY p.route
        """,
        run_id,
    )
    return [dict(r) for r in rows]


async def finish(conn: Conn, run_id: int, leg: int, state: str, reason: str | None) -> None:
    """Leg `leg` of the run ends (or stops) in `state`, with why; a cancel already stored is
    kept, and so is a later leg (the run was resumed meanwhile: its runner ends it)."""
    if state not in STATES:
        raise ValueError(f"unknown replay run state {state!r}")
    await conn.execute(
        """
        UPDATE telecom.replay_runs SET state = $2, reason = $3, finished_at = now(),
                                       heartbeat_at = now()
        WHERE id = $1 AND state = 'running' AND leg = $4
        """,
        run_id,
        state,
        reason,
        leg,
    )


async def cancel(conn: Conn, run_id: int, who: str) -> bool:
    """An operator cancels a running run: its runner stops before its next batch. False: it
    was not running."""
    done = await conn.fetchval(
        """
        UPDATE telecom.replay_runs SET state = 'cancelled', reason = 'cancelled by ' || $2,
                                       finished_at = now()
        WHERE id = $1 AND state = 'running' RETURNING true
        """,
        run_id,
        who,
    )
    return bool(done)
