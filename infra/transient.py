"""Which failures are transient (infrastructure) and how they are retried in-process.

A transient failure says nothing about the message: the same message will succeed once the
database or the broker is back. Those are retried, never dead-lettered. Postgres errors are
classified by SQLSTATE class, so a whole family (connection, resources, operator intervention)
is covered rather than a hand-picked list of exception types.
"""

from __future__ import annotations

import asyncio

import asyncpg
from aiormq.exceptions import AMQPConnectionError, ChannelInvalidStateError
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

TRANSIENT_SQLSTATE_CLASSES = frozenset(
    {
        "08",  # connection exception
        "40",  # transaction rollback: serialization failure, deadlock
        "53",  # insufficient resources: disk full, out of memory, too many connections
        "57",  # operator intervention: shutdown, cannot connect now, query canceled
        "58",  # system error (I/O)
    }
)
TRANSIENT_SQLSTATES = frozenset(
    {
        "25006",  # read-only transaction: a failover in progress
        "55P03",  # lock not available
        "3F000",  # schema missing: consumers started before `pkgq migrate`
        "42P01",  # table missing: the same
    }
)


def is_transient(exc: BaseException) -> bool:
    """Lost connections, restarts, serialization failures, deadlocks, full disks, pool timeouts."""
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None) or ""
        return state[:2] in TRANSIENT_SQLSTATE_CLASSES or state in TRANSIENT_SQLSTATES
    return isinstance(
        exc,
        (
            asyncpg.InterfaceError,  # the connection was closed under us
            # Raised when a connection broken in mid-query (a server shutdown) is reset.
            asyncpg.exceptions._base.InternalClientError,  # not re-exported at the top level
            ConnectionError,
            OSError,
            TimeoutError,
            asyncio.TimeoutError,
            AMQPConnectionError,
            ChannelInvalidStateError,
        ),
    )


def transient_retrying(attempts: int = 5, max_wait: float = 2.0) -> AsyncRetrying:
    """Bounded, exponential, jittered, short: for a blip, not for an outage."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.05, max=max_wait),
        reraise=True,
    )
