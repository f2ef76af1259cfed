"""Backlog figures for the metrics: the outbox's due rows, the buried dead letters and the
held users."""

from __future__ import annotations

from dataclasses import dataclass

from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class Backlog:
    outbox_pending: int
    outbox_oldest_s: float
    buried_by_route: dict[str, int]
    held: dict[tuple[str, str], int]
    """Users held behind a blocker, by (consumer, hold state)."""


async def backlog(conn: Conn) -> Backlog:
    row = await conn.fetchrow(
        """
        SELECT count(*) AS pending,
               coalesce(extract(epoch FROM now() - min(available_at)), 0) AS oldest
        FROM telecom.outbox
        WHERE published_at IS NULL AND available_at <= now()
        """
    )
    buried = await conn.fetch(
        "SELECT route, count(*) AS n FROM telecom.dead_letters WHERE status = 'buried' "
        "GROUP BY route"
    )
    held = await conn.fetch(
        "SELECT consumer, state, count(*) AS n FROM telecom.holds WHERE blocker IS NOT NULL "
        "GROUP BY consumer, state"
    )
    assert row is not None  # an aggregate always returns a row
    return Backlog(
        outbox_pending=int(row["pending"]),
        outbox_oldest_s=float(row["oldest"]),
        buried_by_route={r["route"]: int(r["n"]) for r in buried},
        held={(r["consumer"], r["state"]): int(r["n"]) for r in held},
    )


async def per_route(conn: Conn) -> dict[str, dict[str, int]]:
    """Per route: outbox rows scheduled (future) and pending (due, unpublished), parked
    messages, buried dead letters (expired ones apart), processed-message records kept
    (the inbox), and messages applied, and dead letters filed or failed again, in the last
    minute."""
    rows = await conn.fetch(
        """
        SELECT route, 'scheduled' AS what, count(*) AS n FROM telecom.outbox
            WHERE published_at IS NULL AND available_at > now() GROUP BY route
        UNION ALL
        SELECT route, 'pending', count(*) FROM telecom.outbox
            WHERE published_at IS NULL AND available_at <= now() GROUP BY route
        UNION ALL
        SELECT route, 'parked', count(*) FROM telecom.parked GROUP BY route
        UNION ALL
        SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END,
               count(*) FROM telecom.dead_letters
            WHERE status = 'buried' GROUP BY 1, 2
        UNION ALL
        SELECT 'telecom.' || consumer, 'kept', count(*) FROM telecom.inbox GROUP BY consumer
        UNION ALL
        SELECT 'telecom.' || consumer, 'processed_1m', count(*) FROM telecom.inbox
            WHERE processed_at > now() - interval '1 minute' GROUP BY consumer
        UNION ALL
        SELECT route, 'failed_1m', count(*) FROM telecom.dead_letters
            WHERE last_failed_at > now() - interval '1 minute' GROUP BY route
        """
    )
    found: dict[str, dict[str, int]] = {}
    for r in rows:
        found.setdefault(r["route"], {})[r["what"]] = int(r["n"])
    return found
