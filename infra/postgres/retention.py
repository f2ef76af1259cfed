"""Retention (xqueue's zombie delay): records kept for audit and dedup, then pruned.

What goes, once it is older than the retention period:
- inbox rows (processed messages): counted as the `delete` transition of their route;
- outbox rows published before it;
- addresses and job groups finished before it (a group's members go with it);
- TTR strikes last struck before it;
- workers stopped before it;
- trend snapshots taken before it, the last 25 hours always kept (the day's chart needs them).
Unique keys, billed usage record ids and console sessions go as soon as their window has
passed (a session: its expiry), whatever the retention. Dead letters are never
pruned here: `pkgq dlq purge` decides about them.

Each rule is declared by the module that owns its table (its `RETENTION`); this module runs
them. Every table is pruned in batches of at most `batch_size` rows, each batch in its own short
transaction, until a batch comes back short: no long transaction, no lock held for long.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from infra.postgres import (
    addresses,
    attempts,
    groups,
    inbox,
    outbox,
    strikes,
    transitions,
    trends,
    unique_keys,
    usage_billed,
    web_sessions,
    workers,
)
from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

TARGETS: tuple[Rule, ...] = (
    inbox.RETENTION,
    outbox.RETENTION,
    addresses.RETENTION,
    groups.RETENTION,
    unique_keys.RETENTION,
    strikes.RETENTION,
    attempts.RETENTION,
    workers.RETENTION,
    usage_billed.RETENTION,
    trends.RETENTION,
    web_sessions.RETENTION,
)
"""Each table's rule, declared by the module that owns the table, in the order they are pruned."""
BATCHES = "batches"
"""The key in prune()'s result that counts the delete statements (transactions) it ran."""


def _uses_cutoff(t: Rule) -> bool:
    return "{cutoff}" in t.condition


def _delete_sql(t: Rule) -> str:
    """Parameters: the cutoff if the condition uses it, then the batch size."""
    condition = t.condition.format(cutoff="$1")
    limit = "$2" if _uses_cutoff(t) else "$1"
    # The condition is checked again on the rows being deleted: a ctid may have been reused.
    return (
        f"DELETE FROM {t.table} WHERE {t.row_id} = ANY(ARRAY("
        f"SELECT {t.row_id} FROM {t.table} WHERE {condition} LIMIT {limit})) "
        f"AND {condition} RETURNING {t.returning}"
    )


def _count_sql(t: Rule) -> str:
    return f"SELECT count(*) FROM {t.table} WHERE {t.condition.format(cutoff='$1')}"


@asynccontextmanager
async def _connection(source: asyncpg.Pool | Conn) -> AsyncIterator[Conn]:
    if isinstance(source, asyncpg.Pool):
        async with source.acquire() as conn:
            yield conn
    else:
        yield source


async def prune(
    source: asyncpg.Pool | Conn,
    retention_s: float,
    batch_size: int,
    *,
    dry_run: bool = False,
) -> dict[str, int]:
    """Delete what is past retention (see the module docstring). Returns rows deleted per
    table, and under `batches` the number of batches run. `dry_run`: count what would go, and
    delete nothing."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    result = {t.key: 0 for t in TARGETS}
    batches = 0
    async with _connection(source) as conn:
        cutoff = await conn.fetchval("SELECT now() - make_interval(secs => $1)", float(retention_s))
        for target in TARGETS:
            args = (cutoff,) if _uses_cutoff(target) else ()
            if dry_run:
                result[target.key] = int(await conn.fetchval(_count_sql(target), *args))
                continue
            sql = _delete_sql(target)
            while True:
                async with conn.transaction():
                    rows = await conn.fetch(sql, *args, batch_size)
                    if target.key == "inbox" and rows:
                        by_route = Counter(f"telecom.{r['consumer']}" for r in rows)
                        await transitions.count(
                            conn, {(route, "delete"): n for route, n in by_route.items()}
                        )
                batches += 1
                result[target.key] += len(rows)
                if len(rows) < batch_size:
                    break
    result[BATCHES] = batches
    return result
