"""Workers for tests: a registered worker whose heartbeat is long gone (a hung process)."""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg

from infra.postgres import workers


async def stale_worker(
    pool: asyncpg.Pool,
    name: str = "hung",
    role: str = "test",
    host: str = "host",
    pid: int = 4242,
    *,
    worker_id: UUID | None = None,
) -> UUID:
    """Register a worker whose last heartbeat was an hour ago; its id."""
    worker_id = worker_id or uuid4()
    async with pool.acquire() as conn:
        await workers.register(conn, worker_id, name, role, host, pid)
        await conn.execute(
            "UPDATE telecom.workers SET heartbeat_at = now() - interval '1 hour' WHERE id = $1",
            worker_id,
        )
    return worker_id
