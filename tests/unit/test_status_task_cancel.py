"""The status port's background tasks end when it stops, even when a cancel is swallowed once
(as asyncio.wait_for can on Python 3.11 when its inner awaitable finishes as the cancel lands)."""

from __future__ import annotations

import asyncio

from infra.observability import cancel_and_wait


async def test_a_task_that_swallows_one_cancel_is_still_ended() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if swallowed:
                    raise
                swallowed += 1  # the first cancel is lost, as a buggy library would lose it

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.02)
    await asyncio.wait_for(cancel_and_wait(task), timeout=10)
    assert task.cancelled()
    assert swallowed == 1
