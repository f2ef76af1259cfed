"""Watching the real services from a test: wait until a condition holds, read a table."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 20.0, every: float = 0.1
) -> None:
    """Poll `check` until it returns True; fail the test after `within` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s: {check.__qualname__}")
        await asyncio.sleep(every)


async def fetch(pool: asyncpg.Pool, sql: str, *args: Any) -> list[dict[str, Any]]:
    """The rows of a query, as dicts (tests inspect tables directly)."""
    async with pool.acquire() as conn:
        return [dict(r) for r in await conn.fetch(sql, *args)]
