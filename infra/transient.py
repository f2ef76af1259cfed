"""Which failures are transient (infrastructure) and how they are retried in-process."""

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

_TRANSIENT_PG = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.LockNotAvailableError,
    asyncpg.QueryCanceledError,
    # Raised when a connection broken in mid-query (a server shutdown) is reset or reused.
    asyncpg.exceptions._base.InternalClientError,  # not re-exported at the top level
)


def is_transient(exc: BaseException) -> bool:
    """Lost connections, restarts, serialization failures, deadlocks, pool timeouts."""
    return isinstance(
        exc,
        (
            *_TRANSIENT_PG,
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
