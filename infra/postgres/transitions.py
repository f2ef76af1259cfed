"""Transition counters (the job-queue stats): how many messages made each move, per route.

put and bury/ttl are counted by triggers (migration 0004); the rest where they happen, in the
transaction that makes the move, so a rolled-back move is not counted. The statement that counts
them (`count`, one per batch) also adds them to the last minute's ring (telecom.
transition_seconds, migration 0015: 60 one-second buckets, each taken over by the same second of
the next minute), so "processed in the last minute" is read from at most 60 x 8 small rows per
route and move (`last_minute`), never from the inbox.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping

from infra.postgres.compound import Part, run
from infra.postgres.pool import Conn

TRANSITIONS = ("put", "take", "ack", "release", "bury", "dig", "plow", "ttl", "ttr", "delete")
SLOTS = 8


async def count(conn: Conn, moves: Mapping[tuple[str, str], int]) -> None:
    """Add to the counters: `moves` maps (route, transition) to how many."""
    await run(conn, count_part(moves))


def count_part(moves: Mapping[tuple[str, str], int]) -> Part[None] | None:
    """`count` as a part of a batch's write statement (infra/postgres/compound.py): the
    totals, and this second's bucket of the ring. A bucket still holding an older second starts
    again; a move counted late for a second already taken over by a later one is past the
    minute, and left out of the ring."""
    items = [(route, move, n) for (route, move), n in moves.items() if n]
    if not items:
        return None
    return Part(
        (
            (
                "moves_given",
                """
                SELECT route, move, n FROM unnest($1::text[], $2::text[], $3::bigint[])
                    AS m(route, move, n)
                """,
            ),
            (
                "moves_totalled",
                """
                INSERT INTO telecom.transition_counts AS c (route, transition, slot, count)
                SELECT route, move, $4, n FROM moves_given
                ON CONFLICT (route, transition, slot) DO UPDATE SET count = c.count + excluded.count
                """,
            ),
            (
                "moves_timed",
                """
                INSERT INTO telecom.transition_seconds AS s
                    (transition, route, second, slot, at, count)
                SELECT move, route, (t.at % 60)::smallint, $4, t.at, n
                FROM moves_given,
                     (SELECT floor(extract(epoch FROM statement_timestamp()))::bigint AS at) t
                ON CONFLICT (transition, route, second, slot) DO UPDATE SET
                    count = CASE WHEN s.at = excluded.at THEN s.count + excluded.count
                                 WHEN s.at < excluded.at THEN excluded.count
                                 ELSE s.count END,
                    at = greatest(s.at, excluded.at)
                """,
            ),
        ),
        (
            [i[0] for i in items],
            [i[1] for i in items],
            [i[2] for i in items],
            random.randrange(SLOTS),  # spread writers (in containers every pid is 1)
        ),
        # The outbox's trigger adds 'put' rows to transition_counts, never counted here, and
        # after the statement: a part that adds outbox rows may share it.
        frozenset({"transition_counts", "transition_seconds"}),
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
