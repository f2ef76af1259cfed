"""The CLI as an operator uses it: real `pkgq` commands against the test's own namespace."""

from __future__ import annotations

import json
from collections.abc import Callable
from uuid import UUID, uuid4

import asyncpg
import pytest

from events.routes import ALL_ROUTES, ROUTES
from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli, free_port, http_get

pytestmark = pytest.mark.e2e


async def test_publish_validates_confirms_and_prints_the_message_id(settings: Settings) -> None:
    user = uuid4()
    done = await cli(
        settings,
        "publish",
        "usage_record",
        json.dumps({"user_id": str(user), "upload": 1, "download": 2}),
    )
    assert done.returncode == 0, done.stderr
    UUID(done.stdout.strip())  # a message_id and nothing else

    from_stdin = await cli(
        settings,
        "publish",
        "usage_record",
        "-",
        stdin=json.dumps({"user_id": str(user), "upload": 0, "download": 0}),
    )
    assert from_stdin.returncode == 0, from_stdin.stderr

    invalid = await cli(settings, "publish", "usage_record", '{"user_id": "x"}')
    assert invalid.returncode == 2  # a usage error, said on stderr
    assert "invalid RecordUsage" in invalid.stderr

    unknown = await cli(settings, "publish", "no_such_route", "{}")
    assert unknown.returncode == 2
    assert "unknown route" in unknown.stderr


async def test_catalog_purchase_cancel_and_user_show_through_the_cli(
    settings: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    added = await cli(
        settings, "catalog", "add", "5 GiB / 30 d", "--traffic", "5GiB", "--duration", "30d"
    )
    assert added.returncode == 0, added.stderr
    package = int(added.stdout.strip())
    listed = await cli(settings, "catalog", "list")
    assert "5 GiB / 30 d" in listed.stdout
    assert str(5 * 2**30) in listed.stdout

    spawn("relay")
    spawn("run")
    user = uuid4()
    body = json.dumps({"user_id": str(user), "package_id": package, "amount": 2})
    assert (await cli(settings, "publish", "package_purchase", body)).returncode == 0

    async def show() -> dict[str, object]:
        out = await cli(settings, "user", "show", str(user), "--json")
        assert out.returncode == 0, out.stderr
        result: dict[str, object] = json.loads(out.stdout)
        return result

    async def has_current() -> bool:
        return (await show())["current"] is not None

    await eventually(has_current, within=30)
    state = await show()
    current = state["current"]
    assert isinstance(current, dict)
    first = current["id"]
    assert (await cli(settings, "user", "cancel", str(first))).returncode == 0

    async def second_active() -> bool:
        current = (await show())["current"]
        return isinstance(current, dict) and current["id"] != first

    await eventually(second_active, within=30)
    state = await show()
    packages = state["packages"]
    assert isinstance(packages, list)
    assert [p["status"] for p in packages] == ["cancelled", "active"]

    missing = await cli(settings, "user", "cancel", "999999999")
    assert missing.returncode == 3  # not found, said on stderr
    assert "no queue item" in missing.stderr


async def test_demo_drives_every_route_and_exits_zero(settings: Settings) -> None:
    done = await cli(settings, "demo", "--timeout", "90")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"every route at work: {len(ALL_ROUTES)}/{len(ALL_ROUTES)}" in done.stdout
    assert "DEAD LETTER" in done.stdout


async def test_migrate_is_idempotent_from_the_cli(settings: Settings) -> None:
    done = await cli(settings, "migrate")
    assert done.returncode == 0, done.stderr
    assert "none (up to date)" in done.stdout


async def test_a_queue_declared_with_other_arguments_stops_run_with_instructions(
    settings: Settings,
) -> None:
    from infra.rabbit.connection import connect

    conn = await connect(settings.amqp_url, "pkgq-test-legacy")
    try:
        channel = await conn.channel()
        legacy = settings.queue_name("telecom.usage_record")
        await channel.declare_queue(legacy, durable=True)  # no DLX, no single-active-consumer
        await channel.close()
    finally:
        await conn.close()
    done = await cli(settings, "run", "usage_record")
    assert done.returncode == 6  # the broker is not as pkgq needs it
    assert "already exists with different arguments" in done.stderr
    assert f"rabbitmqctl delete_queue {legacy}" in done.stderr


async def test_relay_and_run_serve_health_readiness_and_metrics_on_their_status_port(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    relay_port, run_port = free_port(), free_port()
    relay = spawn("relay", PKGQ_HTTP_PORT=str(relay_port), PKGQ_HTTP_HOST="127.0.0.1")
    run = spawn("run", PKGQ_HTTP_PORT=str(run_port), PKGQ_HTTP_HOST="127.0.0.1")
    for port in (relay_port, run_port):

        async def ready(port: int = port) -> bool:
            try:
                return (await http_get(port, "/readyz"))[0] == 200
            except OSError:
                return False  # not listening yet

        await eventually(ready, within=30)
        assert (await http_get(port, "/healthz"))[0] == 200
    assert "pkgq_relay_published_total" in (await http_get(relay_port, "/metrics"))[1]
    assert "pkgq_in_flight" in (await http_get(run_port, "/metrics"))[1]
    assert relay.terminate() == 0, relay.logs()
    assert run.terminate() == 0, run.logs()


async def test_stats_counts_each_routes_ready_waiting_and_buried_messages_and_puts(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    user = uuid4()
    async with pool.acquire() as conn:
        await conn.execute(
            """
            INSERT INTO telecom.outbox (message_id, route, message_type, schema_version,
                                        user_id, body, available_at)
            VALUES (gen_random_uuid(), 'telecom.expiry_due', 'PackageExpiryDue', 1, $1, '{}',
                    now() + interval '1 hour'),
                   (gen_random_uuid(), 'telecom.usage_record', 'RecordUsage', 1, $1, '{}', now())
            """,
            user,
        )
        await conn.execute(
            """
            INSERT INTO telecom.dead_letters (dedup_key, source, route, consumer, body, reason,
                                              error_type, error_message)
            VALUES ('k1', 'consumer', 'telecom.usage_record', 'usage_record', '{}',
                    'invalid_json', 'BadMessageError', 'x')
            """
        )
    done = await cli(settings, "stats", "--json")
    assert done.returncode == 0, done.stderr
    table = json.loads(done.stdout)
    assert set(table) == set(ROUTES)
    assert table["telecom.expiry_due"]["detail"]["scheduled"] == 1
    assert table["telecom.expiry_due"]["waiting"] == 1
    assert table["telecom.usage_record"]["detail"]["outbox_pending"] == 1
    assert table["telecom.usage_record"]["detail"]["broker_ready"] == 0
    assert table["telecom.usage_record"]["ready"] == 1  # due in the outbox, none on the broker
    assert table["telecom.usage_record"]["buried"] == 1
    assert table["telecom.usage_record"]["transitions"]["put"] == 1
