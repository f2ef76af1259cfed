"""Transition counters (the job-queue stats): how many messages made each move, per route.

put and bury/ttl are counted by triggers (migration 0004); the rest where they happen, in the
transaction that makes the move, so a rolled-back move is not counted. The statement that counts
them (`count`, one per batch) also adds them to the last minute's ring (telecom.
transition_seconds, migration 0015: 60 one-second buckets, each taken over by the same second of
the next minute), so "processed in the last minute" is read from at most 60 x 8 small rows per
route and move (`last_minute`), never from the inbox.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from infra.postgres.batch_write import count_moves
from infra.postgres.compound import run
from infra.postgres.pool import Conn

TRANSITIONS = ("put", "take", "ack", "release", "bury", "dig", "plow", "ttl", "ttr", "delete")


async def count(conn: Conn, moves: Mapping[tuple[str, str], int]) -> None:
    """Add to the counters: `moves` maps (route, transition) to how many."""
    await run(conn, count_moves(moves))


async def count_one(conn: Conn, route: str, move: str, n: int = 1) -> None:
    await count(conn, {(route, move): n})


async def totals(conn: Conn) -> dict[str, Counter[str]]:
    """route -> transition -> total."""
    rows = await conn.fetch(
        "SELECT route, transition, sum(count)::bigint AS n FROM telecom.transition_counts "
        "GROUP BY route, transition"
    )
    found: dict[str, Counter[str]] = {}
    for r in rows:
        found.setdefault(r["route"], Counter())[r["transition"]] = int(r["n"])
    return found


async def last_minute(conn: Conn, move: str) -> dict[str, int]:
    """route -> how many made `move` in the last 60 seconds (whole seconds, this one included),
    from the ring (see the module docstring)."""
    rows = await conn.fetch(
        """
        SELECT route, sum(count)::bigint AS n FROM telecom.transition_seconds
        WHERE transition = $1
          AND at > floor(extract(epoch FROM statement_timestamp()))::bigint - 60
        GROUP BY route
        """,
        move,
    )
    return {r["route"]: int(r["n"]) for r in rows if r["n"]}
