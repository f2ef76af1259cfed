"""The asyncpg pool, with JSON codecs and transient-error retries.

Failover: a DSN may name several hosts, with `target_session_attrs=read-write` so that every
new connection goes to the one that takes writes. Connections already made to a primary that
has been demoted (or to whatever an address now leads to) are dropped by `forget_if_demoted`,
called where a failure is handled: the pool's next connections are new ones. While an outage
lasts, `watch_for_recovery` is what the process's probe tries (infra/transient.Recovery).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import asyncpg
import structlog
from asyncpg.connection import LoggedQuery
from asyncpg.pool import PoolConnectionProxy

from events import bounded_json
from infra.sockets import DEFAULT_DEAD_PEER_TIMEOUT_S, tune_transport
from infra.tls import (
    TlsConfigError,
    TlsVerifyError,
    explain,
    postgres_ssl,
    postgres_target,
)
from infra.transient import PROBE_TIMEOUT_S, is_demotion, recovery

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

log = structlog.get_logger(__name__)

QueryLogger = Callable[[LoggedQuery], None]
D = TypeVar("D", bound="DataclassInstance")


def columns(rows: Sequence[Any], *names: str) -> list[list[Any]]:
    """The arrays one `unnest($1, $2, …)` statement takes for a whole batch: for each name (an
    attribute, or a dotted path such as `terms.duration`), its value in every row."""
    getters = [operator.attrgetter(name) for name in names]
    return [[get(row) for row in rows] for get in getters]


def in_uuid_order(ids: Iterable[UUID]) -> list[UUID]:
    """The distinct ids in Postgres's uuid order (their 128-bit value), the order rows are
    locked in; sorted by that value rather than by UUID.__lt__, which is slower."""
    return sorted(set(ids), key=_UUID_VALUE)


_UUID_VALUE = operator.attrgetter("int")


def from_row(cls: type[D], row: asyncpg.Record | Mapping[str, Any], **converted: Any) -> D:
    """The dataclass `cls` from the row's columns of the same names; `converted` gives the
    fields whose column needs converting first (or has another name)."""
    fields = (name for name in _init_fields(cls) if name not in converted)
    return cls(**{name: row[name] for name in fields}, **converted)


@functools.cache
def _init_fields(cls: type[DataclassInstance]) -> tuple[str, ...]:
    """The names `cls` is made from (looked up once per class: from_row runs per row)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb as Postgres stores it may nest thousands deep, which json.loads cannot read (a
    # RecursionError fails the whole query): such a value is read as its text.
    await conn.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=bounded_json.parsed_or_text, schema="pg_catalog"
    )


def connect_timeout(dead_peer_timeout: float) -> float:
    """Seconds one attempt to connect may take: a peer that has not answered a SYN (or the
    start-up exchange) by then is as dead as one that stopped answering later, and the next
    attempt, a short pause later, is what gets through once the network is back. At most 3 s:
    SYNs are sent again 1 s and 3 s after the first, so an attempt begun during a fault would
    not see the network return before its next SYN."""
    return max(1.0, min(dead_peer_timeout, 3.0))


def find_dead_peers(conn: asyncpg.Connection, dead_peer_timeout: float) -> None:
    """Make the connection's socket end within `dead_peer_timeout` of its peer going silent
    (infra/sockets.py). asyncpg offers no hook for the socket, so its transport is reached
    through the connection's private attribute (tests/integration/test_dead_peers.py checks
    that it is still there)."""
    tune_transport(getattr(conn, "_transport", None), dead_peer_timeout)


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    application_name: str = "pkgq",
    query_logger: QueryLogger | None = None,
    command_timeout: float = 60,
    session: Mapping[str, str] | None = None,
    reset_session: bool = True,
    dead_peer_timeout: float = DEFAULT_DEAD_PEER_TIMEOUT_S,
) -> asyncpg.Pool:
    """`application_name` shows in pg_stat_activity; a registered worker's pools carry
    `pkgq:<worker id>`, so its connections can be found and ended (infra/postgres/workers.py).
    `query_logger`: called after every statement of every connection (statement counts).
    `command_timeout`: seconds a statement may take (a lock wait included) before it fails.
    `session`: server settings (Settings.postgres_session(): the idle-in-transaction timeout and
    TCP keepalives that bound how long a frozen process holds its locks).
    `reset_session=False`: a released connection keeps its session as it is (an open
    transaction is still rolled back), saving the reset's round trip on every release; only
    for pools whose users never SET, LISTEN or take session advisory locks (`pkgq web`, and
    the processes' pools of consumers/runtime.services: tests/unit/test_session_state.py).
    `dead_peer_timeout`: PKGQ_DEAD_PEER_TIMEOUT (`find_dead_peers`; it bounds each connect too)."""

    async def init(conn: asyncpg.Connection) -> None:
        find_dead_peers(conn, dead_peer_timeout)
        await _init_connection(conn)
        if query_logger is not None:
            conn.add_query_logger(query_logger)

    async with tls_explained(dsn):
        pool: Any = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=init,
            command_timeout=command_timeout,
            server_settings={**(session or {}), "application_name": application_name},
            reset=None if reset_session else _keep_session,
            ssl=postgres_ssl(dsn),
            timeout=connect_timeout(dead_peer_timeout),
        )
    return pool  # type: ignore[no-any-return]  # create_pool is typed as Pool | None


@asynccontextmanager
async def tls_explained(dsn: str, setting: str = "PKGQ_POSTGRES_DSN") -> AsyncIterator[None]:
    """Turn a TLS failure while connecting with `dsn` into one line that says what to check:
    TlsVerifyError (a certificate not accepted: waited out like an outage) or TlsConfigError
    (a CA, certificate or key file that cannot be read). Other errors pass unchanged."""
    try:
        yield
    except Exception as exc:
        problem = explain(exc, postgres_target(dsn, setting))
        if problem is None:
            raise
        if isinstance(exc, ssl.SSLError):
            raise TlsVerifyError(problem) from exc
        raise TlsConfigError(problem) from exc


async def connect(
    dsn: str,
    *,
    setting: str = "PKGQ_POSTGRES_DSN",
    dead_peer_timeout: float = DEFAULT_DEAD_PEER_TIMEOUT_S,
    **kwargs: Any,
) -> asyncpg.Connection:
    """asyncpg.connect, with TLS failures told as in `tls_explained`, and a dead peer found
    within `dead_peer_timeout` (`find_dead_peers`, and each connect bounded by it)."""
    options = {"ssl": postgres_ssl(dsn), "timeout": connect_timeout(dead_peer_timeout), **kwargs}
    async with tls_explained(dsn, setting):
        conn: asyncpg.Connection = await asyncpg.connect(dsn, **options)
    find_dead_peers(conn, dead_peer_timeout)
    return conn


async def forget_if_demoted(pool: asyncpg.Pool, exc: BaseException) -> bool:
    """If `exc` says the server no longer takes writes (SQLSTATE 25006, or in recovery: see
    infra/transient.is_demotion), drop every connection of the pool: idle ones now, those in
    use when they are released, so none of them is handed out again and the next acquire
    connects afresh (to the host that takes writes, with `target_session_attrs=read-write`).
    Returns whether it did. Call it wherever a pooled connection's failure is handled."""
    if not is_demotion(exc):
        return False
    await pool.expire_connections()
    log.info("postgres_connections_dropped", reason="server_not_writable", error=repr(exc))
    return True


def watch_for_recovery(
    dsn: str,
    application_name: str = "pkgq",
    dead_peer_timeout: float = DEFAULT_DEAD_PEER_TIMEOUT_S,
) -> None:
    """Make `dsn` what this process probes while an outage lasts (infra/transient.Recovery):
    a probe connects as the pools do (to any host of a multi-host DSN that
    `target_session_attrs` accepts) and succeeds once the server takes writes. Call it once,
    before the process first connects; needs a running event loop."""

    async def probe() -> None:
        conn = await asyncpg.connect(
            dsn,
            timeout=min(PROBE_TIMEOUT_S, connect_timeout(dead_peer_timeout)),
            server_settings={"application_name": application_name},
            ssl=postgres_ssl(dsn),
        )
        find_dead_peers(conn, dead_peer_timeout)
        try:
            if not await writable(conn):
                raise ServerNotWritableError(f"{postgres_target(dsn).address}: read-only")
        finally:
            try:
                await conn.close(timeout=1)
            except Exception:  # noqa: BLE001  (the probe's answer stands; the socket goes)
                conn.terminate()

    recovery().watch(probe)


class ServerNotWritableError(ConnectionError):
    """The database answers but takes no writes (a standby, or read-only)."""


async def writable(conn: Conn) -> bool:
    """Whether the server takes writes on this connection: not a standby, not read-only."""
    return bool(
        await conn.fetchval(
            "SELECT NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off'"
        )
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """asyncpg has rolled back any transaction already; nothing else to reset."""


Conn = asyncpg.Connection | PoolConnectionProxy
"""A connection, whether held directly or borrowed from the pool."""


async def clock(conn: Conn) -> datetime:
    """The database's `now()`: the clock pkgq schedules and expires by (one per transaction)."""
    now: datetime = await conn.fetchval("SELECT now()")
    return now


async def answers(conn: Conn) -> bool:
    """Whether Postgres runs a statement on this connection (readiness probes)."""
    return bool(await conn.fetchval("SELECT true"))


@asynccontextmanager
async def database(
    dsn: str, session: Mapping[str, str] | None = None, setting: str = "PKGQ_POSTGRES_DSN"
) -> AsyncIterator[asyncpg.Connection]:
    """One short-lived connection, for CLI commands that run a query or two (`setting`: where
    the DSN comes from, for the message of a TLS failure)."""
    conn = await connect(dsn, setting=setting, server_settings=dict(session or {}))
    try:
        yield conn
    finally:
        await conn.close()
