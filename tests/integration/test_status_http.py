"""The status port: /metrics, /healthz and /readyz of a running consumer process."""

from __future__ import annotations

import re
from uuid import uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.runtime import start_status_server
from consumers.worker import Services
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.observability import StatusServer
from infra.postgres.pool import create_pool
from infra.settings import Settings
from tests.support.deliveries import send, send_raw
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.processes import free_port, http_get


async def test_readyz_follows_the_readiness_check_and_turns_not_ready_when_draining() -> None:
    ready = False

    async def check() -> bool:
        return ready

    server = StatusServer("127.0.0.1", 0, check)
    await server.start()
    try:
        assert (await http_get(server.port, "/healthz"))[0] == 200
        assert (await http_get(server.port, "/readyz"))[0] == 503
        ready = True
        assert (await http_get(server.port, "/readyz"))[0] == 200
        server.draining = True
        assert await http_get(server.port, "/readyz") == (503, "draining\n")
        assert (await http_get(server.port, "/nowhere"))[0] == 404
    finally:
        await server.stop()


async def test_readyz_says_not_ready_without_the_exception_text_of_a_failed_check() -> None:
    async def check() -> bool:
        raise ConnectionError("postgresql://pkgq:SECRET@db.internal:5432/pkgq refused")

    server = StatusServer("127.0.0.1", 0, check)
    await server.start()
    try:
        assert await http_get(server.port, "/readyz") == (503, "not ready\n")
    finally:
        await server.stop()


async def test_the_status_port_binds_loopback_unless_a_host_is_configured(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    assert Settings.model_fields["http_host"].default == "127.0.0.1"
    port = free_port()
    loopback = Settings.model_validate(
        {**settings.model_dump(exclude={"http_host"}), "http_port": port}
    )
    server = await start_status_server(loopback, lambda: True, Services(pool, amqp))
    assert server is not None
    try:
        assert server.bound_hosts() == ["127.0.0.1"]
        assert (await http_get(port, "/readyz"))[0] == 200
    finally:
        await server.stop()


async def test_readyz_answers_while_the_consumers_pool_has_no_free_connection(
    in_process: StartApp, settings: Settings, amqp: AbstractRobustConnection
) -> None:
    port = free_port()
    served = settings.model_copy(update={"http_port": port, "http_host": "127.0.0.1"})
    consumers_pool = await create_pool(settings.postgres_dsn, min_size=1, max_size=1)
    app = in_process(served, consumers_pool, amqp)
    try:
        await app.start_consumers([USAGE_RECORD])

        async def ready() -> bool:
            return (await http_get(port, "/readyz"))[0] == 200

        await eventually(ready)
        async with consumers_pool.acquire():  # its only connection, as a long batch would
            assert await http_get(port, "/readyz") == (200, "ready\n")
    finally:
        await app.close()
        await consumers_pool.close()


async def test_a_consumer_process_reports_messages_by_outcome_and_job_states_and_transitions(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    port = free_port()
    served = settings.model_copy(
        update={"http_port": port, "http_host": "127.0.0.1", "metrics_refresh_interval": 0.2}
    )
    app = in_process(served, pool, amqp)
    await app.start_consumers([USAGE_RECORD])

    async def ready() -> bool:
        return (await http_get(port, "/readyz"))[0] == 200

    await eventually(ready)
    user = uuid4()
    before = await acked_usage(port)
    await send(served, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=1))

    async def counted() -> bool:
        return await acked_usage(port) == before + 1

    await eventually(counted)
    status, metrics = await http_get(port, "/metrics")
    assert status == 200
    assert 'pkgq_processing_seconds_count{route="telecom.usage_record"}' in metrics
    assert str(user) not in metrics  # label values never carry user or message ids
    assert (await http_get(port, "/healthz"))[0] == 200

    # The registry is the test process's: other tests' deliveries count there too, so
    # the counters are compared with what they were before.
    duplicates_before = await usage_count(port, "duplicate")
    duplicate = await send(
        served, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=2, download=0)
    )
    await send(  # the same message again: applied once, the second is a duplicate
        served,
        amqp,
        USAGE_RECORD,
        RecordUsage(user_id=user, upload=2, download=0),
        message_id=duplicate,
    )

    async def duplicate_counted() -> bool:
        return await usage_count(port, "duplicate") == duplicates_before + 1

    await eventually(duplicate_counted)
    assert await acked_usage(port) == before + 2
    await send_raw(served, amqp, USAGE_RECORD, b"{not json")  # buried: invalid_json

    # The job states and transitions are read from Postgres on a refresh of their own: wait
    # for the bury to show there too.
    async def buried_counted() -> bool:
        _, text = await http_get(port, "/metrics")
        return (
            'pkgq_dead_letters{route="telecom.usage_record"} 1.0' in text
            and 'pkgq_job_messages{route="telecom.usage_record",state="buried"} 1.0' in text
        )

    await eventually(buried_counted)
    text = (await http_get(port, "/metrics"))[1]
    assert "pkgq_outbox_pending " in text
    assert 'pkgq_job_messages{route="telecom.usage_record",state="done"} 2.0' in text
    assert 'pkgq_job_transitions{route="telecom.usage_record",transition="ack"} 2.0' in text
    assert 'pkgq_job_transitions{route="telecom.usage_record",transition="bury"} 1.0' in text
    await app.close()


async def acked_usage(port: int) -> float:
    return await usage_count(port, "acked")


async def usage_count(port: int, outcome: str) -> float:
    """pkgq_messages_total of usage_record deliveries with this outcome."""
    _, metrics = await http_get(port, "/metrics")
    found = re.search(
        rf'^pkgq_messages_total\{{outcome="{outcome}",route="telecom.usage_record"\}} (\S+)$',
        metrics,
        re.MULTILINE,
    )
    return float(found.group(1)) if found else 0.0
