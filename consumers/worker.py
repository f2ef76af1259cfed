"""This process as a registered worker (a permit, infra/postgres/workers.py): the
services it runs on, and the heartbeat that keeps its row in telecom.workers alive and reaps
stale peers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import asyncpg
import structlog
from aio_pika.abc import AbstractRobustConnection

from infra.dependencies import POSTGRES, dependencies
from infra.observability import WORKERS_REAPED
from infra.postgres import workers
from infra.postgres.pool import connect as connect_postgres
from infra.settings import Settings

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Services:
    pool: asyncpg.Pool
    amqp: AbstractRobustConnection
    worker_id: uuid.UUID = field(default_factory=uuid.uuid4)
    """This process's row in telecom.workers (registered by `services()`; a Services built by
    hand, as some tests do, has an id but no row)."""
    routes: list[str] = field(default_factory=list)
    """What this process works on, as shown by `pkgq workers` (see set_routes)."""
    routes_saved: bool = field(default=True, repr=False)
    """False while `routes` still has to be written to the worker's row."""

    async def set_routes(self, routes: Iterable[str]) -> None:
        """Record what this worker consumes. Never raises: if Postgres cannot be reached now,
        the heartbeat task saves the routes once it can."""
        self.routes = list(dict.fromkeys(routes))
        self.routes_saved = False
        try:
            async with self.pool.acquire(timeout=5) as conn:
                await workers.set_routes(conn, self.worker_id, self.routes)
            self.routes_saved = True
        except Exception as exc:  # noqa: BLE001  (saved later by the heartbeat task)
            log.warning("worker_routes_not_saved", error=repr(exc))


class WorkerHeartbeat:
    """Heartbeats the worker's row every `heartbeat_interval` on a connection of its own (so a
    busy pool cannot starve it), registers again if the row was reaped meanwhile, and reaps
    stale peers. It survives any Postgres outage: failures are logged and tried again.

    A process reaps only after its own heartbeats have succeeded for `worker_stale_after`
    seconds in a row: after an outage every worker's heartbeat is old, and the first one back
    must give the others time to heartbeat before it judges them.
    """

    def __init__(
        self, settings: Settings, svc: Services, name: str, role: str, host: str, pid: int
    ) -> None:
        self._settings = settings
        self._svc = svc
        self.name = name
        self._role = role
        self._host = host
        self._pid = pid
        self._conn: asyncpg.Connection | None = None
        self._healthy_since: float | None = None

    async def run(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(self._settings.heartbeat_interval)

    async def beat(self) -> list[uuid.UUID]:
        """One round: heartbeat (or register again), then reap. Returns the ids reaped."""
        svc, stale_after = self._svc, self._settings.worker_stale_after
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(max(30.0, 3 * self._settings.heartbeat_interval)):
                conn = await self._connection()
                if not await workers.heartbeat(conn, svc.worker_id):
                    await workers.register(
                        conn,
                        svc.worker_id,
                        self.name,
                        self._role,
                        self._host,
                        self._pid,
                        svc.routes,
                    )
                    svc.routes_saved = True
                    log.warning(
                        "worker_reregistered", worker=self.name, worker_id=str(svc.worker_id)
                    )
                elif not svc.routes_saved:
                    await workers.set_routes(conn, svc.worker_id, svc.routes)
                    svc.routes_saved = True
                dependencies().up(POSTGRES, "")
                now = loop.time()
                if self._healthy_since is None:
                    self._healthy_since = now
                if now - self._healthy_since < stale_after:
                    return []
                reaped = await workers.reap_stale(conn, stale_after, self.name)
        except asyncio.CancelledError:
            # Cancelled mid-round (the process stops): the connection is left in a state not
            # known. asyncpg (0.32) keeps a transaction whose BEGIN was interrupted as the
            # connection's open one, so every later transaction on it is a savepoint that never
            # commits: stop() would record nothing, without an error. It gets a fresh one.
            self._abandon_connection()
            raise
        except Exception as exc:  # noqa: BLE001  (never fatal: the next round tries again)
            self._healthy_since = None
            log.warning("worker_heartbeat_failed", worker=self.name, error=repr(exc))
            dependencies().down(
                POSTGRES,
                exc,
                f"heartbeat tried again in {self._settings.heartbeat_interval:g} s on a new "
                "connection",
            )
            await self._drop_connection()
            return []
        if reaped:
            WORKERS_REAPED.inc(len(reaped))
            log.warning("worker_reaped", reaped=[str(w) for w in reaped], by=self.name)
        return reaped

    async def stop(self, reason: str) -> None:
        """Mark the worker stopped (bounded: Postgres may be down) and close the connection."""
        try:
            async with asyncio.timeout(5):
                conn = await self._connection()
                await workers.stop(conn, self._svc.worker_id, reason)
        except Exception as exc:  # noqa: BLE001  (it will be reaped as stale instead)
            log.warning("worker_stop_not_recorded", worker=self.name, error=repr(exc))
        await self._drop_connection()

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect_postgres(
                self._settings.postgres_dsn,
                server_settings={
                    **self._settings.postgres_session(),
                    "application_name": workers.application_name(self._svc.worker_id),
                },
                dead_peer_timeout=self._settings.dead_peer_timeout,
            )
        return self._conn

    def _abandon_connection(self) -> None:
        """Close the connection at once, without a round trip (the server rolls back whatever
        it had open)."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.terminate()

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
