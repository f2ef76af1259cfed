"""Transition counters (seed 004's stats): how many messages made each move, per route.

put and bury/ttl are counted by triggers (migration 0004); the rest where they happen, in the
transaction that makes the move, so a rolled-back move is not counted.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

from infra.postgres.pool import Conn

TRANSITIONS = ("put", "take", "ack", "release", "bury", "dig", "plow", "ttl", "ttr", "delete")
SLOTS = 8


async def count(conn: Conn, moves: Mapping[tuple[str, str], int]) -> None:
    """Add to the counters: `moves` maps (route, transition) to how many."""
    items = [(route, move, n) for (route, move), n in moves.items() if n]
    if not items:
        return
    await conn.execute(
        """
        INSERT INTO telecom.transition_counts AS c (route, transition, slot, count)
        SELECT route, move, $4, n FROM unnest($1::text[], $2::text[], $3::bigint[])
            AS m(route, move, n)
        ON CONFLICT (route, transition, slot) DO UPDATE SET count = c.count + excluded.count
        """,
        [i[0] for i in items],
        [i[1] for i in items],
        [i[2] for i in items],
        random.randrange(SLOTS),  # spread writers (in containers every pid is 1)
    )


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
