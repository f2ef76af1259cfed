"""The alternate exchange: a command no queue is bound for becomes an `unroutable` dead letter.

An outside publisher with a stale partition map (or none: the plain key of a partitioned route)
used to lose its message silently, or have it returned when it asked with `mandatory`. The main
exchange's alternate exchange passes the inbound routes' keys on to the dead-letter queue, and
the ingester files them; pkgq's own relay still gets a return for the lifecycle and internal
keys (its row stays in the outbox, tests/integration/test_outbox_relay.py).
"""

from __future__ import annotations

import json
from uuid import uuid4

import aio_pika
import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from aio_pika.exceptions import PublishError
from structlog.testing import capture_logs

from consumers.ingest import UNROUTABLE
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION, H_USER_ID
from events.models import RecordUsage
from events.routes import INBOUND_ROUTES, USAGE_RECORD
from infra.rabbit.topology import declare_all, declare_exchanges, definitions, route_queues
from infra.settings import Settings
from tests.support.in_process import InProcess
from tests.support.observing import eventually


def _usage(user: str) -> aio_pika.Message:
    body = RecordUsage(user_id=uuid4(), upload=3, download=4).model_dump(mode="json")
    body["user_id"] = user
    return aio_pika.Message(
        json.dumps(body).encode(),
        message_id=str(uuid4()),
        type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        headers={H_SCHEMA_VERSION: USAGE_RECORD.schema_version, H_USER_ID: user},
    )


async def _partitioned(settings: Settings, amqp: AbstractRobustConnection) -> Settings:
    """The test's namespace with usage_record in two partitions (and no plain queue)."""
    split = settings.model_copy(update={"partitions": {USAGE_RECORD.name: 2}})
    channel = await amqp.channel()
    await channel.queue_delete(settings.queue_name(USAGE_RECORD.name))
    await declare_all(channel, split, [USAGE_RECORD])
    await channel.close()
    return split


async def _drop_partitions(split: Settings, amqp: AbstractRobustConnection) -> None:
    channel = await amqp.channel()
    for name, _ in route_queues(split, USAGE_RECORD.name):
        await channel.queue_delete(name)
    await channel.close()


async def test_a_command_on_the_plain_key_of_a_partitioned_route_is_filed_as_unroutable(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    split = await _partitioned(settings, amqp)
    app = InProcess(split, pool, amqp)
    await app.start_consumers([], ingest=True)
    try:
        channel = await amqp.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(split.exchange)
        user = str(uuid4())
        message = _usage(user)
        # Mandatory, yet not returned: the alternate exchange routed it.
        await exchange.publish(message, USAGE_RECORD.name, mandatory=True)
        await channel.close()

        async def filed() -> bool:
            async with pool.acquire() as conn:
                return bool(await conn.fetchval("SELECT count(*) FROM telecom.dead_letters"))

        await eventually(filed)
        async with pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT source, route, consumer, reason, message_id, user_id::text, body, "
                "status, error_message FROM telecom.dead_letters"
            )
            applied = await conn.fetchval("SELECT count(*) FROM telecom.inbox")
    finally:
        await app.close()
        await _drop_partitions(split, amqp)
    assert row is not None
    assert (row["source"], row["route"], row["consumer"], row["reason"], row["status"]) == (
        "broker",
        USAGE_RECORD.name,
        USAGE_RECORD.short_name,
        UNROUTABLE,
        "buried",
    )
    assert row["message_id"] == message.message_id
    assert row["user_id"] == user
    assert bytes(row["body"]) == message.body
    assert "partition" in row["error_message"]
    assert applied == 0


async def test_a_lifecycle_key_no_queue_is_bound_for_is_still_returned_to_a_mandatory_publish(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    channel = await amqp.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(settings.exchange)
    with pytest.raises(PublishError):
        await exchange.publish(_usage(str(uuid4())), "telecom.package_nowhere", mandatory=True)
    await channel.close()


async def test_an_exchange_an_older_pkgq_declared_without_the_alternate_exchange_still_works(
    settings: Settings,
) -> None:
    older = settings.model_copy(update={"exchange": f"{settings.exchange}.old"})
    connection = await aio_pika.connect_robust(settings.amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_exchange(older.exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        with capture_logs() as logs:
            exchange, _ = await declare_exchanges(channel, older)
        assert exchange.name == older.exchange
        assert not channel.is_closed
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
            "alternate_exchange_missing"
        ]
        assert "set_policy" in logs[0]["fix"]
        await channel.exchange_delete(older.exchange)
        await channel.exchange_delete(older.unroutable_exchange)
        await channel.exchange_delete(older.dlx)
        await channel.queue_delete(older.dead_letter_queue)
    finally:
        await connection.close()


def test_the_definitions_give_the_exchange_its_alternate_exchange_bound_for_inbound_keys_only(
    settings: Settings,
) -> None:
    document = definitions(settings, users=None)
    exchanges = {e["name"]: e for e in document["exchanges"]}
    assert exchanges[settings.exchange]["arguments"] == {
        "alternate-exchange": settings.unroutable_exchange
    }
    caught = sorted(
        b["routing_key"]
        for b in document["bindings"]
        if b["source"] == settings.unroutable_exchange
    )
    assert caught == sorted(f"{r.name}.#" for r in INBOUND_ROUTES.values())
    assert all(
        b["destination"] == settings.dead_letter_queue
        for b in document["bindings"]
        if b["source"] == settings.unroutable_exchange
    )
