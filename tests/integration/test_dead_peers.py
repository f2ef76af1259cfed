"""Every connection pkgq makes carries what finds a dead peer (infra/sockets.py): checked on
the sockets themselves, as the kernel holds them."""

from __future__ import annotations

import socket
from typing import Any

from consumers.web.dependencies import open_pool
from infra.postgres.pool import connect, create_pool
from infra.rabbit.connection import connect as connect_amqp
from infra.settings import Settings
from tests.web.client import web_settings


def _options(sock: Any) -> tuple[int, int, int]:
    """(SO_KEEPALIVE, TCP_KEEPIDLE, TCP_USER_TIMEOUT in ms) of a socket."""
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
    )


async def test_every_pooled_postgres_connection_times_out_a_silent_peer_after_the_setting(
    settings: Settings,
) -> None:
    pool = await create_pool(settings.postgres_dsn, min_size=2, max_size=2, dead_peer_timeout=3)
    try:
        async with pool.acquire() as first, pool.acquire() as second:
            for conn in (first, second):
                sock = conn._con._transport.get_extra_info("socket")  # type: ignore[attr-defined]
                assert _options(sock) == (1, 1, 3000)
    finally:
        await pool.close()


async def test_a_single_postgres_connection_times_out_a_silent_peer_after_the_setting(
    settings: Settings,
) -> None:
    conn = await connect(settings.postgres_dsn, dead_peer_timeout=8)
    try:
        assert _options(conn._transport.get_extra_info("socket")) == (1, 4, 8000)  # type: ignore[attr-defined]
    finally:
        await conn.close()


async def test_an_amqp_connection_asks_a_short_heartbeat_and_times_out_a_silent_peer(
    settings: Settings,
) -> None:
    connection = await connect_amqp(settings.amqp_url, "dead-peer-test", dead_peer_timeout=4)
    try:
        underlay = connection.transport.connection  # type: ignore[union-attr]
        assert underlay.connection_tune.heartbeat == 2  # what the broker agreed to: half
        factory = connection.kwargs["transport_factory"]
        assert _options(factory.socket) == (1, 2, 4000)
    finally:
        await connection.close()


async def test_the_web_consoles_pool_times_out_a_silent_peer_after_the_setting(
    settings: Settings,
) -> None:
    tuned = settings.model_copy(update={"dead_peer_timeout": 7})
    pool = await open_pool(tuned, web_settings())
    try:
        async with pool.acquire() as conn:
            sock = conn._con._transport.get_extra_info("socket")  # type: ignore[attr-defined]
            assert _options(sock)[2] == 7000
    finally:
        await pool.close()
