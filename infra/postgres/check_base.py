"""What every invariant check is made of (infra/postgres/invariants.py runs them): a check is one
SQL statement returning the rows that break it, with graces for work still in flight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SAMPLE = 20
"""Violating rows kept per check (the count is of them all)."""
OUTBOX_GRACE_S = 600.0
"""A message published this recently may still be on the broker, waiting for its consumer."""
ATTEMPT_GRACE_S = 60.0
"""A failure counted this recently may belong to a batch still in flight."""
STATEMENT_TIMEOUT_S = 30.0
"""What one check may take: a check must never hang the relay's housekeeping."""


ACTIVATIONS_S = 86400.0
"""A day of activations: what the relay's periodic check of their times looks at."""
EVER = 100 * 365 * 86400.0
"""All of them: what `pkgq doctor` looks at."""
ATTEMPTS_BOUND = 240
"""The most attempts (or deferrals of a newer version) any hold's blocker is allowed by default:
the largest of the routes' `max_attempts` and PKGQ_NEWER_VERSION_DEFERRALS."""


@dataclass(frozen=True, slots=True)
class Graces:
    outbox_s: float = OUTBOX_GRACE_S
    attempts_s: float = ATTEMPT_GRACE_S
    attempts_bound: int = ATTEMPTS_BOUND
    """A hold whose blocker was tried more often than this has outrun every bound pkgq sets."""
    activations_s: float = ACTIVATIONS_S
    """`activation_times` looks at the activations of this many seconds back (an index range):
    the relay's periodic check sees every activation while it is recent; `pkgq doctor` looks
    at all of them (EVER)."""


GRACES = Graces()
"""The default graces."""


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    about: str
    """One line: what a violation means."""
    sql: str
    """$1 is the sample size; the rest are `params(graces)`. Returns the violating rows, each
    with `total`, the number of them all (count(*) OVER (), taken before the LIMIT)."""
    params: Callable[[Graces], tuple[float, ...]] = lambda _: ()


@dataclass(frozen=True, slots=True)
class Result:
    check: str
    violations: int
    sample: list[dict[str, Any]] = field(default_factory=list)
    """The violating rows (at most SAMPLE), JSON-ready: ids and times as strings."""
    checked_at: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.violations == 0
