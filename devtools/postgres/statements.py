"""Count the SQL statements a pool runs: the set-based hot path's proof, in tests and the bench.

asyncpg's query loggers see every statement, BEGIN and COMMIT included. An `executemany` is
counted once per argument row, because that is what the server runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from asyncpg.connection import LoggedQuery


@dataclass(eq=False)  # hashable by identity: asyncpg keeps its loggers in a set
class StatementLog:
    """A query logger for `create_pool(query_logger=…)`: the statements seen, in order, each
    whole with its whitespace folded (a batch's write statement names its parts' CTEs well past
    its beginning)."""

    statements: list[str] = field(default_factory=list)

    def __call__(self, record: LoggedQuery) -> None:
        text = " ".join(record.query.split())
        # `executemany` passes its list of argument rows; every other call a tuple.
        rows = len(record.args) if isinstance(record.args, list) else 1
        self.statements.extend([text] * rows)

    def clear(self) -> None:
        self.statements.clear()

    async def settled(self) -> int:
        """The count once the loggers of statements already run have been called (they are
        called soon after each statement, not during it)."""
        for _ in range(3):
            await asyncio.sleep(0)
        return len(self.statements)
