"""Elastic replicas of a partitioned route (consumers/rebalance.py): who is a replica of which
route (telecom.route_replicas), and who owns which partition since when
(telecom.partition_owners, shown by `pkgq workers` and the console's workers page).

A replica is live while its worker's heartbeat (telecom.workers) is younger than the bound the
caller gives: the rebalance loop renews that heartbeat itself in the statement that reads the
live replicas (`live_replicas`), about once a second, so the bound can be a few seconds where
the worker heartbeat alone (PKGQ_HEARTBEAT_INTERVAL, 5 s) would need tens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class PartitionOwner:
    route: str
    partition: int
    worker_id: UUID
    worker: str
    """The worker's name (`pkgq-run@host:pid`)."""
    since: datetime
    """When it took the partition (subscribed to its queue)."""
    owner_alive: bool
    """Its worker is not stopped (it may still be stale: see the worker's heartbeat)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "partition": self.partition,
            "worker_id": str(self.worker_id),
            "worker": self.worker,
            "since": self.since.isoformat(),
            "owner_alive": self.owner_alive,
        }


async def join(conn: Conn, worker_id: UUID, routes: Sequence[str]) -> None:
    """Make the worker a replica of each route (nothing if it is one already)."""
    await conn.execute(
        """
        INSERT INTO telecom.route_replicas (route, worker_id)
        SELECT route, $1 FROM unnest($2::text[]) AS route
        ON CONFLICT (route, worker_id) DO NOTHING
        """,
        worker_id,
        list(routes),
    )


@dataclass(frozen=True, slots=True)
class Live:
    beaten: bool
    """The worker's heartbeat was renewed: its row is running (False: it was reaped or
    stopped, and owns nothing until it has registered again)."""
    replicas: dict[str, list[UUID]]
    """Each route's live replicas, by id ([] for a route without any)."""


async def live_replicas(
    conn: Conn, worker_id: UUID, routes: Sequence[str], live_within_s: float
) -> Live:
    """One statement: renew the worker's heartbeat, then each route's live replicas: members
    whose worker is running and heartbeat within `live_within_s` (this worker's own heartbeat
    counts as renewed)."""
    row = await conn.fetchrow(
        """
        WITH beat AS (
            UPDATE telecom.workers SET heartbeat_at = now()
            WHERE id = $1 AND stopped_at IS NULL
            RETURNING id
        )
        SELECT EXISTS (SELECT 1 FROM beat) AS beaten,
               coalesce(array_agg(m.route ORDER BY m.route, m.worker_id), '{}') AS routes,
               coalesce(array_agg(m.worker_id ORDER BY m.route, m.worker_id), '{}') AS workers
        FROM telecom.route_replicas m
        JOIN telecom.workers w ON w.id = m.worker_id
        WHERE m.route = ANY($2::text[]) AND w.stopped_at IS NULL
          AND (w.heartbeat_at > now() - make_interval(secs => $3)
               OR w.id IN (SELECT id FROM beat))
        """,
        worker_id,
        list(routes),
        float(live_within_s),
    )
    assert row is not None  # an aggregate without GROUP BY: always one row
    replicas: dict[str, list[UUID]] = {route: [] for route in routes}
    for route, worker in zip(row["routes"], row["workers"], strict=True):
        replicas[route].append(worker)
    return Live(bool(row["beaten"]), replicas)


async def claim(conn: Conn, worker_id: UUID, route: str, partitions: Sequence[int]) -> None:
    """Record the worker as the owner of the partitions from now (a partition it owns already
    keeps its `since`)."""
    await conn.execute(
        """
        INSERT INTO telecom.partition_owners (route, partition, worker_id)
        SELECT $2, partition, $1 FROM unnest($3::int[]) AS partition
        ON CONFLICT (route, partition) DO UPDATE
            SET worker_id = excluded.worker_id, since = now()
            WHERE partition_owners.worker_id <> excluded.worker_id
        """,
        worker_id,
        route,
        list(partitions),
    )


async def release(conn: Conn, worker_id: UUID, route: str, partitions: Sequence[int]) -> None:
    """Forget the worker's ownership of the partitions (not one a new owner has claimed)."""
    await conn.execute(
        "DELETE FROM telecom.partition_owners "
        "WHERE route = $2 AND partition = ANY($3::int[]) AND worker_id = $1",
        worker_id,
        route,
        list(partitions),
    )


async def leave(conn: Conn, worker_id: UUID) -> None:
    """The worker is a replica of no route and owns no partition any more (a graceful stop:
    the other replicas take its partitions at their next read)."""
    await conn.execute(
        """
        WITH gone AS (DELETE FROM telecom.route_replicas WHERE worker_id = $1)
        DELETE FROM telecom.partition_owners WHERE worker_id = $1
        """,
        worker_id,
    )


async def owners(conn: Conn) -> list[PartitionOwner]:
    """Every recorded owner, by route and partition."""
    rows = await conn.fetch(
        """
        SELECT o.route, o.partition, o.worker_id, w.name AS worker, o.since,
               w.stopped_at IS NULL AS owner_alive
        FROM telecom.partition_owners o
        JOIN telecom.workers w ON w.id = o.worker_id
        ORDER BY o.route, o.partition
        """
    )
    return [PartitionOwner(**dict(row)) for row in rows]
