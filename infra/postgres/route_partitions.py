"""The deployment's partition map (telecom.route_partitions, migration 0029): recorded once per
route by `pkgq migrate`, read by every process that routes or consumes at start-up, changed
only by `pkgq partitions set` (docs/how-to/partitions.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.postgres.pool import Conn
from infra.settings import Settings


async def recorded(conn: Conn) -> dict[str, int]:
    """Each recorded route's partition count ({} on a schema without the table yet)."""
    if not await conn.fetchval("SELECT to_regclass('telecom.route_partitions') IS NOT NULL"):
        return {}
    rows = await conn.fetch("SELECT route, partitions FROM telecom.route_partitions")
    return {row["route"]: row["partitions"] for row in rows}


async def recorded_rows(conn: Conn) -> dict[str, dict[str, Any]]:
    """Each recorded route's count, when and by whom it was recorded."""
    rows = await conn.fetch(
        "SELECT route, partitions, recorded_at, recorded_by FROM telecom.route_partitions"
    )
    return {row["route"]: dict(row) for row in rows}


async def record_missing(conn: Conn, partitions: Mapping[str, int], by: str) -> dict[str, int]:
    """Record `partitions` for the routes that have no row yet, never changing one that has.
    Returns what was recorded by this call."""
    rows = await conn.fetch(
        """
        INSERT INTO telecom.route_partitions (route, partitions, recorded_by)
        SELECT route, partitions, $3
        FROM unnest($1::text[], $2::int[]) AS wanted (route, partitions)
        ON CONFLICT (route) DO NOTHING
        RETURNING route, partitions
        """,
        list(partitions),
        list(partitions.values()),
        by,
    )
    return {row["route"]: row["partitions"] for row in rows}


async def change(conn: Conn, route: str, partitions: int, by: str) -> int | None:
    """Record `partitions` for `route`; returns the count recorded before (None: none was)."""
    async with conn.transaction():
        before: int | None = await conn.fetchval(
            "SELECT partitions FROM telecom.route_partitions WHERE route = $1 FOR UPDATE", route
        )
        await conn.execute(
            """
            INSERT INTO telecom.route_partitions (route, partitions, recorded_by)
            VALUES ($1, $2, $3)
            ON CONFLICT (route) DO UPDATE
            SET partitions = EXCLUDED.partitions, recorded_at = now(),
                recorded_by = EXCLUDED.recorded_by
            """,
            route,
            partitions,
            by,
        )
    return before


async def with_recorded_partitions(conn: Conn, settings: Settings) -> Settings:
    """`settings` with the recorded map (one SELECT); PartitionMapMismatchError if the map
    configured in them disagrees with it."""
    return settings.with_recorded_partitions(await recorded(conn))
