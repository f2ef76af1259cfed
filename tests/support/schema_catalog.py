"""What a database's `telecom` schema is made of, read from the catalog in a form two databases
can be compared by: every column with its type, nullability and default; every constraint,
index, trigger, function, enum, sequence and view, as Postgres itself prints them.

tests/integration/test_migrations.py compares the schema every migration yields, applied in
order, with infra/postgres/schema.sql (the schema the code is written against), as
procrastinate's migration tests compare theirs."""

from __future__ import annotations

from importlib import resources

import asyncpg

SCHEMA = "telecom"

_QUERIES: dict[str, str] = {
    "columns": """
        SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
               || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
               || CASE WHEN a.attgenerated <> '' THEN ' generated' ELSE '' END
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm') AND a.attnum > 0
          AND NOT a.attisdropped
    """,
    "tables": """
        SELECT c.relname || ' ' || c.relkind::text
               || coalesce(' ' || array_to_string(c.reloptions, ','), '')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
    """,
    "constraints": """
        SELECT c.relname || ' ' || k.conname || ' ' || pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1
    """,
    "indexes": "SELECT indexdef FROM pg_indexes WHERE schemaname = $1",
    "triggers": """
        SELECT pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND NOT t.tgisinternal
    """,
    "functions": """
        SELECT pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = $1 AND p.prokind IN ('f', 'p')
    """,
    "enums": """
        SELECT t.typname || ': ' || string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
        FROM pg_type t
        JOIN pg_enum e ON e.enumtypid = t.oid
        JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = $1
        GROUP BY t.typname
    """,
    "views": """
        SELECT c.relname || ': ' || pg_get_viewdef(c.oid)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relkind IN ('v', 'm')
    """,
    "comments": """
        SELECT c.relname || coalesce('.' || a.attname, '') || ': ' || d.description
        FROM pg_description d
        JOIN pg_class c ON c.oid = d.objoid AND d.classoid = 'pg_class'::regclass
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.objsubid
        WHERE n.nspname = $1
    """,
}


async def describe(conn: asyncpg.Connection, schema: str = SCHEMA) -> dict[str, list[str]]:
    """The schema's parts by kind, each list sorted (one statement per kind: a test tool)."""
    found: dict[str, list[str]] = {}
    for kind, sql in _QUERIES.items():
        found[kind] = sorted(str(r[0]) for r in await conn.fetch(sql, schema))
    return found


def expected_schema_sql() -> str:
    """infra/postgres/schema.sql: the schema the code is written against (`make schema` writes
    it from a database every migration was applied to, in order)."""
    return (resources.files("infra.postgres") / "schema.sql").read_text()


async def load_schema_sql(conn: asyncpg.Connection) -> None:
    """Build the schema from schema.sql alone (an empty database), as a fresh install would."""
    await conn.execute(expected_schema_sql())
