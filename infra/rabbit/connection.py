"""Robust AMQP connections that reconnect (and re-declare) after a broker restart."""

from __future__ import annotations

import aio_pika
from aio_pika.abc import AbstractRobustConnection


async def connect(url: str, name: str) -> AbstractRobustConnection:
    return await aio_pika.connect_robust(
        url, client_properties={"connection_name": name}, reconnect_interval=1.0
    )
