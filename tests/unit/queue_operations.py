"""The operations the property tests of `UserQueue` drive it with, and the hypothesis
strategies that draw them (tests/unit/test_domain_queue_properties.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from hypothesis import strategies as st

from domain.model import ExpiryReason

USER = UUID("00000000-0000-4000-8000-000000000002")
T0 = datetime(2024, 1, 1, tzinfo=UTC)
MAX_REACTIONS = 10_000
"""Reactions one step may cause before the driver calls it a loop."""


# -- operations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Purchase:
    limit: int | None  # None = unlimited traffic (a time-only plan)
    duration: int | None  # seconds; None = never expires by time
    amount: int
    order: int | None = None  # the by_order (from a small set, so that some are resent)


@dataclass(frozen=True)
class EditCatalog:
    """The catalog entry last bought gets new terms (skipped before any purchase)."""

    limit: int | None
    duration: int | None


@dataclass(frozen=True)
class Rebuy:
    """Buy the catalog entry last bought again, on its terms as they are now."""

    amount: int
    order: int | None = None


@dataclass(frozen=True)
class Usage:
    upload: int
    download: int
    recorded_before: int | None = None
    """The traffic happened this many seconds before it is reported (RecordUsage v2's
    recorded_at); None: not said (version 1)."""


@dataclass(frozen=True)
class RacingUsage:
    """Two usage reports back to back: the second arrives before the consumers have reacted to
    the first one's events (e.g. its PackageExpired is still on its way to `expire()`)."""

    first: Usage
    second: Usage


@dataclass(frozen=True)
class Cancel:
    pick: int  # which item (by position among all item ids, modulo their count)


@dataclass(frozen=True)
class Adjust:
    pick: int
    delta: int


@dataclass(frozen=True)
class AdjustActive:
    delta: int  # adjust whichever item is active (skipped when none is)


@dataclass(frozen=True)
class Tick:
    """The clock moves on and every due timer fires, as does every timer that was on its way
    when the domain unscheduled it (each one twice, back to back, if `twice`: the relay delivers
    at least once)."""

    seconds: int
    twice: bool = False


@dataclass(frozen=True)
class Lag:
    """The clock moves on but the relay is late: due timers stay pending until the next Tick."""

    seconds: int


@dataclass(frozen=True)
class LagPastExpiry:
    """The relay is late: the clock moves to `extra` seconds past the active item's expire_at
    (skipped if it has none; the clock never goes back) and its timer stays pending."""

    extra: int


@dataclass(frozen=True)
class UsageRacingTimers:
    """The clock moves on and the due timers fire, but a usage report arrives before the
    consumers have reacted to what the timers emitted (their PackageExpired is on its way)."""

    seconds: int
    usage: Usage


@dataclass(frozen=True)
class Replay:
    pick: int  # deliver an already delivered PackageExpired once more


@dataclass(frozen=True)
class StaleTrigger:
    pick: int  # deliver a PackageExpired(time) for an item whose expiry the domain unscheduled


@dataclass(frozen=True)
class EarlyTrigger:
    reason: ExpiryReason  # a PackageExpired for the active item while it is not due


@dataclass(frozen=True)
class StaleTimer:
    pick: int  # fire the timer of an item whose expiry the domain unscheduled


@dataclass(frozen=True)
class DuplicateTimer:
    pick: int  # fire an already fired timer once more


@dataclass(frozen=True)
class EarlyTimer:
    """Fire the active item's timer before its time is up (a relay clock running ahead)."""


Op = (
    Purchase
    | EditCatalog
    | Rebuy
    | Usage
    | RacingUsage
    | Cancel
    | Adjust
    | AdjustActive
    | Tick
    | Lag
    | LagPastExpiry
    | UsageRacingTimers
    | Replay
    | StaleTrigger
    | EarlyTrigger
    | StaleTimer
    | DuplicateTimer
    | EarlyTimer
)
TRIGGER_OPS = (Replay, StaleTrigger, EarlyTrigger, StaleTimer, DuplicateTimer, EarlyTimer)
"""Operations that only redeliver, or deliver too early, what the domain already handled."""

picks = st.integers(min_value=0, max_value=50)
seconds = st.integers(min_value=0, max_value=120)
deltas = st.integers(min_value=-300, max_value=300)
# large limits and timed items keep an item active long enough for the relay to fall behind
# its expire_at; small limits run out within a report or two; None is unlimited traffic
limits = st.one_of(
    st.integers(min_value=300, max_value=3_000),
    st.integers(min_value=0, max_value=300),
    st.just(0),
    st.none(),
)
durations = st.one_of(st.integers(min_value=1, max_value=100), st.none(), st.just(0))
orders = st.one_of(st.none(), st.integers(min_value=1, max_value=4))
purchases = st.builds(
    Purchase,
    limit=limits,
    duration=durations,
    amount=st.integers(min_value=1, max_value=3),
    order=orders,
).filter(lambda p: p.limit is not None or p.duration is not None)
usages = st.builds(
    Usage,
    upload=st.integers(min_value=0, max_value=150),
    download=st.integers(min_value=0, max_value=150),
    recorded_before=st.none() | st.integers(min_value=0, max_value=180),
)
BRANCHES: list[tuple[int, st.SearchStrategy[Op]]] = [
    # (weight, strategy): the operations that keep a timed item active and let the relay fall
    # behind it weigh more, so that many runs see a time-up while its timer is still pending
    (4, purchases),
    (
        1,
        st.builds(EditCatalog, limit=limits, duration=durations).filter(
            lambda e: e.limit is not None or e.duration is not None
        ),
    ),
    (1, st.builds(Rebuy, amount=st.integers(min_value=1, max_value=2), order=orders)),
    (3, usages),
    (2, st.builds(Tick, seconds=seconds, twice=st.booleans())),
    # exactly at expire_at (the boundary: time is up) as often as some seconds past it
    (
        3,
        st.builds(
            LagPastExpiry,
            extra=st.one_of(st.just(0), st.integers(min_value=1, max_value=30)),
        ),
    ),
    (1, st.builds(Lag, seconds=seconds)),
    (1, st.builds(RacingUsage, first=usages, second=usages)),
    (1, st.builds(UsageRacingTimers, seconds=seconds, usage=usages)),
    (1, st.builds(Cancel, pick=picks)),
    (1, st.builds(Adjust, pick=picks, delta=deltas)),
    (2, st.builds(AdjustActive, delta=deltas)),
    (1, st.builds(Replay, pick=picks)),
    (1, st.builds(StaleTrigger, pick=picks)),
    (1, st.builds(EarlyTrigger, reason=st.sampled_from(ExpiryReason))),
    (1, st.builds(StaleTimer, pick=picks)),
    (1, st.builds(DuplicateTimer, pick=picks)),
    (1, st.just(EarlyTimer())),
]
# Weighted by repetition in `sampled_from`: `one_of` would drop a repeated branch, since
# hypothesis caches strategies and a repeat is the very same object.
operations = st.lists(
    st.sampled_from([branch for weight, branch in BRANCHES for _ in range(weight)]).flatmap(
        lambda branch: branch
    ),
    min_size=10,
    max_size=50,
)
