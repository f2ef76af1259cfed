"""Outages are waited out, blips retried briefly, and bugs or bad data never mistaken for either."""

from __future__ import annotations

import asyncpg
import pytest
from aiormq.exceptions import AMQPConnectionError

from domain.errors import UnknownPackageError
from infra.transient import is_outage, is_transient, needs_operator

OUTAGES = [
    asyncpg.ConnectionDoesNotExistError("gone"),
    asyncpg.CannotConnectNowError("the database system is shutting down"),
    asyncpg.AdminShutdownError("terminating connection"),
    asyncpg.DiskFullError("could not extend file"),
    asyncpg.OutOfMemoryError("out of memory"),
    asyncpg.TooManyConnectionsError("too many clients"),
    asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
    asyncpg.UndefinedTableError('relation "telecom.inbox" does not exist'),
    asyncpg.InsufficientPrivilegeError("permission denied for table package_queue"),
    asyncpg.InterfaceError("connection is closed"),
    ConnectionRefusedError(111, "Connect call failed"),
    AMQPConnectionError("broker went away"),
]
BLIPS = [
    asyncpg.SerializationError("could not serialize access"),
    asyncpg.DeadlockDetectedError("deadlock detected"),
    asyncpg.LockNotAvailableError("could not obtain lock"),
    asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
    asyncpg.InvalidCachedStatementError("cached statement plan is invalid"),
    TimeoutError(),
]
BUGS_AND_BAD_DATA = [
    asyncpg.InterfaceError("the server expects 1 argument for this query, 2 were passed"),
    asyncpg.UniqueViolationError("duplicate key"),
    asyncpg.CheckViolationError("violates check constraint"),
    asyncpg.NumericValueOutOfRangeError("bigint out of range"),
    asyncpg.UndefinedColumnError("column does not exist"),
    UnknownPackageError(7),
    ValueError("a bug"),
]


@pytest.mark.parametrize("exc", OUTAGES, ids=lambda e: type(e).__name__)
def test_outages_are_waited_out(exc: BaseException) -> None:
    assert is_outage(exc)
    assert is_transient(exc)


@pytest.mark.parametrize("exc", BLIPS, ids=lambda e: type(e).__name__)
def test_blips_are_retried_briefly_but_never_block_a_route(exc: BaseException) -> None:
    assert is_transient(exc)
    assert not is_outage(exc)


@pytest.mark.parametrize("exc", BUGS_AND_BAD_DATA, ids=lambda e: type(e).__name__)
def test_bugs_and_bad_data_are_neither(exc: BaseException) -> None:
    assert not is_transient(exc)
    assert not is_outage(exc)


def test_a_revoked_grant_is_an_outage_that_alerts_at_once_unlike_a_restarting_server() -> None:
    revoked = asyncpg.InsufficientPrivilegeError("permission denied for table package_queue")
    assert is_outage(revoked)
    assert needs_operator(revoked)
    assert not needs_operator(asyncpg.CannotConnectNowError("the database system is starting up"))
    assert not needs_operator(ValueError("a bug"))
