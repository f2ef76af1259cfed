"""The package catalog. Items keep the terms they were bought with (infra/postgres/queue_repo),
so an edit here changes later purchases only, and a retired entry stays for the items of it."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import asyncpg

from domain.model import Package
from infra.postgres.pool import Conn


def _package(row: asyncpg.Record) -> Package:
    return Package(row["id"], row["name"], row["traffic_limit"], row["duration"], row["retired_at"])


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
    conn: Conn, name: str, traffic_limit: int | None, duration: timedelta | None
) -> Package:
    """`traffic_limit=None`: unlimited traffic; `duration=None`: no time expiry (not both)."""
    Package(0, name, traffic_limit, duration)  # the domain's rules, before the database's
    row = await conn.fetchrow(
        "INSERT INTO telecom.packages (name, traffic_limit, duration) VALUES ($1, $2, $3) "
        "RETURNING *",
        name,
        traffic_limit,
        duration,
    )
    assert row is not None
    return _package(row)


async def edit_package(
    conn: Conn, package_id: int, name: str, traffic_limit: int | None, duration: timedelta | None
) -> Package | None:
    """New terms for later purchases (None: no such package). Bought items keep theirs."""
    Package(package_id, name, traffic_limit, duration)
    row = await conn.fetchrow(
        "UPDATE telecom.packages SET name = $2, traffic_limit = $3, duration = $4 "
        "WHERE id = $1 RETURNING *",
        package_id,
        name,
        traffic_limit,
        duration,
    )
    return None if row is None else _package(row)


async def retire_package(conn: Conn, package_id: int) -> Package | None:
    """Refuse new purchases of it from now on (None: no such package). Retiring twice keeps
    the first date."""
    row = await conn.fetchrow(
        "UPDATE telecom.packages SET retired_at = coalesce(retired_at, now()) "
        "WHERE id = $1 RETURNING *",
        package_id,
    )
    return None if row is None else _package(row)


async def list_packages(conn: Conn) -> list[Package]:
    return [_package(r) for r in await conn.fetch("SELECT * FROM telecom.packages ORDER BY id")]
