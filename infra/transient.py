"""Which failures are transient (infrastructure) and how they are retried in-process.

Two tiers:
- an *outage* (the database or broker is unreachable, shutting down, out of disk, failing over,
  or not migrated yet) says nothing about the message: it is retried in place for as long as it
  lasts, never dead-lettered. A permission error (SQLSTATE 42501, a grant revoked from the
  runtime role or never given) is one too: the message is fine and the deployment is not, so
  burying it would lose work an operator restores with one GRANT. Unlike a restarting server
  it does not clear on its own, so it is logged as an error at once (`needs_operator`);
- a *blip* (serialization failure, deadlock, lock or statement timeout, a cached plan
  invalidated by a migration) is retried a few times, briefly; if it persists it is treated as
  the message's own failure, so one message can never block its route forever.
Postgres errors are classified by SQLSTATE, so whole families are covered.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import structlog
from aiormq.exceptions import AMQPConnectionError, ChannelInvalidStateError
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from infra.tls import TlsVerifyError

OUTAGE_SQLSTATE_CLASSES = frozenset(
    {
        "08",  # connection exception
        "53",  # insufficient resources: disk full, out of memory, too many connections
        "57",  # operator intervention: shutdown, cannot connect now (57014 excepted below)
        "58",  # system error (I/O)
    }
)
OUTAGE_SQLSTATES = frozenset(
    {
        "25006",  # read-only transaction: a failover in progress
        "3F000",  # schema missing: consumers started before `pkgq migrate`
        "42P01",  # table missing: the same
        "42501",  # insufficient privilege: a grant missing from the runtime role
    }
)
OPERATOR_SQLSTATES = frozenset({"42501"})
"""Outages that only an operator ends: alert at once. (A missing schema is not here: consumers
starting just before `pkgq migrate` is a normal race, so it turns loud only if it lasts.)"""
BLIP_SQLSTATES = frozenset({"55P03", "57014"})  # lock not available; statement timeout


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", None) or "")


def is_outage(exc: BaseException) -> bool:
    """The service itself is unavailable: wait for it, however long it takes."""
    if isinstance(exc, TimeoutError):
        return False  # a blip, though Python makes it an OSError
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        if state in BLIP_SQLSTATES:
            return False
        return state[:2] in OUTAGE_SQLSTATE_CLASSES or state in OUTAGE_SQLSTATES
    if isinstance(exc, asyncpg.InterfaceError):
        # Also raised for plain bugs (wrong argument count, concurrent use of a connection);
        # only a closed connection is an outage.
        return "closed" in str(exc)
    return isinstance(
        exc,
        (
            # Raised when a connection broken in mid-query (a server shutdown) is reset.
            asyncpg.exceptions._base.InternalClientError,  # not re-exported at the top level
            ConnectionError,
            OSError,
            AMQPConnectionError,
            ChannelInvalidStateError,
        ),
    )


def needs_operator(exc: BaseException) -> bool:
    """An outage that will not clear by itself: log it as an error from the first time. A
    missing grant, or a server certificate this process does not accept (a wrong CA, a host
    name the certificate is not issued for)."""
    if isinstance(exc, TlsVerifyError | ssl.SSLCertVerificationError):
        return True
    cause = exc.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError):  # aiormq wraps it
        return True
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc) in OPERATOR_SQLSTATES


def is_transient(exc: BaseException) -> bool:
    """Worth retrying at once: an outage, or a blip that usually clears within a second."""
    if is_outage(exc) or isinstance(exc, asyncpg.InvalidCachedStatementError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        return state[:2] == "40" or state in BLIP_SQLSTATES  # serialization, deadlock
    return isinstance(
        exc, (asyncpg.InvalidCachedStatementError, TimeoutError, asyncio.TimeoutError)
    )


PERMANENT_SQLSTATES = frozenset({"23502", "23514"})  # not-null and check violations
"""With SQLSTATE class 22 (data exception: out of range, invalid text, untranslatable
character, ...): what Postgres refuses for the data itself, every time it is asked."""


def is_permanent(exc: BaseException) -> bool:
    """A data error that can never succeed: the same statement with the same data fails the
    same way. asyncpg refuses some such values before sending them (a number out of a column's
    range, a lone surrogate in text) with SQLSTATE 22000: permanent too."""
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        return state[:2] == "22" or state in PERMANENT_SQLSTATES
    return isinstance(exc, UnicodeEncodeError)


def transient_retrying(attempts: int = 5, max_wait: float = 2.0) -> AsyncRetrying:
    """Bounded, exponential, jittered, short: for a blip, not for an outage."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.05, max=max_wait),
        reraise=True,
    )


log = structlog.get_logger(__name__)

BLOCKED_ALERT_AFTER_S = 300.0
T = TypeVar("T")


class StoppingError(Exception):
    """Shutdown began while waiting for the infrastructure to come back."""


async def until_done(call: Callable[[], Awaitable[T]], stopping: asyncio.Event) -> T:
    """Retry blips briefly with tenacity; wait out outages with pauses until it works. Raises
    StoppingError if `stopping` is set while it waits; anything else it raises as it comes."""
    pause = 1.0
    blocked_since = time.monotonic()
    while True:
        try:
            async for attempt in transient_retrying():
                with attempt:
                    return await call()
        except Exception as exc:
            if not is_outage(exc):
                raise
            if stopping.is_set():
                raise StoppingError from exc
            blocked_for = time.monotonic() - blocked_since
            # Loud after a while: an outage that lasts may be a deployment mistake (a schema
            # never migrated), and every later message on the route waits behind it. A missing
            # grant is one from the start: it never clears by itself.
            loud = blocked_for > BLOCKED_ALERT_AFTER_S or needs_operator(exc)
            level = log.error if loud else log.warning
            level(
                "infrastructure_unavailable",
                error=repr(exc),
                retry_in_s=pause,
                blocked_for_s=round(blocked_for),
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=pause)
            pause = min(pause * 2, 30.0)
