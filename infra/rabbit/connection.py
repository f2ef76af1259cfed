"""Robust AMQP connections that reconnect (and re-declare) after a broker restart."""

from __future__ import annotations

import sys

import aio_pika
from aio_pika.abc import AbstractRobustConnection

DEEPEST_HEADERS = 70_000
"""Python frames pamqp may need to decode one content header: it recurses twice per level of
nesting, and a header frame (at most 128 KiB, RabbitMQ's frame_max) holds up to ~26,000 nested
arrays of 5 bytes each. At Python's default limit of 1000, a publisher's 600-deep header table
raises RecursionError in the frame reader, which kills the connection, and the broker delivers
the same message again on the next one, for ever. pamqp's recursion is Python calling Python,
which since 3.11 takes no C stack; pkgq's own handling of header values is bounded in depth
(events.envelope.jsonable) before anything recursive in C (repr, json) sees them."""


def allow_deep_headers() -> None:
    """Let pamqp decode any header an AMQP frame can hold (see DEEPEST_HEADERS)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), DEEPEST_HEADERS))


async def connect(url: str, name: str) -> AbstractRobustConnection:
    allow_deep_headers()
    return await aio_pika.connect_robust(
        url, client_properties={"connection_name": name}, reconnect_interval=1.0
    )
