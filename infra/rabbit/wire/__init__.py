"""The wire accelerator: aiormq's frame paths made cheaper, optional, behind one seam.

pkgq speaks AMQP through aio-pika and aiormq. On the hot paths aiormq does more work than it
must: three reads per frame, pamqp's generic decoder for every field, a Task per delivery, a
socket write per publish. This package replaces those paths with equivalents that put the same
bytes on the wire and build the same pamqp objects:

- `frames.py`: frames read in chunks and cut out of one buffer; writes coalesced into one
  send; deliveries handed to pkgq's callback in the channel's reader task (no Task each);
- `frame_decode.py`: a delivery's three frames decoded with precompiled structs;
- `coalesce.py`: the publishes begun in one turn of the event loop marshalled as one frame.

The seam is `install()`, called by infra/rabbit/connection.connect before a connection is made.
Nothing else in pkgq needs to know whether it is installed: the channel it installs calls a
callback marked `called_inline` (infra/rabbit/deliveries.Handover) in its reader task, and
`Publishing` sends through the coalescer when it is installed, else through aiormq's own
basic_publish.

PKGQ_WIRE_ACCELERATOR=false leaves aiormq as it ships (the suite's delivery tests run both
ways). The accelerator is also left out, with a warning, when the installed aiormq or pamqp is
not a version it was checked against (frames.TESTED_AIORMQ, frame_decode.TESTED_PAMQP).
"""

from __future__ import annotations

import asyncio

import aiormq
import aiormq.abc
from pamqp.commands import Basic

from infra.rabbit.wire import coalesce, frames

_decided: bool | None = None
"""Whether this process runs with the accelerator (None: no connection was made yet)."""


def install(enabled: bool = True) -> bool:
    """Decide, once per process, whether aiormq runs with the accelerator, and install it if so.
    The first call decides (PKGQ_WIRE_ACCELERATOR is a setting of the process): a later call
    returns what was decided. False when turned off, or when aiormq or pamqp is a version the
    accelerator was not checked against."""
    global _decided
    if _decided is None:
        _decided = frames.install() if enabled else False
    return _decided


def installed() -> bool:
    """Whether the accelerator is in use in this process."""
    return bool(_decided)


class Publishing:
    """One channel's publishes: coalesced (coalesce.Coalescer) with the accelerator, else
    aiormq's own `basic_publish` with `wait=False` (the channel's lock is not held until the
    frames reach the socket). Either way each publish returns its own confirmation."""

    def __init__(self) -> None:
        self._coalescer: coalesce.Coalescer | None = None

    async def publish(
        self,
        channel: aiormq.Channel,
        body: bytes,
        exchange: str,
        routing_key: str,
        properties: Basic.Properties,
        timeout: float | None,  # noqa: ASYNC109  (aiormq's basic_publish takes one too)
    ) -> object:
        if installed() and coalesce.usable():
            coalescer = self._coalescer
            if coalescer is None or coalescer.channel is not channel:
                coalescer = self._coalescer = coalesce.Coalescer(channel)
            async with asyncio.timeout(timeout):
                return await coalescer.publish(body, exchange, routing_key, properties)
        return await channel.basic_publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            properties=properties,
            mandatory=True,
            timeout=timeout,
            wait=False,
        )
