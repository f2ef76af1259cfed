"""What a test database holds besides its rows, as one digest, so that a used database can be
emptied and handed to the next test only if it is then exactly as a fresh copy of the template
(tests/support/test_databases.py): the schema's objects and their definitions, grants and
storage options, sequences, planner statistics and the size estimates the planner reads, the
database's own settings, and the rows of the tables the migrations fill."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

_USER = (
    "NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND {col} NOT LIKE 'pg_temp%' "
    "AND {col} NOT LIKE 'pg_toast_temp%'"
)

_DIGEST_SQL = f"""
WITH ns AS (SELECT oid, nspname FROM pg_namespace WHERE nspname {_USER.format(col="nspname")}),
parts(x) AS (
    SELECT 'ns ' || nspname || ' ' || coalesce(nspacl::text, '') || ' '
        || pg_get_userbyid(nspowner)
    FROM pg_namespace WHERE nspname {_USER.format(col="nspname")}
    UNION ALL
    SELECT 'class ' || c.oid::regclass || ' ' || c.relkind::text || ' ' || c.relpages || ' '
        || c.reltuples || ' ' || c.relallvisible || ' ' || coalesce(c.reloptions::text, '')
        || ' ' || coalesce(c.relacl::text, '') || ' ' || c.relpersistence::text || ' '
        || pg_get_userbyid(c.relowner) || ' ' || c.relrowsecurity || ' '
        || c.relforcerowsecurity || ' ' || c.relreplident::text || ' ' || c.relhassubclass
    FROM pg_class c JOIN ns ON ns.oid = c.relnamespace
    UNION ALL
    SELECT 'att ' || a.attrelid::regclass || ' ' || a.attnum || ' ' || a.attname || ' '
        || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull || ' '
        || coalesce(pg_get_expr(d.adbin, d.adrelid), '') || ' ' || a.attstattarget || ' '
        || coalesce(a.attacl::text, '') || ' ' || a.attcollation || ' ' || a.attstorage::text
        || ' ' || a.attcompression::text || ' ' || coalesce(a.attoptions::text, '') || ' '
        || a.attidentity::text || ' ' || a.attgenerated::text
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN ns ON ns.oid = c.relnamespace
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'con ' || conrelid::regclass || ' ' || conname || ' ' || pg_get_constraintdef(c.oid)
        || ' ' || convalidated
    FROM pg_constraint c JOIN ns ON ns.oid = c.connamespace
    UNION ALL
    SELECT 'idx ' || pg_get_indexdef(i.indexrelid) || ' ' || i.indisvalid
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN ns ON ns.oid = c.relnamespace
    UNION ALL
    SELECT 'trg ' || pg_get_triggerdef(t.oid) || ' ' || t.tgenabled::text
    FROM pg_trigger t WHERE NOT t.tgisinternal
    UNION ALL
    SELECT 'trgall ' || tgrelid::regclass || ' ' || tgname || ' ' || tgenabled::text
    FROM pg_trigger
    UNION ALL
    SELECT 'proc ' || p.oid::regprocedure || ' ' || md5(pg_get_functiondef(p.oid)) || ' '
        || coalesce(p.proacl::text, '') || ' ' || pg_get_userbyid(p.proowner)
    FROM pg_proc p JOIN ns ON ns.oid = p.pronamespace WHERE p.prokind IN ('f', 'p')
    UNION ALL
    SELECT 'type ' || t.oid::regtype || ' ' || t.typtype::text || ' '
        || coalesce(t.typacl::text, '') || ' ' || pg_get_userbyid(t.typowner)
    FROM pg_type t JOIN ns ON ns.oid = t.typnamespace
    UNION ALL
    SELECT 'enum ' || enumtypid::regtype || ' ' || enumlabel || ' ' || enumsortorder
    FROM pg_enum
    UNION ALL
    SELECT 'rule ' || r.ev_class::regclass || ' ' || r.rulename || ' ' || md5(r.ev_action)
        || ' ' || r.ev_enabled::text
    FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class JOIN ns ON ns.oid = c.relnamespace
    UNION ALL
    SELECT 'policy ' || polrelid::regclass || ' ' || polname || ' ' || polcmd::text || ' '
        || polpermissive || ' ' || polroles::text || ' '
        || coalesce(pg_get_expr(polqual, polrelid), '') || ' '
        || coalesce(pg_get_expr(polwithcheck, polrelid), '')
    FROM pg_policy
    UNION ALL
    SELECT 'inh ' || inhrelid::regclass || ' ' || inhparent::regclass || ' ' || inhseqno
    FROM pg_inherits
    UNION ALL
    SELECT 'evt ' || evtname || ' ' || evtenabled::text FROM pg_event_trigger
    UNION ALL
    SELECT 'stx ' || stxrelid::regclass || ' ' || stxname FROM pg_statistic_ext
    UNION ALL
    SELECT 'stxd ' || count(*) FROM pg_statistic_ext_data
    UNION ALL
    SELECT 'desc ' || classoid || ' ' || objoid || ' ' || objsubid || ' ' || md5(description)
    FROM pg_description WHERE objoid >= 16384
    UNION ALL
    SELECT 'seq ' || schemaname || '.' || sequencename || ' ' || coalesce(last_value::text, '-')
        || ' ' || start_value || ' ' || increment_by || ' ' || cache_size || ' ' || min_value
        || ' ' || max_value || ' ' || cycle
    FROM pg_sequences
    UNION ALL
    SELECT 'stat ' || starelid::regclass || ' ' || staattnum
    FROM pg_statistic s JOIN pg_class c ON c.oid = s.starelid JOIN ns ON ns.oid = c.relnamespace
    UNION ALL
    SELECT 'ext ' || extname || ' ' || extversion FROM pg_extension
    UNION ALL
    SELECT 'defacl ' || defaclrole || ' ' || defaclobjtype::text || ' ' || defaclacl::text
    FROM pg_default_acl
    UNION ALL
    -- Not the connection limit or whether connections are allowed: a reset compares with
    -- them shut, and opens them after.
    SELECT 'db ' || coalesce(datacl::text, '')
        || ' ' || pg_get_userbyid(datdba) || ' ' || datistemplate
    FROM pg_database WHERE datname = current_database()
    UNION ALL
    SELECT 'set ' || setrole || ' ' || setconfig::text FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL
    SELECT 'lo ' || count(*) FROM pg_largeobject_metadata
    UNION ALL
    SELECT 'pub ' || pubname FROM pg_publication
)
SELECT md5(string_agg(x, E'\\n' ORDER BY x)) FROM parts
"""


@dataclass(frozen=True)
class Reference:
    """A fresh copy of the template, as seen by `reference`."""

    digest: str
    empty: tuple[str, ...]
    """Tables with no rows: emptied (TRUNCATE) when a used database is reset."""
    filled: dict[str, str]
    """Tables the migrations put rows in, with a digest of their rows: left as they are and
    compared."""
    sequences: dict[str, int | None]
    """Each sequence's last value (None: never used), restored when a used database is reset."""
    sizes: dict[str, int]
    """Each empty table's size in bytes: one that grew held rows since (dead ones too)."""
    index_sizes: dict[str, tuple[int, float]]
    """Each index's size estimate (pages, tuples): a new empty btree's is (1, 0), a truncated
    one's (0, -1); restored, so the planner estimates as on a fresh copy."""


async def _tables(conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch(
        f"""
        SELECT format('%I.%I', n.nspname, c.relname) AS name
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p') AND n.nspname {_USER.format(col="n.nspname")}
        ORDER BY 1
        """
    )
    return [r["name"] for r in rows]


async def _rows_digest(conn: asyncpg.Connection, table: str) -> str:
    digest: str | None = await conn.fetchval(
        f"SELECT md5(string_agg(t::text, E'\\n' ORDER BY t::text)) FROM {table} t"
    )
    return digest or ""


async def digest(conn: asyncpg.Connection, reference: Reference) -> str:
    """The digest of everything but the rows of `reference.empty`'s tables (which must be
    empty: the digest says so) and of the filled tables' rows."""
    parts = [await conn.fetchval(_DIGEST_SQL)]
    for table in sorted(reference.filled):
        parts.append(f"{table} {await _rows_digest(conn, table)}")
    if reference.empty:
        nonempty = " UNION ALL ".join(
            f"SELECT '{t}' WHERE EXISTS (SELECT FROM {t})" for t in reference.empty
        )
        parts.append(",".join(r[0] for r in await conn.fetch(nonempty)))
    return "\n".join(parts)


_INDEX_SIZES_SQL = f"""
SELECT c.oid::regclass::text AS name, c.relpages, c.reltuples
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'i' AND n.nspname {_USER.format(col="n.nspname")}
"""

_SEQUENCES_SQL = """
SELECT format('%I.%I', schemaname, sequencename) AS name, last_value FROM pg_sequences
"""


async def reference(conn: asyncpg.Connection) -> Reference:
    """What a fresh database (`conn`'s) looks like."""
    empty: list[str] = []
    filled: dict[str, str] = {}
    for table in await _tables(conn):
        if await conn.fetchval(f"SELECT EXISTS (SELECT FROM {table})"):
            filled[table] = await _rows_digest(conn, table)
        else:
            empty.append(table)
    sequences = {r["name"]: r["last_value"] for r in await conn.fetch(_SEQUENCES_SQL)}
    sizes = {r["name"]: (r["relpages"], r["reltuples"]) for r in await conn.fetch(_INDEX_SIZES_SQL)}
    table_sizes = {t: await conn.fetchval(f"SELECT pg_relation_size('{t}')") for t in empty}
    found = Reference("", tuple(empty), filled, sequences, table_sizes, sizes)
    return Reference(await digest(conn, found), found.empty, filled, sequences, table_sizes, sizes)


async def reset(conn: asyncpg.Connection, reference: Reference) -> None:
    """Empty what the last test wrote (rows, and pages of rows gone since), restore the
    sequences and the size estimates. `conn` is a superuser's, alone on the database."""
    if reference.empty:
        touched = " UNION ALL ".join(
            f"SELECT '{t}' WHERE pg_relation_size('{t}') <> {reference.sizes[t]} "
            f"OR EXISTS (SELECT FROM {t})"
            for t in reference.empty
        )
        tables = [r[0] for r in await conn.fetch(touched)]
        if tables:
            # CASCADE: a table that references one of them goes too (it is empty, or the
            # digest tells).
            await conn.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
            names = list(reference.index_sizes)
            await conn.execute(
                """
                UPDATE pg_class c SET relpages = x.pages, reltuples = x.tuples
                FROM unnest($1::text[], $2::int[], $3::real[]) AS x(name, pages, tuples)
                WHERE c.oid = to_regclass(x.name)
                  AND (c.relpages, c.reltuples) IS DISTINCT FROM (x.pages, x.tuples)
                """,
                names,
                [reference.index_sizes[n][0] for n in names],
                [reference.index_sizes[n][1] for n in names],
            )
    # Every sequence, used or not: one set back with is_called false shows no last value.
    for name, wanted in reference.sequences.items():
        if wanted is None:
            await conn.execute(f"ALTER SEQUENCE {name} RESTART")
        else:
            await conn.execute(f"SELECT setval('{name}', {wanted})")


async def matches(conn: asyncpg.Connection, reference: Reference) -> bool:
    """Forget the activity counters; True if the database is exactly as `reference`."""
    await conn.execute("SELECT pg_stat_reset()")
    return await digest(conn, reference) == reference.digest
