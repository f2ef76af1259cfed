"""Leases of singleton jobs (the expiry sweep, retention pruning) in telecom.leases.

A lease is held by one worker until `expires_at`. Its holder renews it by acquiring it again. It
is free for another worker once it has expired, or once its holder is stopped (stopped workers
give their leases up, and reaping deletes a stale worker's leases), or, when the caller passes
`stale_after_s`, once its holder's heartbeat is older than that. A holder that never registered
a worker row keeps its lease until it expires.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from infra.postgres.pool import Conn


async def acquire(
    conn: Conn,
    name: str,
    worker_id: UUID,
    ttl_s: float,
    *,
    stale_after_s: float | None = None,
) -> bool:
    """Take, renew or take over the lease `name` for `ttl_s` seconds. False: another live
    worker holds it."""
    taken = await conn.fetchval(
        """
        INSERT INTO telecom.leases AS l (name, worker_id, expires_at)
        VALUES ($1, $2, now() + make_interval(secs => $3))
        ON CONFLICT (name) DO UPDATE
            SET worker_id = excluded.worker_id, expires_at = excluded.expires_at
            WHERE l.worker_id = excluded.worker_id
               OR l.expires_at <= now()
               OR EXISTS (
                   SELECT 1 FROM telecom.workers w
                   WHERE w.id = l.worker_id
                     AND (w.stopped_at IS NOT NULL
                          OR w.heartbeat_at < now() - make_interval(secs => $4::float8)))
        RETURNING true
        """,
        name,
        worker_id,
        float(ttl_s),
        None if stale_after_s is None else float(stale_after_s),
    )
    return bool(taken)


async def release(conn: Conn, name: str, worker_id: UUID) -> bool:
    """Give the lease up if `worker_id` holds it. Returns whether it did."""
    status = await conn.execute(
        "DELETE FROM telecom.leases WHERE name = $1 AND worker_id = $2", name, worker_id
    )
    return status.endswith(" 1")


async def release_all(conn: Conn, worker_ids: Sequence[UUID]) -> None:
    """Give up every lease these workers hold (they stopped, or were reaped)."""
    await conn.execute(
        "DELETE FROM telecom.leases WHERE worker_id = ANY($1::uuid[])", list(worker_ids)
    )


async def holder(conn: Conn, name: str) -> UUID | None:
    """The worker holding an unexpired lease `name`, if any."""
    found: UUID | None = await conn.fetchval(
        "SELECT worker_id FROM telecom.leases WHERE name = $1 AND expires_at > now()", name
    )
    return found
