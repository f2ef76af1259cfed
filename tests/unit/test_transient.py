"""Infrastructure failures are retried; bugs and bad data are not mistaken for them."""

from __future__ import annotations

import asyncpg
import pytest
from aiormq.exceptions import AMQPConnectionError

from domain.errors import UnknownPackageError
from infra.transient import is_transient


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.ConnectionDoesNotExistError("gone"),
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        asyncpg.AdminShutdownError("terminating connection"),
        asyncpg.SerializationError("could not serialize access"),
        asyncpg.DeadlockDetectedError("deadlock detected"),
        asyncpg.DiskFullError("could not extend file"),
        asyncpg.OutOfMemoryError("out of memory"),
        asyncpg.TooManyConnectionsError("too many clients"),
        asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        asyncpg.UndefinedTableError('relation "telecom.inbox" does not exist'),
        asyncpg.InterfaceError("connection is closed"),
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
        AMQPConnectionError("broker went away"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_infrastructure_failures_are_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.UniqueViolationError("duplicate key"),
        asyncpg.CheckViolationError("violates check constraint"),
        asyncpg.NumericValueOutOfRangeError("bigint out of range"),
        asyncpg.UndefinedColumnError("column does not exist"),
        UnknownPackageError(7),
        ValueError("a bug"),
        KeyError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_bugs_and_bad_data_are_not_transient(exc: BaseException) -> None:
    assert not is_transient(exc)
