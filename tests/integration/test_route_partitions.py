"""The deployment's recorded partition map (telecom.route_partitions): what `pkgq migrate`
records on a new and on an existing database, that a process refuses a configured map that
disagrees with it, that `pkgq partitions set` changes it only as the procedure allows, and that
a process routes by it."""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator
from uuid import UUID, uuid4

import aio_pika
import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.routes import PACKAGE_PURCHASE, PACKAGE_QUEUING, ROUTES, USAGE_RECORD
from infra.postgres import route_partitions
from infra.postgres.migrate import migrate
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from tests.support import pg_roles
from tests.support.processes import cli

PG_SERVER = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture
async def fresh_db(template_db: str) -> AsyncIterator[str]:
    """A database of its own with no schema yet (as a new deployment's), owned by the owner
    role (made with the template's roles): its name."""
    name = f"pkgq_t_parts_{uuid4().hex[:10]}"
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await admin.execute(f"CREATE DATABASE {name} OWNER {pg_roles.OWNER}")
    finally:
        await admin.close()
    yield name
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


async def _migrated(name: str, configured: Settings, target: int | None = None) -> dict[str, int]:
    """Migrate the database `name` as `pkgq migrate` does with `configured`'s partitions; the
    map recorded in it after."""
    conn = await asyncpg.connect(pg_roles.as_role(f"{PG_SERVER}/{name}", pg_roles.OWNER))
    try:
        await migrate(
            conn,
            target,
            runtime_role=pg_roles.RUNTIME,
            partitions=configured.partitions_to_record,
            recorded_by="test",
        )
        return await route_partitions.recorded(conn)
    finally:
        await conn.close()


async def test_a_new_database_records_sixteen_partitions_for_usage_and_purchase(
    fresh_db: str,
) -> None:
    recorded = await _migrated(fresh_db, Settings(partitions={}, route_settings={}))
    assert recorded == {
        name: 16 if name in (USAGE_RECORD.name, PACKAGE_PURCHASE.name) else 1 for name in ROUTES
    }


async def test_an_existing_database_with_a_user_records_one_partition_everywhere(
    fresh_db: str,
) -> None:
    unconfigured = Settings(partitions={}, route_settings={})
    assert await _migrated(fresh_db, unconfigured, target=28) == {}  # no table yet
    conn = await asyncpg.connect(f"{PG_SERVER}/{fresh_db}")
    try:
        await conn.execute("INSERT INTO telecom.queue_users (user_id) VALUES ($1)", uuid4())
    finally:
        await conn.close()
    assert await _migrated(fresh_db, unconfigured) == dict.fromkeys(ROUTES, 1)


async def test_pkgq_migrate_records_the_configured_map_and_never_overwrites_a_recorded_row(
    settings: Settings,
) -> None:
    four = settings.model_copy(update={"partitions": {USAGE_RECORD.name: 4}})
    done = await cli(four, "migrate")
    assert done.returncode == 0, done.stderr
    eight = settings.model_copy(update={"partitions": {USAGE_RECORD.name: 8}})
    again = await cli(eight, "migrate")
    assert again.returncode == 0, again.stderr
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        recorded = await route_partitions.recorded_rows(conn)
    finally:
        await conn.close()
    assert {name: row["partitions"] for name, row in recorded.items()} == {
        **dict.fromkeys(ROUTES, 1),
        USAGE_RECORD.name: 4,
    }
    assert recorded[USAGE_RECORD.name]["recorded_by"].startswith("pkgq migrate (")


async def test_a_process_configured_with_other_partitions_than_recorded_refuses_to_start(
    settings: Settings,
) -> None:
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        await route_partitions.change(conn, USAGE_RECORD.name, 4, "test")
    finally:
        await conn.close()
    two = settings.model_copy(update={"partitions": {USAGE_RECORD.name: 2}})
    refused = await cli(two, "run", "usage_record")
    assert refused.returncode == 6, refused.stderr
    assert "telecom.usage_record: configured 2, recorded 4" in refused.stderr
    assert "pkgq partitions set ROUTE P" in refused.stderr
    published = await cli(two, "publish", "usage_record", json.dumps(_usage_body()))
    assert published.returncode == 6
    assert "configured 2, recorded 4" in published.stderr
    assert (await cli(two, "partitions", "pause", "usage_record")).returncode == 0
    corrected = await cli(two, "partitions", "set", "usage_record", "2")  # nothing in .p0-.p3
    assert corrected.returncode == 0, corrected.stderr
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        assert (await route_partitions.recorded(conn))[USAGE_RECORD.name] == 2
    finally:
        await conn.close()


def _usage_body() -> dict[str, object]:
    return {"user_id": str(uuid4()), "upload": 1, "download": 2}


async def test_partitions_set_refuses_a_route_with_messages_or_unpaused_and_changes_a_drained_paused_one(  # noqa: E501
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    channel = await amqp.channel()
    exchange = await channel.get_exchange(settings.exchange)
    await exchange.publish(aio_pika.Message(b"{}"), USAGE_RECORD.name)
    await channel.close()

    busy = await cli(settings, "partitions", "set", "usage_record", "16")
    assert busy.returncode == 6
    assert f"{settings.queue_name(USAGE_RECORD.name)} holds 1 message(s)" in busy.stderr

    unpaused = await cli(settings, "partitions", "set", "package_queuing", "4")
    assert unpaused.returncode == 6
    assert "its relaying is not paused" in unpaused.stderr

    assert (await cli(settings, "partitions", "pause", "package_queuing")).returncode == 0
    changed = await cli(settings, "partitions", "set", "package_queuing", "4", "--json")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout) == {
        "route": PACKAGE_QUEUING.name,
        "partitions": 4,
        "before": 1,
        "changed": True,
    }
    status = await cli(settings, "partitions", "status", "package_queuing", "--json")
    assert json.loads(status.stdout)["partitions"] == 4
    conn = await asyncpg.connect(settings.postgres_dsn)
    try:
        assert await route_partitions.recorded(conn) == {PACKAGE_QUEUING.name: 4}
    finally:
        await conn.close()


async def test_pkgq_publish_on_a_new_deployment_routes_a_usage_record_to_its_partition_queue(
    fresh_db: str, settings: Settings, amqp: AbstractRobustConnection
) -> None:
    await _migrated(fresh_db, Settings(partitions={}, route_settings={}))
    deployed = settings.model_copy(update={"postgres_dsn": f"{PG_SERVER}/{fresh_db}"})
    body = _usage_body()
    published = await cli(deployed, "publish", "usage_record", json.dumps(body))
    assert published.returncode == 0, published.stderr

    sixteen = settings.model_copy(update={"partitions": {USAGE_RECORD.name: 16}})
    expected = zlib.crc32(UUID(str(body["user_id"])).bytes) % 16
    channel = await amqp.channel()
    found = {}
    for k, (name, _) in enumerate(route_queues(sixteen, USAGE_RECORD.name)):
        queue = await channel.declare_queue(name, passive=True)
        found[k] = queue.declaration_result.message_count
    await channel.close()
    assert found == {k: int(k == expected) for k in range(16)}
