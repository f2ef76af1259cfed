"""Which failures are transient (infrastructure), and of which kind.

Two tiers (what each is retried by: infra/transient.py, docs/explanation/retries.md):
- an *outage* (the database or broker is unreachable, shutting down, out of disk, failing over,
  or not migrated yet) says nothing about the message: it is retried in place for as long as it
  lasts, never dead-lettered. A permission error (SQLSTATE 42501, a grant revoked from the
  runtime role or never given) is one too: the message is fine and the deployment is not, so
  burying it would lose work an operator restores with one GRANT. Unlike a restarting server
  it does not clear on its own, so it is logged as an error at once (`needs_operator`);
- a *blip* (serialization failure, deadlock, lock or statement timeout, a cached plan
  invalidated by a migration) is retried a few times, briefly; if it persists it is treated as
  the message's own failure, so one message can never block its route forever.
Postgres errors are classified by SQLSTATE, so whole families are covered. What a probe of the
database can see the end of (`probe_can_tell`) is what infra/recovery.py watches for.
"""

from __future__ import annotations

import asyncio
import ssl

import asyncpg
from aiormq.exceptions import AMQPConnectionError, AMQPError, ChannelInvalidStateError

from infra.dependencies import POSTGRES, RABBITMQ
from infra.tls import TlsVerifyError, causes

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
PROBED_SQLSTATES = frozenset(
    {
        "25006",  # read-only: a demoted primary, a standby behind the address
        "57P01",  # admin shutdown: terminated by a restart or a failover manager
        "57P02",  # crash shutdown
        "57P03",  # cannot connect now: starting up, shutting down, in recovery
    }
)
"""With SQLSTATE class 08: Postgres outages that end when the server can be reached again and
takes writes, which a probe can see (infra/recovery.py)."""
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


def probe_can_tell(exc: BaseException) -> bool:
    """An outage whose end a probe of the database can see: it cannot be reached (refused,
    reset, closed, no host that takes writes), it is starting or shutting down, or it is
    read-only (a failover). Not a missing schema or grant, a full disk or a certificate not
    accepted (the database answers a probe while the call still fails), nor RabbitMQ's."""
    if not is_outage(exc) or needs_operator(exc):
        return False
    if isinstance(exc, AMQPError | ChannelInvalidStateError):
        return False
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        return state[:2] == "08" or state in PROBED_SQLSTATES
    return True  # refused, reset, a closed connection, no host of the DSN that would serve


def is_demotion(exc: BaseException) -> bool:
    """The connection is on a server that no longer takes writes: a primary demoted to a
    standby (or an address that now leads to one), found by a statement refused as read-only
    (SQLSTATE 25006) or by Postgres saying it is in recovery. Every connection to that server
    is useless for pkgq: the pool must drop them (infra/postgres/pool.forget_if_demoted), so
    that the next ones go to whichever host takes writes now."""
    for cause in causes(exc):
        if isinstance(cause, asyncpg.PostgresError) and (
            _sqlstate(cause) == "25006" or "recovery" in str(cause).lower()
        ):
            return True
    return False


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


def dependency_of(exc: BaseException) -> str:
    """Which dependency an outage is of: RabbitMQ's errors, else PostgreSQL."""
    if isinstance(exc, AMQPError | ChannelInvalidStateError):
        return RABBITMQ
    return POSTGRES
