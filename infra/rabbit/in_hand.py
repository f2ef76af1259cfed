"""The batches a consumer has in hand (being processed or settled), which a pause waits for."""

from __future__ import annotations

import asyncio
from types import TracebackType


class InHand:
    """A count of batches in hand, taken with `with in_hand:` around one batch. The count is
    the one fact; the event that `emptied` waits on is set from it, here and nowhere else."""

    def __init__(self) -> None:
        self._count = 0
        self._none = asyncio.Event()
        self._none.set()

    def __enter__(self) -> None:
        self._count += 1
        self._none.clear()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._count -= 1
        if self._count == 0:
            self._none.set()

    async def emptied(self) -> None:
        """Return once no batch is in hand (at once if none is)."""
        await self._none.wait()
