"""Workers (permits): every long-running pkgq process registers and heartbeats.

A worker's Postgres connections carry `application_name = 'pkgq:<worker id>'`
(`application_name()`). When its heartbeat goes stale, any other process may reap it: the row is
marked stopped, its singleton-job leases (telecom.leases) are deleted, and its backends are
terminated. Terminating them is what frees the rest of what it held: the relay's partition leases
are transaction-scoped advisory locks, and claimed work is row locks of an open transaction, and
both end with the backend (the transaction rolls back, so nothing half-done is kept).

A reaped worker that comes back (it was paused, not dead) finds its heartbeat refused and
registers again; its killed connections are simply reconnected by the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import structlog

from infra.postgres import leases
from infra.postgres.pool import Conn, from_row
from infra.postgres.pruning import Rule

RETENTION = Rule("workers", "telecom.workers", "id", "stopped_at < {cutoff}")


log = structlog.get_logger(__name__)

APPLICATION_PREFIX = "pkgq:"
TERMINATE_WAIT_MS = 2000
"""How long reaping waits for each terminated backend to exit (its locks are then free)."""

WorkerState = Literal["alive", "stale", "stopped"]


def application_name(worker_id: UUID) -> str:
    """The application_name of every Postgres connection of the worker."""
    return f"{APPLICATION_PREFIX}{worker_id}"


@dataclass(frozen=True, slots=True)
class Worker:
    id: UUID
    name: str
    role: str
    host: str
    pid: int
    routes: list[str]
    started_at: datetime
    heartbeat_at: datetime
    age_s: float
    """Seconds since the last heartbeat (by the database clock)."""
    stopped_at: datetime | None
    stop_reason: str | None

    def state(self, stale_after_s: float) -> WorkerState:
        if self.stopped_at is not None:
            return "stopped"
        return "stale" if self.age_s > stale_after_s else "alive"

    def as_dict(self, stale_after_s: float) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "name": self.name,
            "role": self.role,
            "host": self.host,
            "pid": self.pid,
            "routes": list(self.routes),
            "started_at": self.started_at.isoformat(),
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "heartbeat_age_s": round(self.age_s, 3),
            "state": self.state(stale_after_s),
            "stopped_at": self.stopped_at.isoformat() if self.stopped_at else None,
            "stop_reason": self.stop_reason,
        }


async def register(
    conn: Conn,
    worker_id: UUID,
    name: str,
    role: str,
    host: str,
    pid: int,
    routes: Sequence[str] = (),
) -> None:
    """Insert the worker, or bring a reaped or stopped row back to life (started_at is kept)."""
    await conn.execute(
        """
        INSERT INTO telecom.workers (id, name, role, host, pid, routes)
        VALUES ($1, $2, $3, $4, $5, $6::text[])
        ON CONFLICT (id) DO UPDATE SET
            name = excluded.name, role = excluded.role, host = excluded.host,
            pid = excluded.pid, routes = excluded.routes, heartbeat_at = now(),
            stopped_at = NULL, stop_reason = NULL
        """,
        worker_id,
        name,
        role,
        host,
        pid,
        list(routes),
    )


async def heartbeat(conn: Conn, worker_id: UUID) -> bool:
    """Renew the worker's heartbeat. False: its row was reaped or stopped (or is gone) in the
    meantime; the caller registers again."""
    renewed = await conn.fetchval(
        "UPDATE telecom.workers SET heartbeat_at = now() "
        "WHERE id = $1 AND stopped_at IS NULL RETURNING true",
        worker_id,
    )
    return bool(renewed)


async def set_routes(conn: Conn, worker_id: UUID, routes: Sequence[str]) -> None:
    await conn.execute(
        "UPDATE telecom.workers SET routes = $2::text[] WHERE id = $1", worker_id, list(routes)
    )


async def stop(conn: Conn, worker_id: UUID, reason: str) -> None:
    """Mark the worker stopped and give up its singleton-job leases."""
    async with conn.transaction():
        await conn.execute(
            "UPDATE telecom.workers SET stopped_at = now(), stop_reason = $2 "
            "WHERE id = $1 AND stopped_at IS NULL",
            worker_id,
            reason,
        )
        await leases.release_all(conn, [worker_id])


async def list_workers(conn: Conn, include_stopped: bool = False) -> list[Worker]:
    """Workers, most recently started first; stopped ones only with `include_stopped`."""
    listed, _ = await _workers(conn, include_stopped, None)
    return listed


async def first_workers(conn: Conn, limit: int) -> tuple[list[Worker], int]:
    """The first `limit` workers, stopped ones too, in list_workers' order, and how many there
    are in all (counted by the same statement)."""
    return await _workers(conn, True, limit)


async def _workers(
    conn: Conn, include_stopped: bool, limit: int | None
) -> tuple[list[Worker], int]:
    # Running workers alone are read through the partial index workers_alive, never past the
    # stopped ones retention keeps (the console's overview asks every 3 s): the condition is
    # written out, not left to a parameter a generic plan could not prune by.
    where = "" if include_stopped else "WHERE stopped_at IS NULL"
    rows = await conn.fetch(
        f"""
        SELECT id, name, role, host, pid, routes, started_at, heartbeat_at,
               extract(epoch FROM now() - heartbeat_at)::float8 AS age_s,
               stopped_at, stop_reason, count(*) OVER () AS total
        FROM telecom.workers
        {where}
        ORDER BY stopped_at IS NOT NULL, started_at DESC, name
        LIMIT $1
        """,
        limit,
    )
    listed = [from_row(Worker, r, routes=list(r["routes"]), age_s=float(r["age_s"])) for r in rows]
    return listed, int(rows[0]["total"]) if rows else 0


async def reap_stale(conn: Conn, stale_after_s: float, reaper_id: UUID | str) -> list[UUID]:
    """Reap every worker whose heartbeat is older than `stale_after_s`: mark it stopped, delete
    its leases and terminate its Postgres backends (never this connection's own). Returns the
    ids reaped by this call.

    Rows are taken `FOR UPDATE SKIP LOCKED`, so concurrent reapers split the stale set instead
    of reaping a worker twice, and a heartbeat that commits first saves its worker (the row is
    re-checked on the version that is locked).
    """
    async with conn.transaction():
        reaped: list[UUID] = [
            r["id"]
            for r in await conn.fetch(
                """
                WITH stale AS (
                    SELECT id FROM telecom.workers
                    WHERE stopped_at IS NULL
                      AND heartbeat_at < now() - make_interval(secs => $1)
                    FOR UPDATE SKIP LOCKED
                )
                UPDATE telecom.workers w
                SET stopped_at = now(),
                    stop_reason = format(
                        'stale: no heartbeat for %s s, reaped by %s',
                        round(extract(epoch FROM now() - w.heartbeat_at)), $2::text)
                FROM stale WHERE w.id = stale.id
                RETURNING w.id
                """,
                float(stale_after_s),
                str(reaper_id),
            )
        ]
        if not reaped:
            return []
        await leases.release_all(conn, reaped)
        await terminate_backends(conn, reaped)
    return reaped


async def terminate_backends(conn: Conn, worker_ids: Sequence[UUID]) -> int:
    """End every Postgres backend of the workers (except this connection's own), waiting up to
    TERMINATE_WAIT_MS for each to exit. Returns how many were signalled.

    pkgq's processes all connect as the runtime role, and a role may end its own backends, so
    the reaper needs no superuser and no pg_signal_backend. A backend it may not end (another
    role's, a superuser's) is left alone and logged: pg_terminate_backend would raise on it and
    roll the whole reap back, leaving every stale worker in place."""
    if not worker_ids:
        return 0
    row = await conn.fetchrow(
        """
        WITH targets AS (
            SELECT a.pid,
                   (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
                   OR (NOT coalesce((SELECT rolsuper FROM pg_roles r WHERE r.oid = a.usesysid),
                                    false)
                       AND (pg_has_role(a.usesysid, 'USAGE')
                            OR pg_has_role('pg_signal_backend', 'USAGE'))) AS may
            FROM pg_stat_activity a
            WHERE a.application_name = ANY($1::text[]) AND a.pid <> pg_backend_pid()
              AND a.usesysid IS NOT NULL
        )
        SELECT count(*) FILTER (WHERE may AND pg_terminate_backend(pid, $2)) AS ended,
               count(*) FILTER (WHERE NOT may) AS refused
        FROM targets
        """,
        [application_name(w) for w in worker_ids],
        TERMINATE_WAIT_MS,
    )
    assert row is not None
    if row["refused"]:
        log.warning(
            "worker_backends_not_terminated",
            count=row["refused"],
            workers=[str(w) for w in worker_ids],
            why="they belong to another role: run every pkgq process as the runtime role",
        )
    return int(row["ended"] or 0)
