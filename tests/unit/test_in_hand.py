"""A consumer's batches in hand: a pause waits until none is, however many were taken and
however each one ended."""

from __future__ import annotations

import asyncio

import pytest

from infra.rabbit.deliveries import InHand


async def test_with_no_batch_in_hand_emptied_returns_at_once() -> None:
    await asyncio.wait_for(InHand().emptied(), timeout=10)


async def test_emptied_waits_until_the_last_of_several_batches_in_hand_is_done() -> None:
    in_hand = InHand()
    first, second = asyncio.Event(), asyncio.Event()

    async def batch(done: asyncio.Event) -> None:
        with in_hand:
            await done.wait()

    batches = [asyncio.create_task(batch(first)), asyncio.create_task(batch(second))]
    await asyncio.sleep(0)  # both taken
    waiting = asyncio.create_task(in_hand.emptied())
    first.set()
    await batches[0]
    await asyncio.sleep(0)
    assert not waiting.done()  # one is still in hand
    second.set()
    await asyncio.wait_for(waiting, timeout=10)
    await batches[1]


async def test_a_batch_that_raises_is_no_longer_in_hand() -> None:
    in_hand = InHand()
    with pytest.raises(RuntimeError), in_hand:
        raise RuntimeError("the processor broke")
    await asyncio.wait_for(in_hand.emptied(), timeout=10)
