"""PKGQ_AMQP_URL as a list of nodes: pkgq connects to one that answers, and when its node goes
it moves to another, with its channels and consumers restored there. Two proxies in front of
the real broker stand for two nodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
from pydantic import ValidationError

from infra.rabbit.connection import NodeListConnection, connect
from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.proxy import FreezingProxy


@pytest.fixture
async def nodes() -> AsyncIterator[tuple[FreezingProxy, FreezingProxy]]:
    first = await FreezingProxy("127.0.0.1", 5672).start()
    second = await FreezingProxy("127.0.0.1", 5672).start()
    yield first, second
    await first.close()
    await second.close()


def _url(proxy: FreezingProxy) -> str:
    return f"amqp://guest:guest@127.0.0.1:{proxy.port}/"


async def test_a_node_list_skips_a_node_that_is_down_at_start(
    nodes: tuple[FreezingProxy, FreezingProxy],
) -> None:
    down, up = nodes
    down.refusing = True
    connection = await connect(f"{_url(down)},{_url(up)}", "pkgq-test-nodes")
    try:
        assert isinstance(connection, NodeListConnection)
        assert connection.node == _url(up).replace(":guest@", ":***@")
        assert up.accepted == 1
    finally:
        await connection.close()


async def test_a_consumer_moves_to_another_node_when_its_node_dies_and_keeps_consuming(
    nodes: tuple[FreezingProxy, FreezingProxy],
) -> None:
    first, second = nodes
    connection = await connect(f"{_url(first)},{_url(second)}", "pkgq-test-nodes")
    received: list[bytes] = []
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue("", exclusive=False, auto_delete=False)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            received.append(message.body)
            await message.ack()

        await queue.consume(on_message)
        await channel.default_exchange.publish(aio_pika.Message(b"before"), queue.name)
        await eventually(lambda: _has(received, b"before"), within=10)
        first.refusing = True
        first.cut()  # the node dies: its connections are reset, and it takes no new ones
        await eventually(lambda: _connected_to(connection, second), within=20)
        # The channel and its consumer are restored in the background after the reconnection:
        # a publish before that fails, as the library documents (seen under load).
        await asyncio.wait_for(channel.ready(), timeout=20)
        await channel.default_exchange.publish(aio_pika.Message(b"after"), queue.name)
        await eventually(lambda: _has(received, b"after"), within=10)
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
    assert second.accepted >= 1


async def _has(received: list[bytes], body: bytes) -> bool:
    return body in received


async def _connected_to(connection: object, proxy: FreezingProxy) -> bool:
    assert isinstance(connection, NodeListConnection)
    await asyncio.sleep(0)
    return connection.connected.is_set() and str(proxy.port) in connection.node


def test_nodes_of_one_list_must_share_scheme_user_and_vhost() -> None:
    with pytest.raises(ValidationError, match="differ in scheme, user, virtual host"):
        Settings(amqp_url="amqp://a:x@h1:5672/,amqp://b:y@h2:5672/")
    settings = Settings(amqp_url="amqp://a:x@h1:5672/, amqp://a:x@h2:5673/")
    assert settings.amqp_urls == ["amqp://a:x@h1:5672/", "amqp://a:x@h2:5673/"]
    assert settings.amqp_user == "a"
    assert "x@" not in settings.safe_amqp_url()
