"""What the relay replaces after a failed publish, how long it waits for it, and its waits.

A channel that failed a publish is never used again (infra/outbox/relay.py): these say whether
the channel or the whole connection goes, and whether a failed renewal is worth waiting for.
"""

from __future__ import annotations

import asyncio
import contextlib

from aio_pika.abc import AbstractRobustConnection

from infra.rabbit.publisher import PublishFailedError
from infra.transient import is_outage

RENEW_PAUSE = 0.25
"""The pause before a new channel is tried after a failed publish: short, since a lost node is
usually replaced within a second (another node, or the load balancer's next); a renewal that
fails is tried again after RENEW_RETRY_PAUSES."""
RENEW_RETRY_PAUSES = (0.25, 0.5, 1.0, 2.0)
"""Between attempts to renew the publisher while the broker gives no channel (its connection
is still reconnecting after a restart or a lost node): growing, then every 2 s."""
CONNECT_WAIT = 10.0
"""Seconds a renewal waits for the connection to come back before the round fails."""


def broker_unavailable(exc: BaseException, connection: AbstractRobustConnection) -> bool:
    """A renewal failed because the broker cannot be reached yet (worth waiting for), rather
    than for something a wait does not fix."""
    if is_outage(exc) or isinstance(exc, TimeoutError):
        return True
    # aio-pika's "Connection was not opened" while its robust connection reconnects.
    return isinstance(exc, RuntimeError) and (
        connection.is_closed or not connection.connected.is_set()
    )


def renewal_for(exc: BaseException, already: str | None) -> str | None:
    """What a failed publish asks to replace: the connection when a confirm never came (the
    channel may look open on a node cut off from its cluster); the channel after a nack or on
    a closed channel; nothing for a message returned as unroutable (a fact about its route,
    which the next round retries: the other users' rows go on meanwhile)."""
    if already == "connection" or isinstance(exc, TimeoutError):
        return "connection"
    if isinstance(exc, PublishFailedError) and exc.returned:
        return already
    return "channel"


async def wait(stop: asyncio.Event, seconds: float) -> None:
    """Until `stop` is set or `seconds` have passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def wait_any(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> None:
    """Until `stop` or `wake` is set, or `seconds` have passed."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
