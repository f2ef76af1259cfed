"""The suite's own machinery: a used test database is handed to another test only if its reset
leaves it exactly as a fresh copy of the template (tests/support/db_state.py); the maker keeps
one admin connection, and the broker clean-up deletes only what a test declared."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.exceptions import ChannelNotFoundEntity

from events.routes import PACKAGE_ACTIVATE
from infra.rabbit.connection import connect
from infra.rabbit.topology import declare_all
from infra.settings import Settings
from tests.conftest import AMQP_URL, PG_SERVER, make_settings
from tests.support import db_state, test_databases
from tests.support.broker_cleanup import BrokerCleanup
from tests.support.observing import eventually
from tests.support.test_databases import TestDatabases


@pytest.fixture
async def conn(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    found = await asyncpg.connect(settings.postgres_dsn)  # the superuser's, as the reset's
    yield found
    await found.close()


async def test_rows_and_used_sequences_are_reset_to_exactly_the_fresh_state(
    conn: asyncpg.Connection,
) -> None:
    fresh = await db_state.reference(conn)
    await conn.execute(
        "INSERT INTO telecom.inbox (consumer, message_id) VALUES ('usage_record', $1)", uuid4()
    )
    await conn.execute("SELECT nextval('telecom.outbox_id_seq')")
    # Set back, unused as far as pg_sequences shows, but not at its start.
    await conn.execute("SELECT setval('telecom.parked_id_seq', 100, false)")
    # Gone again, but its pages stay (dead rows): a fresh copy has none.
    await conn.execute("INSERT INTO telecom.leases VALUES ('x', gen_random_uuid(), now())")
    await conn.execute("DELETE FROM telecom.leases")
    assert await db_state.digest(conn, fresh) != fresh.digest

    await db_state.reset(conn, fresh)

    assert await db_state.matches(conn, fresh)
    assert await conn.fetchval("SELECT count(*) FROM telecom.inbox") == 0
    assert await conn.fetchval("SELECT nextval('telecom.outbox_id_seq')") == 1
    assert await conn.fetchval("SELECT nextval('telecom.parked_id_seq')") == 1
    assert await conn.fetchval("SELECT pg_relation_size('telecom.leases')") == 0


@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE telecom.inbox ADD COLUMN note text",
        "CREATE INDEX inbox_note ON telecom.inbox (processed_at, consumer)",
        "REVOKE SELECT ON telecom.inbox FROM PUBLIC; GRANT SELECT ON telecom.inbox TO PUBLIC",
        "ALTER TABLE telecom.inbox SET (fillfactor = 50)",
        "CREATE TABLE public.left_behind (a int)",
        "DROP TRIGGER outbox_count_puts ON telecom.outbox",
        "ANALYZE telecom.schema_migrations",
        "UPDATE telecom.schema_migrations SET name = 'edited' WHERE version = 1",
        "COMMENT ON TABLE telecom.inbox IS 'left by a test'",
        "ALTER TABLE telecom.outbox DISABLE TRIGGER ALL",
        "ALTER TABLE telecom.inbox ALTER COLUMN consumer SET STATISTICS 10",
    ],
)
async def test_a_database_a_test_changed_beyond_its_rows_is_not_reset_but_dropped(
    conn: asyncpg.Connection, change: str
) -> None:
    fresh = await db_state.reference(conn)
    await conn.execute(change)

    await db_state.reset(conn, fresh)

    assert not await db_state.matches(conn, fresh)


async def _no_broker(_: str) -> None:
    return None


async def _existing(admin_dsn: str, names: list[str]) -> list[str]:
    """Which of `names` are databases on the server."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        rows = await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname = ANY($1::text[])", names
        )
    finally:
        await conn.close()
    return [r[0] for r in rows]


def _maker(admin_dsn: str, template_db: str) -> TestDatabases:
    """A maker of its own (not the session's), copying `template_db`, with no broker."""
    return TestDatabases(
        admin_dsn, lambda name: f"CREATE DATABASE {name} TEMPLATE {template_db}", _no_broker
    )


def test_a_used_database_comes_back_renamed_and_fresh_and_all_are_dropped_at_the_end(
    template_db: str,
) -> None:
    admin_dsn = f"{PG_SERVER}/postgres"
    maker = _maker(admin_dsn, template_db)
    first = maker.take()

    async def use(name: str) -> None:
        conn = await asyncpg.connect(f"{PG_SERVER}/{name}")
        try:
            await conn.execute(
                "INSERT INTO telecom.inbox (consumer, message_id) VALUES ('c', $1)", uuid4()
            )
        finally:
            await conn.close()

    asyncio.run(use(first))
    maker.give_back(first)
    maker._removals[-1].result()  # the reset done
    second = maker.take()

    async def state(name: str) -> tuple[int, list[str]]:
        names = await _existing(admin_dsn, [first, second])
        if second not in names:
            return -1, names
        conn = await asyncpg.connect(f"{PG_SERVER}/{second}")
        try:
            return await conn.fetchval("SELECT count(*) FROM telecom.inbox"), names
        finally:
            await conn.close()

    rows, names = asyncio.run(state(second))
    assert second != first
    assert (maker.recycled, rows, names) == (1, 0, [second])  # the first, renamed and emptied

    maker.give_back(second)
    maker.close()
    assert asyncio.run(state(second))[1] == []


def test_a_database_with_a_connection_that_outlives_its_termination_is_dropped_not_handed_on(
    template_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A backend that survives pg_terminate_backend (here: the termination does nothing) could
    # change the database after its reset was checked: it must not reach another test.
    monkeypatch.setattr(test_databases, "TERMINATE_LEFTOVERS", "SELECT 1")
    admin_dsn = f"{PG_SERVER}/postgres"
    maker = _maker(admin_dsn, template_db)
    name = maker.take()
    survivor = subprocess.Popen(  # psql: a connection the test leaves behind
        ["psql", "-X", "-q", "-d", f"{PG_SERVER}/{name}", "-c", "SELECT pg_sleep(60)"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def connected() -> int:
        conn = await asyncpg.connect(admin_dsn)
        try:
            found: int = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name
            )
        finally:
            await conn.close()
        return found

    async def survivor_connected() -> bool:
        return await connected() > 0

    try:
        asyncio.run(eventually(survivor_connected, within=5))
        assert asyncio.run(connected()) == 1
        maker.give_back(name)
        maker._removals[-1].result()
        assert maker.recycled == 0  # not reset for another test
        assert asyncio.run(_existing(admin_dsn, [name])) == []  # dropped, its connection too
        assert survivor.wait(timeout=10) != 0
    finally:
        survivor.kill()
        maker.close()


def test_the_maker_connects_again_when_its_kept_admin_connection_was_lost(
    template_db: str,
) -> None:
    # A restart test stops PostgreSQL under the maker's kept connection to `postgres`.
    admin_dsn = f"{PG_SERVER}/postgres"
    maker = _maker(admin_dsn, template_db)
    try:
        first = maker.take()

        async def kill_admin() -> None:
            assert maker._admin_conn is not None
            pid = maker._admin_conn.get_server_pid()
            killer = await asyncpg.connect(admin_dsn)
            try:
                assert await killer.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)
            finally:
                await killer.close()

        asyncio.run(kill_admin())
        maker.give_back(first)
        maker._removals[-1].result()
        assert maker.recycled == 1  # reset and renamed through a new admin connection
    finally:
        maker.close()
    assert all(removal.exception() is None for removal in maker._removals)


async def test_the_broker_clean_up_deletes_a_declared_namespace_and_skips_an_untouched_one(
    settings: Settings,
) -> None:
    declared = make_settings(f"pkgq_t_{uuid4().hex[:12]}")
    untouched = make_settings(f"pkgq_t_{uuid4().hex[:12]}")
    names = {declared.queue_prefix: declared, untouched.queue_prefix: untouched}
    cleanup = BrokerCleanup(AMQP_URL, lambda ns: names[f"{ns}.pkgq"])
    conn = await connect(AMQP_URL, "pkgq-test")
    try:
        channel = await conn.channel()
        await declare_all(channel, declared)
        await channel.close()

        await cleanup(untouched.queue_prefix.removesuffix(".pkgq"))  # nothing to delete
        await cleanup(declared.queue_prefix.removesuffix(".pkgq"))

        channel = await conn.channel()
        with pytest.raises(ChannelNotFoundEntity):
            await channel.get_exchange(declared.exchange, ensure=True)
        channel = await conn.channel()
        with pytest.raises(ChannelNotFoundEntity):
            await channel.declare_queue(declared.queue_name(PACKAGE_ACTIVATE.name), passive=True)
    finally:
        await cleanup.close()
        await conn.close()
