"""Invariants checked in production: one SQL statement per check, each returning the rows that
break it (a sample of at most SAMPLE, and how many there are in all).

`pkgq doctor` runs them on demand; the relay runs them every PKGQ_INVARIANT_CHECK_INTERVAL
(infra/outbox/invariant_watch.py) and exports `pkgq_invariant_violations{check=...}`. Both store
the last results in telecom.invariant_checks (migration 0012), which the console's overview
reads: it never runs a check itself.

The checks:

- `hold_without_way_out`: a hold whose blocker (not NULL) has no way out: no outbox row for
  that message that is unpublished, or was published within OUTBOX_GRACE_S (a published retry
  is on the broker until its consumer takes it), and no buried dead letter of it on the hold's
  consumer. Nothing will ever release such a hold: the user's later messages on that consumer
  stay parked for good. (A hold whose blocker is NULL is being released by its consumer's
  release poll: fine.) A route whose consumer is stopped for longer than the grace shows its
  retrying holds here too, until the consumer is back.
- `hold_past_its_bound` and `hold_waits_on_another_copy` (infra/postgres/hold_checks.py): a
  hold whose blocker was retried past every bound pkgq sets, or that has no way out of its own
  while a retry of its message_id from another publisher or for another user is pending.
- `parked_without_hold`: a parked message with no hold on its (consumer, user): no release
  poll will ever apply it.
- `failed_message_unaccounted`: a message that failed at least once on a consumer (an
  attempts row last counted over ATTEMPT_GRACE_S ago, so a batch in flight is not caught)
  and is now none of: applied (inbox), pending (an outbox row, unpublished or published within
  the grace), buried or otherwise filed (a dead letter in any status), parked, or withdrawn by
  its group's cancel. Such a message was lost.
- `more_than_one_active_item`: a user with more than one active item (the unique index
  package_queue_one_active refuses it; the check proves the index is still there).
- `traffic_conservation`: pkgq keeps no ledger of the usage it received, so conservation is
  checked as "each byte lives in one place": usage is billed to the active item, or, with no
  item to activate, kept in the user's unbilled counters, which the next activation moves
  onto its item and zeroes (domain/queue.py: record_usage, _activate). So a user with an
  active item has no unbilled traffic; an item never activated (activated_at NULL: queued, or
  cancelled while queued) carries none; and no counter is negative. Each row names the user,
  the item (if any) and the rule broken.
- `activation_times`: an item activated before it was created, or before the item its user
  had activated before it. Items are activated in queue order ((created_at, id): FIFO), each
  dated by its batch's clock read under the user's lock and never before what the user's
  queue already holds (domain/queue.py: `_moment`), so per user the activation times follow
  that order. Each row names the user, the item, the rule broken and the times that break it.
  The relay looks at the last day's activations (`Graces.activations_s`, index
  `package_queue_activated`, migration 0025), each against the one before it, so every
  activation is checked while it is recent at the cost of an index range; `pkgq doctor` looks
  at all of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from infra.postgres.check_base import (
    ATTEMPT_GRACE_S,
    GRACES,
    OUTBOX_GRACE_S,
    SAMPLE,
    STATEMENT_TIMEOUT_S,
    Check,
    Graces,
    Result,
)
from infra.postgres.hold_checks import (
    HOLD_PAST_ITS_BOUND,
    HOLD_WAITS_ON_ANOTHER_COPY,
    HOLD_WITHOUT_WAY_OUT,
    HoldWayOut,
    hold_way_out,
)
from infra.postgres.pool import Conn

__all__ = [
    "ATTEMPT_GRACE_S",
    "BY_NAME",
    "CHECKS",
    "GRACES",
    "HOLD_PAST_ITS_BOUND",
    "HOLD_WAITS_ON_ANOTHER_COPY",
    "HOLD_WITHOUT_WAY_OUT",
    "OUTBOX_GRACE_S",
    "SAMPLE",
    "Check",
    "Graces",
    "HoldWayOut",
    "Result",
    "check_and_store",
    "hold_way_out",
    "run",
    "run_all",
    "store",
    "stored",
]

PARKED_WITHOUT_HOLD = Check(
    "parked_without_hold",
    "a parked message has no hold on its consumer and user: no release poll will apply it",
    """
    SELECT p.consumer, p.user_id, p.message_id, p.id AS parked_id, p.route, p.parked_at,
           count(*) OVER () AS total
    FROM telecom.parked p
    WHERE NOT EXISTS (
        SELECT 1 FROM telecom.holds h WHERE h.consumer = p.consumer AND h.user_id = p.user_id)
    ORDER BY p.id
    LIMIT $1
    """,
)

FAILED_MESSAGE_UNACCOUNTED = Check(
    "failed_message_unaccounted",
    "a message that failed is neither applied, pending, parked, filed as a dead letter nor "
    "withdrawn: it was lost",
    """
    SELECT a.consumer, coalesce(a.sent_as, a.message_id) AS message_id, a.generation,
           a.attempts, a.last_at, count(*) OVER () AS total
    FROM telecom.attempts a
    WHERE a.last_at < now() - make_interval(secs => $3::float8)
      -- a row from before keys (sent_as NULL) is kept by its message_id, and so are the rows
      -- that speak of it; since, `message_id` holds the message's key (migration 0022)
      AND NOT EXISTS (SELECT 1 FROM telecom.inbox i
                      WHERE i.consumer = a.consumer AND i.message_id = a.message_id)
      AND NOT EXISTS (SELECT 1 FROM telecom.outbox o
                      WHERE o.message_id = coalesce(a.sent_as, a.message_id)
                        AND (a.sent_as IS NULL
                             OR telecom.message_key(o.message_id,
                                                    o.headers ->> 'x-pkgq-publisher',
                                                    o.user_id) = a.message_id)
                        AND (o.published_at IS NULL
                             OR o.published_at > now() - make_interval(secs => $2::float8)))
      AND NOT EXISTS (SELECT 1 FROM telecom.dead_letters d
                      WHERE d.consumer = a.consumer
                        AND (d.message_key = a.message_id
                             OR (a.sent_as IS NULL AND d.message_uuid = a.message_id)))
      AND NOT EXISTS (SELECT 1 FROM telecom.parked p
                      WHERE p.consumer = a.consumer AND p.message_id = a.message_id)
      AND NOT EXISTS (SELECT 1 FROM telecom.group_members m
                      WHERE m.message_id = coalesce(a.sent_as, a.message_id)
                        AND m.state = 'cancelled')
    ORDER BY a.last_at, a.consumer, a.message_id
    LIMIT $1
    """,
    lambda g: (g.outbox_s, g.attempts_s),
)

MORE_THAN_ONE_ACTIVE_ITEM = Check(
    "more_than_one_active_item",
    "a user has more than one active item",
    """
    SELECT user_id, count(*) AS active_items, array_agg(id ORDER BY id) AS item_ids,
           count(*) OVER () AS total
    FROM telecom.package_queue
    WHERE status = 'active'
    GROUP BY user_id
    HAVING count(*) > 1
    ORDER BY user_id
    LIMIT $1
    """,
)

TRAFFIC_CONSERVATION = Check(
    "traffic_conservation",
    "traffic is in two places at once (unbilled while an item is active), on an item never "
    "activated, or negative",
    """
    SELECT user_id, item_id, rule, upload, download, count(*) OVER () AS total
    FROM (
        SELECT u.user_id, q.id AS item_id, 'unbilled traffic while an item is active' AS rule,
               u.unbilled_upload AS upload, u.unbilled_download AS download
        FROM telecom.queue_users u
        JOIN telecom.package_queue q ON q.user_id = u.user_id AND q.status = 'active'
        WHERE u.unbilled_upload <> 0 OR u.unbilled_download <> 0
        UNION ALL
        SELECT user_id, NULL, 'negative unbilled traffic', unbilled_upload, unbilled_download
        FROM telecom.queue_users
        WHERE unbilled_upload < 0 OR unbilled_download < 0
        UNION ALL
        SELECT user_id, id,
               CASE WHEN upload < 0 OR download < 0 THEN 'negative traffic on an item'
                    ELSE 'traffic on an item never activated' END,
               upload, download
        FROM telecom.package_queue
        WHERE upload < 0 OR download < 0
           OR (activated_at IS NULL AND (upload <> 0 OR download <> 0))
    ) AS broken
    ORDER BY user_id, item_id NULLS FIRST, rule
    LIMIT $1
    """,
)

USAGE_BILLED_ELSEWHERE = Check(
    "usage_billed_elsewhere",
    "a usage record billed under its billing record id names an item that is not its user's",
    """
    SELECT b.user_id, b.usage_id, b.item_id, count(*) OVER () AS total
    FROM telecom.usage_billed b
    WHERE b.item_id IS NOT NULL AND NOT EXISTS (
        SELECT FROM telecom.package_queue q WHERE q.id = b.item_id AND q.user_id = b.user_id
    )
    ORDER BY b.user_id, b.usage_id
    LIMIT $1
    """,
)

ACTIVATION_TIMES = Check(
    "activation_times",
    "an item was activated before it was created, or before the item its user had activated "
    "before it",
    """
    SELECT user_id, item_id,
           CASE WHEN activated_at < created_at THEN 'activated before it was created'
                ELSE 'activated before the item activated before it' END AS rule,
           created_at, activated_at, previous_item_id, previous_activated_at,
           count(*) OVER () AS total
    FROM (
        SELECT q.user_id, q.id AS item_id, q.created_at, q.activated_at,
               previous.id AS previous_item_id, previous.activated_at AS previous_activated_at
        FROM telecom.package_queue q
        -- the item its user activated before it: the one before it in queue order
        LEFT JOIN LATERAL (
            SELECT p.id, p.activated_at FROM telecom.package_queue p
            WHERE p.user_id = q.user_id AND p.activated_at IS NOT NULL
              AND (p.created_at, p.id) < (q.created_at, q.id)
            ORDER BY p.created_at DESC, p.id DESC
            LIMIT 1
        ) previous ON true
        -- activations of the window only (index package_queue_activated): every one is
        -- checked while it is recent; `pkgq doctor` looks at all of them
        WHERE q.activated_at > now() - make_interval(secs => $2::float8)
    ) AS activations
    WHERE activated_at < created_at OR activated_at < previous_activated_at
    ORDER BY user_id, item_id
    LIMIT $1
    """,
    lambda g: (g.activations_s,),
)

CHECKS: tuple[Check, ...] = (
    HOLD_WITHOUT_WAY_OUT,
    HOLD_PAST_ITS_BOUND,
    HOLD_WAITS_ON_ANOTHER_COPY,
    PARKED_WITHOUT_HOLD,
    FAILED_MESSAGE_UNACCOUNTED,
    MORE_THAN_ONE_ACTIVE_ITEM,
    TRAFFIC_CONSERVATION,
    USAGE_BILLED_ELSEWHERE,
    ACTIVATION_TIMES,
)
BY_NAME = {c.name: c for c in CHECKS}


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row as JSON would store it (ids, times and arrays as JSON values), without `total`."""
    loaded: dict[str, Any] = json.loads(json.dumps(row, default=str))
    loaded.pop("total", None)
    return loaded


async def run(conn: Conn, check: Check, *, graces: Graces = GRACES, limit: int = SAMPLE) -> Result:
    """One check: its one statement."""
    rows = await conn.fetch(check.sql, limit, *check.params(graces), timeout=STATEMENT_TIMEOUT_S)
    total = int(rows[0]["total"]) if rows else 0
    return Result(check.name, total, [_plain(dict(r)) for r in rows], datetime.now(UTC))


async def run_all(
    conn: Conn, *, graces: Graces = GRACES, names: Sequence[str] | None = None
) -> list[Result]:
    """Every check (or those named), one statement each, all on one snapshot (a read-only
    repeatable-read transaction): what one reports is consistent with what another does."""
    chosen = CHECKS if names is None else tuple(BY_NAME[n] for n in names)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return [await run(conn, check, graces=graces) for check in chosen]


async def check_and_store(
    conn: Conn, *, graces: Graces = GRACES, names: Sequence[str] | None = None
) -> list[Result]:
    """`run_all`, then `store` its results: what `pkgq doctor` and the relay do."""
    results = await run_all(conn, graces=graces, names=names)
    await store(conn, results)
    return results


async def store(conn: Conn, results: Sequence[Result]) -> None:
    """The results as the checks' last, in one statement (the others keep theirs)."""
    if not results:
        return
    now = datetime.now(UTC)
    await conn.execute(
        """
        INSERT INTO telecom.invariant_checks (check_name, violations, sample, checked_at)
        SELECT name, violations, sample::jsonb, checked_at
        FROM unnest($1::text[], $2::bigint[], $3::text[], $4::timestamptz[])
             AS r(name, violations, sample, checked_at)
        ON CONFLICT (check_name) DO UPDATE SET
            violations = excluded.violations, sample = excluded.sample,
            checked_at = excluded.checked_at
        """,
        [r.check for r in results],
        [r.violations for r in results],
        [json.dumps(r.sample) for r in results],
        [r.checked_at or now for r in results],
    )


async def stored(conn: Conn) -> list[Result]:
    """The last stored result of each check that has one, in CHECKS order."""
    rows = await conn.fetch(
        "SELECT check_name, violations, sample::text AS sample, checked_at "
        "FROM telecom.invariant_checks WHERE check_name = ANY($1::text[])",
        list(BY_NAME),
    )
    found = {
        r["check_name"]: Result(
            r["check_name"], int(r["violations"]), json.loads(r["sample"]), r["checked_at"]
        )
        for r in rows
    }
    return [found[c.name] for c in CHECKS if c.name in found]
