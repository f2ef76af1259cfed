"""The metrics the dashboard and the alert rules need: held users, consumers per queue, reaped
workers (deploy/observability/)."""

from __future__ import annotations

import os
import socket
from uuid import UUID, uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection
from prometheus_client import REGISTRY

from consumers.runtime import services, start_status_server
from consumers.worker import Services, WorkerHeartbeat
from events.routes import USAGE_RECORD
from infra.postgres import holds
from infra.settings import Settings
from tests.support.broker_connections import close_connection
from tests.support.in_process import InProcess
from tests.support.observing import eventually
from tests.support.processes import free_port, http_get
from tests.support.workers import stale_worker


def _served(settings: Settings) -> tuple[Settings, int]:
    port = free_port()
    return settings.model_copy(
        update={"http_port": port, "http_host": "127.0.0.1", "metrics_refresh_interval": 0.2}
    ), port


async def _metrics_show(port: int, *lines: str) -> bool:
    status, text = await http_get(port, "/metrics")
    return status == 200 and all(f"\n{line}\n" in text for line in lines)


async def test_held_users_are_counted_by_consumer_and_state_and_a_released_hold_is_not(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    retrying, buried, released = uuid4(), uuid4(), uuid4()
    async with pool.acquire() as conn:
        await holds.hold_many(
            conn,
            "usage_record",
            [
                holds.NewHold(retrying, uuid4(), "retrying", 1, "x"),
                holds.NewHold(buried, uuid4(), "buried", 25, "x"),
            ],
        )
        await holds.hold_many(
            conn, "package_purchase", [holds.NewHold(released, None, "releasing", 3, "x")]
        )
    served, port = _served(settings)
    server = await start_status_server(served, lambda: True, Services(pool, amqp))
    assert server is not None
    try:

        async def counted() -> bool:
            return await _metrics_show(
                port,
                'pkgq_held_users{consumer="usage_record",state="retrying"} 1.0',
                'pkgq_held_users{consumer="usage_record",state="buried"} 1.0',
            )

        await eventually(counted)
        _, text = await http_get(port, "/metrics")
        assert 'pkgq_held_users{consumer="package_purchase"' not in text
    finally:
        await server.stop()


async def test_consumers_per_queue_follow_subscriptions_and_a_missing_queue_reads_minus_one(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    queue = settings.queue_name(USAGE_RECORD.name)
    served, port = _served(settings)
    channel = await amqp.channel()
    await channel.queue_delete(settings.queue_name("telecom.package_cancel"))
    await channel.close()
    server = await start_status_server(served, lambda: True, Services(pool, amqp))
    assert server is not None
    try:

        async def unconsumed() -> bool:
            return await _metrics_show(
                port,
                f'pkgq_queue_consumers{{queue="{queue}"}} 0.0',
                f'pkgq_queue_consumers{{queue="{settings.queue_prefix}.telecom.package_cancel"}}'
                " -1.0",
            )

        await eventually(unconsumed)
    finally:
        await server.stop()

    app = InProcess(served, pool, amqp)  # its own status server, on the same port
    await app.start_consumers([USAGE_RECORD])
    try:

        async def consumed() -> bool:
            try:
                return await _metrics_show(port, f'pkgq_queue_consumers{{queue="{queue}"}} 1.0')
            except ConnectionRefusedError:  # the consumers' status server is not up yet
                return False

        await eventually(consumed)
    finally:
        await app.close()


async def test_a_heartbeat_that_reaps_a_stale_peer_counts_it_in_the_reaped_workers_metric(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    peer = await stale_worker(pool, "peer", host="h", pid=2)
    before = REGISTRY.get_sample_value("pkgq_workers_reaped_total") or 0.0
    quick = settings.model_copy(update={"worker_stale_after": 1.0, "heartbeat_interval": 0.1})
    beat = WorkerHeartbeat(quick, Services(pool, amqp), "pkgq-test@h:1", "test", "h", 1)
    reaped: list[UUID] = []

    async def reaps() -> bool:
        reaped.extend(await beat.beat())
        return bool(reaped)

    try:
        await eventually(reaps, within=20, every=0.2)
    finally:
        await beat.stop("exited")
    assert reaped == [peer]
    assert REGISTRY.get_sample_value("pkgq_workers_reaped_total") == before + 1


async def test_a_connection_the_broker_closes_is_re_established_and_counted_as_a_reconnect(
    settings: Settings,
) -> None:
    role = f"reconnect-{uuid4().hex[:8]}"
    name = f"pkgq-{role}@{socket.gethostname()}:{os.getpid()}"
    before = REGISTRY.get_sample_value("pkgq_reconnects_total") or 0.0
    async with services(settings, role) as svc:
        await close_connection(settings, name)

        async def reconnected() -> bool:
            return (REGISTRY.get_sample_value("pkgq_reconnects_total") or 0.0) > before

        await eventually(reconnected, within=30)
        channel = await svc.amqp.channel()  # and it works again
        await channel.close()
    assert REGISTRY.get_sample_value("pkgq_reconnects_total") == before + 1
