"""A busy deployment's growing tables, filled fast (INSERT ... SELECT generate_series) in a
database of its own: what proves that the status refresh and the console's overview read them
through indexes, whatever their size (tests/integration/test_cheap_statistics.py). Never run
against a production database."""

from __future__ import annotations

from collections.abc import Sequence

from infra.postgres.pool import Conn

FILLED = ("inbox", "outbox", "dead_letters", "holds", "parked")
"""The tables `fill` fills: every table the refresh or the overview reads that grows."""


async def fill(
    conn: Conn, rows: int, consumers: Sequence[str], *, others: int | None = None
) -> None:
    """`rows` rows in the inbox and `others` (default: as many) in each other table of FILLED,
    spread over `consumers` (and their routes,
    `telecom.<consumer>`): processed messages (the inbox) up to a week old, published outbox
    rows, replayed dead letters, released holds (no blocker) and parked messages. None of them
    is due, buried or holding anyone: what a figure counts is left to the caller to add.

    The rows go in with triggers off and the indexes (and unique constraints) built afterwards,
    as a restore would (session_replication_role: a superuser's connection), then every table
    is vacuumed and analyzed, as autovacuum would."""
    names = list(consumers)
    rest = rows if others is None else others
    # Every index is built after the rows are in, from its own definition (a primary key or
    # unique constraint as that constraint; none is referenced by a foreign key): a sorted
    # build instead of an entry at a random page for every row. The inbox's million rows took
    # 12.5 s to insert with its three indexes, 1 s into a table without any.
    async with conn.transaction():  # a failure leaves the tables as they were
        rebuild = await _drop_indexes(conn)
        await conn.execute("SET LOCAL session_replication_role = replica")
        await _insert_rows(conn, rows, rest, names)
        await conn.execute("SET LOCAL session_replication_role = origin")
        for statement in rebuild:
            await conn.execute(statement)
    await conn.execute("VACUUM (ANALYZE) " + ", ".join(f"telecom.{t}" for t in FILLED))


async def _drop_indexes(conn: Conn) -> list[str]:
    """Drop the filled tables' indexes (a primary key or unique constraint as that
    constraint, none referenced by a foreign key); return the statements that make each
    again."""
    indexes = await conn.fetch(
        """
        SELECT CASE WHEN k.conname IS NULL
                    THEN format('DROP INDEX %I.%I', n.nspname, c.relname)
                    ELSE format('ALTER TABLE %s DROP CONSTRAINT %I', i.indrelid::regclass,
                                k.conname) END AS drop_sql,
               CASE WHEN k.conname IS NULL THEN pg_get_indexdef(i.indexrelid)
                    ELSE format('ALTER TABLE %s ADD CONSTRAINT %I %s', i.indrelid::regclass,
                                k.conname, pg_get_constraintdef(k.oid)) END AS create_sql
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_constraint k ON k.conindid = i.indexrelid AND k.conrelid = i.indrelid
        WHERE i.indrelid = ANY($1::regclass[])
          AND NOT EXISTS (SELECT FROM pg_constraint f
                          WHERE f.contype = 'f' AND f.conindid = i.indexrelid)
        ORDER BY n.nspname, c.relname
        """,
        [f"telecom.{t}" for t in FILLED],
    )
    for index in indexes:
        await conn.execute(index["drop_sql"])
    return [index["create_sql"] for index in indexes]


async def _insert_rows(conn: Conn, rows: int, rest: int, names: list[str]) -> None:
    await conn.execute(
        """
        INSERT INTO telecom.inbox (consumer, message_id, processed_at)
        SELECT ($2::text[])[1 + g % cardinality($2::text[])], gen_random_uuid(),
               now() - (g % 604800) * interval '1 second'
        FROM generate_series(1, $1) AS g
        """,
        rows,
        names,
    )
    await conn.execute(
        """
        INSERT INTO telecom.outbox
            (message_id, route, message_type, schema_version, user_id, body, available_at,
             published_at)
        SELECT gen_random_uuid(), 'telecom.' || ($2::text[])[1 + g % cardinality($2::text[])],
               'Filled', 1, gen_random_uuid(), '\\x7b7d', now() - interval '1 hour',
               now() - interval '1 hour' + (g % 3600) * interval '1 second'
        FROM generate_series(1, $1) AS g
        """,
        rest,
        names,
    )
    await conn.execute(
        """
        INSERT INTO telecom.dead_letters
            (dedup_key, source, route, consumer, message_id, body, reason, error_type,
             error_message, status, first_failed_at, last_failed_at, replayed_at)
        SELECT 'filled:' || g, 'consumer',
               'telecom.' || ($2::text[])[1 + g % cardinality($2::text[])],
               ($2::text[])[1 + g % cardinality($2::text[])], gen_random_uuid()::text,
               '\\x7b7d', 'handler_error', 'Filled', 'filled', 'replayed',
               now() - interval '2 days', now() - interval '1 day' - g * interval '1 ms',
               now() - interval '1 day'
        FROM generate_series(1, $1) AS g
        """,
        rest,
        names,
    )
    await conn.execute(
        """
        INSERT INTO telecom.holds (consumer, user_id, blocker, state)
        SELECT ($2::text[])[1 + g % cardinality($2::text[])], gen_random_uuid(), NULL,
               'releasing'
        FROM generate_series(1, $1) AS g
        """,
        rest,
        names,
    )
    await conn.execute(
        """
        INSERT INTO telecom.parked
            (consumer, user_id, message_id, route, message_type, body)
        SELECT ($2::text[])[1 + g % cardinality($2::text[])], gen_random_uuid(),
               gen_random_uuid(), 'telecom.' || ($2::text[])[1 + g % cardinality($2::text[])],
               'Filled', '\\x7b7d'
        FROM generate_series(1, $1) AS g
        """,
        rest,
        names,
    )
