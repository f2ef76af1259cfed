"""`record`: an immutable dataclass whose immutability mypy checks, not the interpreter.

`@dataclass(frozen=True)` makes every instance set each field through `object.__setattr__`,
a call of its own per field: about four times the cost of a plain dataclass's `__init__`
(2.3 against 0.5 µs for twelve fields on the dev box). A consumer makes a dozen such records
for every delivery (its raw form, envelope, facts, decision, savepoint, result, ...): frozen,
they cost about a ninth of the delivery pipeline's CPU (0.89 of it without them, at the median
of 10 pairs: docs/explanation/performance.md).

A `record` is a plain slotted dataclass at run time, hashed and compared by its fields as a
frozen one is. To mypy (`make check`, `mypy --strict`) it is frozen: assigning a field is a type
error there, so no code that passes the checks changes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from typing_extensions import dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def record(cls: type[T]) -> type[T]:
    """A slotted dataclass, frozen to the type checker only (see the module docstring)."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
