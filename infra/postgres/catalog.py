"""The package catalog."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import asyncpg

from domain.model import Package
from infra.postgres.pool import Conn


def _package(row: asyncpg.Record) -> Package:
    return Package(row["id"], row["name"], row["traffic_limit"], row["duration"])


async def get_package(conn: Conn, package_id: int) -> Package | None:
    row = await conn.fetchrow("SELECT * FROM telecom.packages WHERE id = $1", package_id)
    return None if row is None else _package(row)


async def get_packages(conn: Conn, package_ids: Iterable[int]) -> dict[int, Package]:
    """Catalog entries by id, in one statement (ids not in the catalog are left out)."""
    rows = await conn.fetch(
        "SELECT * FROM telecom.packages WHERE id = ANY($1::bigint[])", sorted(set(package_ids))
    )
    return {r["id"]: _package(r) for r in rows}


async def add_package(
    conn: Conn, name: str, traffic_limit: int, duration: timedelta | None
) -> Package:
    row = await conn.fetchrow(
        "INSERT INTO telecom.packages (name, traffic_limit, duration) VALUES ($1, $2, $3) "
        "RETURNING *",
        name,
        traffic_limit,
        duration,
    )
    assert row is not None
    return _package(row)


async def list_packages(conn: Conn) -> list[Package]:
    return [_package(r) for r in await conn.fetch("SELECT * FROM telecom.packages ORDER BY id")]
