"""A worker's stop is recorded even when its heartbeat was cancelled in the middle of a round.

asyncpg (0.32) takes a transaction as the connection's open one before its BEGIN answers; if the
task is cancelled there, the connection keeps it, and every later `transaction()` on it is a
savepoint inside a transaction that never commits. The heartbeat's own connection is the one
such connection pkgq keeps (pools roll back and forget it on release), and the process cancels
its heartbeat just before it records its stop on that connection: without care, the stop was
"done" without an error and never committed (a permits test failed that way under load)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import worker
from consumers.worker import Services, WorkerHeartbeat
from infra.postgres import pool as postgres_pool
from infra.settings import Settings


class BeginInterrupted(asyncpg.Connection):
    """A connection whose first BEGIN (of any instance) runs on the server and then waits, so
    that the test can cancel the task there: as when a cancel lands between the BEGIN's send
    and its answer."""

    reached: asyncio.Event | None = None

    async def execute(self, query: str, *args: Any, **kwargs: Any) -> str:
        status: str = await super().execute(query, *args, **kwargs)
        reached = BeginInterrupted.reached
        if query.startswith("BEGIN") and reached is not None and not reached.is_set():
            reached.set()
            await asyncio.sleep(3600)
        return status


async def test_a_heartbeat_cancelled_inside_its_transactions_begin_still_lets_the_stop_commit(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reached = asyncio.Event()
    monkeypatch.setattr(BeginInterrupted, "reached", reached)
    opened: list[asyncpg.Connection] = []
    connect = postgres_pool.connect

    async def connect_interrupted(dsn: str, **kwargs: Any) -> asyncpg.Connection:
        conn = await connect(dsn, connection_class=BeginInterrupted, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(worker, "connect_postgres", connect_interrupted)
    # Reaping (the round's transaction) starts once the heartbeat has been healthy 0.2 s.
    quick = settings.model_copy(update={"worker_stale_after": 0.2, "heartbeat_interval": 0.05})
    svc = Services(pool, amqp)
    beat = WorkerHeartbeat(quick, svc, "pkgq-test@h:1", "test", "h", 1)
    beating = asyncio.create_task(beat.run())
    try:
        await asyncio.wait_for(reached.wait(), timeout=20)
    finally:
        beating.cancel()
        with pytest.raises(asyncio.CancelledError):
            await beating

    await beat.stop("exited")

    async with pool.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT stopped_at, stop_reason FROM telecom.workers WHERE id = $1", svc.worker_id
        )
    assert row is not None
    assert row["stop_reason"] == "exited"
    assert row["stopped_at"] is not None
    # The interrupted connection was closed, and the stop went through one of its own.
    assert len(opened) == 2
    assert opened[0].is_closed()
