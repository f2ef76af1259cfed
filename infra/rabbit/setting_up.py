"""Setting something up on the robust AMQP connection (a channel, a declaration, a publisher,
a subscription) when the connection may be lost under it.

aio-pika's robust connection reconnects by itself and restores what it had made, but a call in
flight when the connection goes (a queue's declaration waiting for its answer, a channel being
opened, a basic.consume) fails with the connection's error. Whatever pkgq sets up goes through
`through_outages`: a failure that is the connection's loss (an outage, or any failure while
the connection is down) is waited out, on short capped pauses and until the connection is back,
then the step is tried again from the start, after `undo` has discarded what was half made (a
channel left open would be restored beside the next one). aiormq may end a call in flight with
CancelledError rather than the connection's error (its reader task is cancelled as the
connection closes): that is a loss too, unless the task itself is being cancelled. Anything
else (a queue declared with other arguments, access refused) is raised at once: the broker
answered, and said no.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from aio_pika.abc import AbstractRobustConnection

from infra.transient import OutagePauses, StoppingError, is_transient

log = structlog.get_logger(__name__)
T = TypeVar("T")

FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 2.0
"""The pauses between attempts while the connection is up and a step still fails for want of
it (aio-pika reconnects every 0.5 s meanwhile; a step waits for that, not for these)."""


def lost_with_connection(connection: AbstractRobustConnection, exc: BaseException) -> bool:
    """Whether `exc` is the connection's loss rather than the broker's answer: an outage (or a
    blip, such as a timeout), or any failure while the connection is down (aio-pika raises a
    plain RuntimeError for a channel asked of a connection that is reconnecting)."""
    return is_transient(exc) or not connection.connected.is_set()


async def through_outages(
    connection: AbstractRobustConnection,
    step: Callable[[], Awaitable[T]],
    stopping: asyncio.Event,
    *,
    what: str,
    undo: Callable[[], Awaitable[object]] | None = None,
) -> T:
    """`step()`, tried again after each failure that is the connection's loss, once the
    connection is back, until it works (see the module docstring). `what`: what is being set
    up, for the warning each interruption logs. Raises StoppingError once `stopping` is set."""
    pauses = OutagePauses(FIRST_PAUSE_S, LONGEST_PAUSE_S, probed=False)
    while True:
        if stopping.is_set():
            raise StoppingError
        try:
            return await step()
        except asyncio.CancelledError as exc:
            if _cancelled_from_outside():
                raise
            # aiormq ends a call in flight with CancelledError when the connection's reader
            # task is cancelled as the connection closes: not this task's cancellation.
            failure: BaseException = exc
        except Exception as exc:
            if not lost_with_connection(connection, exc):
                raise
            failure = exc
        if undo is not None:
            with contextlib.suppress(Exception):
                await undo()
        up = connection.connected.is_set()
        log.warning(
            "amqp_setup_interrupted",
            what=what,
            error=f"{type(failure).__name__}: {failure}",
            retry="after a pause" if up else "once reconnected",
        )
        if up:  # the connection has not noticed yet, or the broker was slow: do not spin
            await pauses.wait(failure, stopping)
        await _connected_or_stopping(connection, stopping)


def _cancelled_from_outside() -> bool:
    """Whether the running task is being cancelled (rather than a call inside it ended with
    CancelledError because a task it waited for was)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def _connected_or_stopping(
    connection: AbstractRobustConnection, stopping: asyncio.Event
) -> None:
    waits = [
        asyncio.ensure_future(stopping.wait()),
        asyncio.ensure_future(connection.connected.wait()),
    ]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
