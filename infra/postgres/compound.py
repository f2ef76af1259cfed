"""Several writes sent as one statement: each a data-modifying CTE of a single WITH.

A batch's writes go to different tables (the inbox, the items, the user rows, access, the
outbox, the counters); sent one statement each, every one costs a round trip to Postgres, which
on a batch of a few messages costs more than the writes themselves. Gathered as the CTEs of one
statement, they cost one.

What one statement changes about the writes, and why that is safe here:
- All its CTEs see the same snapshot, taken when the statement starts, and none sees what
  another writes. So two writes that touch the same table never share a statement: `Batch`
  sends what it holds before it takes a part that touches a table one of them touches (each
  part names the tables it reads or writes, including what its constraints read). The writes
  then run in the order they were added, as separate statements did.
- Every data-modifying CTE runs exactly once, to completion, whether or not the statement reads
  its rows (PostgreSQL's rule for WITH); its AFTER triggers fire when the statement ends, as
  they did at the end of its own statement.
- A failure of any part fails the statement, and the transaction it runs in, as it would have
  failed its own.

A part is written as it would run alone: its CTEs and its parameters numbered from $1. The
statement renumbers them; CTE names must be unique across the parts of one statement (each
module prefixes its own).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from infra.postgres.pool import Conn

T = TypeVar("T")

_PARAMETER = re.compile(r"\$(\d+)")
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class Part(Generic[T]):
    """One write: `ctes` ((name, body) pairs, bodies numbered from $1) with `args`; `tables`
    what it reads or writes; `result` an SQL expression over its CTEs (one value), turned
    into the part's value by `decode`."""

    ctes: tuple[tuple[str, str], ...]
    args: tuple[object, ...]
    tables: frozenset[str]
    result: str | None = None
    decode: Callable[[Any], T] | None = None


@dataclass
class Slot(Generic[T]):
    """A part's value, set once the statement it went out in has run."""

    value: T | None = None
    sent: bool = False

    def get(self) -> T:
        assert self.sent, "the part's statement has not run yet"
        return self.value  # type: ignore[return-value]  # None only for parts without a result


@dataclass
class Batch:
    """Parts gathered into statements on `conn` (inside the caller's transaction)."""

    conn: Conn
    statements: int = 0
    """Statements sent so far."""
    _parts: list[tuple[Part[Any], Slot[Any]]] = field(default_factory=list)
    _tables: set[str] = field(default_factory=set)

    async def add(self, part: Part[T] | None) -> Slot[T]:
        """Take `part` into the statement being gathered (None: nothing to write, a slot with
        no value); what it holds is sent first if `part` touches one of its tables."""
        slot: Slot[T] = Slot()
        if part is None:
            slot.sent = True
            return slot
        if part.tables & self._tables:
            await self.send()
        self._parts.append((part, slot))
        self._tables |= part.tables
        return slot

    async def send(self) -> None:
        """Send what is gathered, as one statement (nothing gathered: nothing sent)."""
        if not self._parts:
            return
        parts, self._parts, self._tables = self._parts, [], set()
        sql = statement(tuple((p.ctes, len(p.args), p.result) for p, _ in parts))
        row = await self.conn.fetchrow(sql, *(a for p, _ in parts for a in p.args))
        self.statements += 1
        column = 0
        for part, slot in parts:
            if part.result is not None:
                value = row[column] if row is not None else None
                slot.value = part.decode(value) if part.decode is not None else value
                column += 1
            slot.sent = True


async def run(conn: Conn, part: Part[T] | None) -> T | None:
    """One part as a statement of its own (None: nothing to write, nothing sent)."""
    batch = Batch(conn)
    slot = await batch.add(part)
    await batch.send()
    return slot.value


@functools.lru_cache(maxsize=256)
def statement(
    parts: tuple[tuple[tuple[tuple[str, str], ...], int, str | None], ...],
) -> str:
    """The WITH statement of parts given as (ctes, number of args, result): each part's
    parameters shifted past the ones before it; the results selected in order."""
    ctes: list[str] = []
    results: list[str] = []
    names: set[str] = set()
    offset = 0
    for part_ctes, count, result in parts:
        shift = _shifter(offset, count)
        for name, body in part_ctes:
            if not _NAME.fullmatch(name) or name in names:
                raise ValueError(f"CTE name {name!r} is not a unique lower-case name")
            names.add(name)
            ctes.append(f"{name} AS (\n{_PARAMETER.sub(shift, body)}\n)")
        if result is not None:
            results.append(_PARAMETER.sub(shift, result))
        offset += count
    return f"WITH {', '.join(ctes)}\nSELECT {', '.join(results) or 'NULL'}"


def _shifter(offset: int, count: int) -> Callable[[re.Match[str]], str]:
    def shift(match: re.Match[str]) -> str:
        number = int(match.group(1))
        if not 1 <= number <= count:
            raise ValueError(f"${number} is beyond the part's {count} parameters")
        return f"${number + offset}"

    return shift


def part_of(
    sql: str,
    args: Sequence[object],
    tables: Sequence[str],
    *,
    name: str,
    result: str | None = None,
    decode: Callable[[Any], T] | None = None,
) -> Part[T]:
    """A part of one CTE `name` whose body is `sql`."""
    return Part(((name, sql),), tuple(args), frozenset(tables), result, decode)
