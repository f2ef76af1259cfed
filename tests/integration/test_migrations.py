"""Migrations: applied in order they yield exactly infra/postgres/schema.sql (the schema the code
is written against), compared catalog to catalog as procrastinate's migration tests do; the ones
added since the previous release only expand; a no-transaction migration runs statement by
statement (CREATE INDEX CONCURRENTLY)."""

from __future__ import annotations

import asyncio
import difflib
import re
from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import pytest

from infra.postgres import migrate as migrations
from infra.settings import Settings
from tests.support import pg_roles, releases, schema_catalog

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture
async def empty_db() -> AsyncIterator[asyncpg.Connection]:
    """A database of its own, empty, owned by the owner role, connected to as that role."""
    name = f"pkgq_t_schema_{uuid4().hex[:10]}"
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await admin.execute(f"CREATE DATABASE {name} OWNER {pg_roles.OWNER}")
    finally:
        await admin.close()
    conn = await asyncpg.connect(pg_roles.as_role(f"{PG_SERVER}/{name}", pg_roles.OWNER))
    try:
        yield conn
    finally:
        await conn.close()
        admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()


def differences(left: dict[str, list[str]], right: dict[str, list[str]]) -> str:
    lines: list[str] = []
    for kind in sorted(set(left) | set(right)):
        a, b = left.get(kind, []), right.get(kind, [])
        if a != b:
            lines += [
                f"{kind}:",
                *difflib.unified_diff(a, b, "migrations", "schema.sql", lineterm=""),
            ]
    return "\n".join(lines)


async def test_every_migration_applied_in_order_yields_exactly_the_schema_the_code_expects(
    settings: Settings, empty_db: asyncpg.Connection
) -> None:
    migrated = await asyncpg.connect(pg_roles.as_role(settings.postgres_dsn, pg_roles.OWNER))
    try:
        from_migrations = await schema_catalog.describe(migrated)
    finally:
        await migrated.close()
    await schema_catalog.load_schema_sql(empty_db)
    from_schema_sql = await schema_catalog.describe(empty_db)
    assert from_migrations["columns"], "nothing read from the catalog"
    assert from_migrations == from_schema_sql, (
        "the migrations and infra/postgres/schema.sql differ (run `make schema` after adding a "
        "migration, and review the diff):\n" + differences(from_migrations, from_schema_sql)
    )


async def test_a_change_the_migrations_do_not_make_shows_as_a_difference(
    empty_db: asyncpg.Connection,
) -> None:
    await schema_catalog.load_schema_sql(empty_db)
    before = await schema_catalog.describe(empty_db)
    await empty_db.execute("ALTER TABLE telecom.usage_billed ADD COLUMN stray int")
    after = await schema_catalog.describe(empty_db)
    assert "usage_billed.stray integer" in differences(before, after)


# -- expand, then contract ------------------------------------------------------------------

CONTRACTING = [
    (
        re.compile(
            r"\bDROP\s+(TABLE|COLUMN|INDEX|TYPE|FUNCTION|VIEW|SCHEMA|TRIGGER|CONSTRAINT|DEFAULT)\b",
            re.I,
        ),
        "drops",
    ),
    (re.compile(r"\bRENAME\b", re.I), "renames"),
    (re.compile(r"\bALTER\s+(COLUMN\s+)?\w+\s+(SET\s+DATA\s+)?TYPE\b", re.I), "changes a type"),
    (re.compile(r"\bSET\s+NOT\s+NULL\b", re.I), "makes a column NOT NULL"),
    (
        re.compile(r"\bADD\s+COLUMN\b(?![^;]*\bDEFAULT\b)[^;]*\bNOT\s+NULL\b", re.I),
        "adds a NOT NULL column without a default",
    ),
]
"""What the previous release's SQL may trip over while both run: a release only expands."""


def contractions(sql: str, new_tables: set[str], earlier: str = "") -> list[str]:
    """Why `sql` (one migration) is not expand-only; an index on a table it does not create
    itself must be built CONCURRENTLY (in a no-transaction migration). `earlier`: the SQL of
    the migrations before it (where a CHECK it widens was last defined)."""
    code = _without_widenings(_code(sql), _code(earlier))
    found = [why for pattern, why in CONTRACTING if pattern.search(code)]
    for match in re.finditer(
        r"\bCREATE\s+(UNIQUE\s+)?INDEX\s+(CONCURRENTLY\s+)?[^;]*?\bON\s+(ONLY\s+)?([\w.]+)",
        code,
        re.I,
    ):
        table = match.group(4)
        if table in new_tables:
            continue
        if match.group(2) is None:
            found.append(f"indexes {table} without CONCURRENTLY")
        if match.group(1) is not None:
            found.append(f"makes rows of {table} unique, which the previous release writes")
    for match in re.finditer(
        r"\bALTER\s+TABLE\s+(ONLY\s+)?([\w.]+)[^;]*\bADD\s+CONSTRAINT\b(?![^;]*\bNOT\s+VALID\b)",
        code,
        re.I,
    ):
        if match.group(2) not in new_tables:
            found.append(f"constrains {match.group(2)}, which the previous release writes")
    for match in re.finditer(
        r"\bCREATE\s+(OR\s+REPLACE\s+)?TRIGGER\b[^;]*?\bON\s+([\w.]+)", code, re.I
    ):
        if match.group(2) not in new_tables:
            found.append(f"adds a trigger to {match.group(2)}")
    return found


def _code(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def _without_widenings(code: str, earlier: str) -> str:
    """`code` without each DROP CONSTRAINT of a `column IN (...)` CHECK that it adds again
    under the same name allowing every value the constraint's last earlier definition allowed:
    a widening, which whatever the previous release writes still passes. Its ADD must then be
    NOT VALID (validated by a statement of its own), as any other constraint's."""
    for name in re.findall(r"\bDROP\s+CONSTRAINT\s+(\w+)", code, re.I):
        new, old = _check_values(code, name), _check_values(earlier, name)
        if new is not None and old is not None and old <= new:
            code = re.sub(rf"\bDROP\s+CONSTRAINT\s+{name}\b\s*,?", "", code, flags=re.I)
    return code


def _check_values(sql: str, name: str) -> set[str] | None:
    """The values the last `ADD CONSTRAINT name CHECK (column IN (...))` in `sql` allows."""
    found = re.findall(
        rf"\bADD\s+CONSTRAINT\s+{name}\s+CHECK\s*\(\s*\w+\s+IN\s*\(([^)]*)\)\s*\)",
        sql,
        re.I,
    )
    return set(re.findall(r"'([^']*)'", found[-1])) if found else None


def created_tables(sql: str) -> set[str]:
    return set(re.findall(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([\w.]+)", sql, re.I))


def test_the_migrations_added_since_the_previous_release_only_expand() -> None:
    tag = releases.previous_release()
    folder = "infra/postgres/migrations"
    released = set(releases.git("ls-tree", "--name-only", f"{tag}:{folder}").split())
    new = [
        m
        for m in migrations.available_migrations()
        if f"{m.version:04d}_{m.name}.sql" not in released
    ]
    assert new, f"no migration since {tag}: this check would pass on nothing"
    every = migrations.available_migrations()
    for migration in new:
        earlier = "\n".join(m.sql for m in every if m.version < migration.version)
        found = contractions(migration.sql, created_tables(migration.sql), earlier)
        assert found == [], migration.name


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("ALTER TABLE telecom.outbox DROP COLUMN seq;", "drops"),
        ("ALTER TABLE telecom.inbox RENAME TO seen;", "renames"),
        ("ALTER TABLE telecom.outbox ALTER COLUMN seq TYPE int;", "changes a type"),
        ("ALTER TABLE telecom.outbox ALTER COLUMN seq SET NOT NULL;", "makes a column NOT NULL"),
        ("ALTER TABLE telecom.outbox ADD COLUMN x int NOT NULL;", "adds a NOT NULL column"),
        ("CREATE INDEX o_x ON telecom.outbox (route);", "indexes telecom.outbox"),
        ("ALTER TABLE telecom.outbox ALTER seq TYPE int;", "changes a type"),
        ("ALTER TABLE telecom.outbox ALTER COLUMN seq DROP DEFAULT;", "drops"),
        ("ALTER TABLE telecom.outbox DROP CONSTRAINT outbox_pkey;", "drops"),
        ("ALTER TABLE telecom.outbox ADD CONSTRAINT c CHECK (seq > 0);", "constrains"),
        ("CREATE UNIQUE INDEX CONCURRENTLY u ON telecom.outbox (seq);", "makes rows"),
        ("CREATE TRIGGER t BEFORE INSERT ON telecom.inbox EXECUTE FUNCTION f();", "adds a"),
    ],
)
def test_each_kind_of_contraction_is_caught(sql: str, why: str) -> None:
    found = contractions(sql, created_tables(sql))
    assert any(f.startswith(why) for f in found), found


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE telecom.t (a int NOT NULL); CREATE INDEX t_a ON telecom.t (a);",
        "ALTER TABLE telecom.outbox ADD COLUMN x int NOT NULL DEFAULT 0;",
        "ALTER TABLE telecom.outbox ADD COLUMN x text;",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS o_x ON telecom.outbox (route);",
        "ALTER TABLE telecom.outbox ADD CONSTRAINT c CHECK (seq > 0) NOT VALID;",
        "CREATE TABLE telecom.v (a int); ALTER TABLE telecom.v ADD CONSTRAINT v_a UNIQUE (a);",
        "-- DROP TABLE in a comment\nCREATE TABLE telecom.u (a int);",
    ],
)
def test_what_only_expands_passes(sql: str) -> None:
    assert contractions(sql, created_tables(sql)) == []


_ACTIONS_0012 = (
    "ALTER TABLE telecom.operator_actions ADD CONSTRAINT operator_actions_action_check "
    "CHECK (action IN ('cancel', 'replay'));"
)


def _replace_check(values: str) -> str:
    return (
        "ALTER TABLE telecom.operator_actions DROP CONSTRAINT operator_actions_action_check, "
        "ADD CONSTRAINT operator_actions_action_check CHECK (action IN ("
        f"{values})) NOT VALID;"
    )


def test_a_check_replaced_by_one_allowing_more_values_is_an_expansion() -> None:
    sql = _replace_check("'cancel', 'replay', 'pause_route'")
    assert contractions(sql, set(), _ACTIONS_0012) == []


@pytest.mark.parametrize(
    ("sql", "earlier"),
    [
        (_replace_check("'cancel', 'pause_route'"), _ACTIONS_0012),  # 'replay' is refused
        (_replace_check("'cancel', 'replay', 'pause_route'"), ""),  # nothing to compare with
    ],
)
def test_a_check_replaced_by_one_refusing_a_value_or_unknown_before_is_a_contraction(
    sql: str, earlier: str
) -> None:
    assert any(f.startswith("drops") for f in contractions(sql, set(), earlier))


async def test_a_no_transaction_migration_builds_its_index_concurrently_and_is_recorded(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    conn = await asyncpg.connect(pg_roles.as_role(settings.postgres_dsn, pg_roles.OWNER))
    try:
        known = migrations.available_migrations()
        extra = migrations.Migration(
            known[-1].version + 1,
            "concurrent_index",
            f"{migrations.NO_TRANSACTION}\n-- an index on a table that can be large\n"
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_test_route\n"
            "    ON telecom.outbox (route);\n"
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_test_consumer\n"
            "    ON telecom.inbox (consumer);\n",
        )
        monkeypatch.setattr(migrations, "available_migrations", lambda: [*known, extra])
        assert await migrations.migrate(conn) == [extra.version]
        indexes = await conn.fetch(
            "SELECT i.indexname, x.indisvalid FROM pg_indexes i "
            "JOIN pg_class c ON c.relname = i.indexname JOIN pg_index x ON x.indexrelid = c.oid "
            "WHERE i.indexname IN ('outbox_test_route', 'inbox_test_consumer')"
        )
        assert sorted((r["indexname"], r["indisvalid"]) for r in indexes) == [
            ("inbox_test_consumer", True),
            ("outbox_test_route", True),
        ]
        assert await migrations.migrate(conn) == []  # recorded: not run again
    finally:
        await conn.close()


async def test_an_interrupted_concurrent_index_is_built_again_and_two_migrates_do_not_deadlock(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = pg_roles.as_role(settings.postgres_dsn, pg_roles.OWNER)
    first, second = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        # What a crash during CREATE INDEX CONCURRENTLY leaves: an invalid index (made here by
        # a unique index over duplicate values).
        await first.execute(
            "CREATE TABLE telecom.t_dup (a int); INSERT INTO telecom.t_dup VALUES (1), (1)"
        )
        with pytest.raises(asyncpg.UniqueViolationError):
            await first.execute("CREATE UNIQUE INDEX CONCURRENTLY t_dup_a ON telecom.t_dup (a)")
        await first.execute(
            "DELETE FROM telecom.t_dup WHERE ctid <> (SELECT min(ctid) FROM telecom.t_dup)"
        )
        known = migrations.available_migrations()
        extra = migrations.Migration(
            known[-1].version + 1,
            "rebuild",
            f"{migrations.NO_TRANSACTION}\n"
            "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_dup_a ON telecom.t_dup (a);\n",
        )
        monkeypatch.setattr(migrations, "available_migrations", lambda: [*known, extra])
        applied = await asyncio.wait_for(
            asyncio.gather(migrations.migrate(first), migrations.migrate(second)), timeout=60
        )
        assert sorted(applied, key=len) == [[], [extra.version]]
        valid = await first.fetchval(
            "SELECT x.indisvalid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
            "WHERE c.relname = 't_dup_a'"
        )
        assert valid is True
    finally:
        await first.close()
        await second.close()
