"""The times `UserQueue` writes tell the truth, whatever clock it is given.

Each command is given a clock, and the clock a consumer reads may be behind what the user's queue
already holds: a transaction that began before another one's purchase and waited for the user's
lock, or a clock that stepped back. Driven by random operations on clocks that move on and back,
the aggregate must still date every activation at or after the item's creation, at or after the
end of the item active before it (its PackageExpired or PackageCancelled), activations in the
order they happen, and a time package's expire_at as its activation plus its duration.

The consumers' reactions (the queue push after a purchase, `expire` after a PackageExpired)
wait in a list and run at a later operation's clock, as they do: late, on a clock of their own.
A command the domain refuses changes nothing (the batch's savepoint): it runs on a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import DomainError
from domain.events import (
    DomainEvent,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
    PackagesQueued,
)
from domain.model import Package
from domain.queue import UserQueue

USER = UUID("00000000-0000-4000-8000-000000000049")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Buy:
    limit: int | None
    duration: int | None  # seconds
    amount: int


@dataclass(frozen=True)
class React:
    """The oldest reaction waiting (a queue push, or `expire` of a PackageExpired) runs."""


@dataclass(frozen=True)
class Use:
    upload: int
    download: int


@dataclass(frozen=True)
class Cancel:
    pick: int


@dataclass(frozen=True)
class Adjust:
    pick: int
    delta: int


@dataclass(frozen=True)
class Timer:
    """An item's time-expiry timer fires (due or not: the relay may be early or late)."""

    pick: int


Op = Buy | React | Use | Cancel | Adjust | Timer


def _buy() -> st.SearchStrategy[Buy]:
    limits = st.one_of(st.none(), st.integers(0, 300))
    durations = st.one_of(st.none(), st.integers(0, 900))
    return st.builds(Buy, limits, durations, st.integers(1, 3)).filter(
        lambda b: b.limit is not None or b.duration is not None
    )


OPS: st.SearchStrategy[Op] = st.one_of(
    _buy(),
    st.just(React()),
    st.just(React()),
    st.builds(Use, st.integers(0, 150), st.integers(0, 150)),
    st.builds(Cancel, st.integers(0, 20)),
    st.builds(Adjust, st.integers(0, 20), st.integers(-200, 200)),
    st.builds(Timer, st.integers(0, 20)),
)
STEPS = st.lists(st.tuples(OPS, st.integers(-300, 600)), min_size=1, max_size=40)
"""Operations, each with how far the clock moves before it (seconds; back as well as on)."""


@dataclass
class Run:
    queue: UserQueue = field(default_factory=lambda: UserQueue(USER))
    clock: datetime = T0
    next_id: int = 1
    waiting: list[DomainEvent] = field(default_factory=list)
    """Events the consumers have yet to react to, oldest first."""
    events: list[DomainEvent] = field(default_factory=list)
    """Everything the aggregate emitted, in order."""
    created_at: dict[int, datetime] = field(default_factory=dict)
    durations: dict[int, timedelta | None] = field(default_factory=dict)

    def apply(self, step: Callable[[UserQueue], list[DomainEvent]]) -> None:
        """A command on a copy, kept if the domain takes it (as a batch's savepoint does)."""
        trial = self.queue.copy()
        try:
            made = step(trial)
        except DomainError:
            return
        self.queue = trial
        self.events += made
        self.waiting += [e for e in made if isinstance(e, (PackagesQueued, PackageExpired))]

    def pick(self, n: int) -> int | None:
        return None if self.next_id == 1 else n % (self.next_id - 1) + 1

    def run(self, op: Op) -> None:
        now = self.clock
        match op:
            case Buy(limit, duration, amount):
                seconds = None if duration is None else timedelta(seconds=duration)
                package = Package(1, "p", limit, seconds)
                ids = list(range(self.next_id, self.next_id + amount))
                self.next_id += amount
                for item_id in ids:
                    self.created_at[item_id] = now
                    self.durations[item_id] = seconds
                self.apply(lambda q: q.purchase(package, None, amount, ids, now))
            case React():
                if self.waiting:
                    self.react(self.waiting.pop(0), now)
            case Use(upload, download):
                self.apply(lambda q: q.record_usage(upload, download, now))
            case Cancel(pick) if (cancelled := self.pick(pick)) is not None:
                self.apply(lambda q: q.cancel(cancelled, now))
            case Adjust(pick, delta) if (adjusted := self.pick(pick)) is not None:
                self.apply(lambda q: q.adjust_quota(adjusted, delta, now))
            case Timer(pick) if (timed := self.pick(pick)) is not None:
                self.apply(lambda q: q.expire_due(timed, now))
            case _:
                pass

    def react(self, event: DomainEvent, now: datetime) -> None:
        if isinstance(event, PackagesQueued):
            self.apply(lambda q: q.advance(now))
        elif isinstance(event, PackageExpired):
            self.apply(lambda q: q.expire(event.item_id, event.reason, now))

    def drain(self) -> None:
        while self.waiting:
            self.react(self.waiting.pop(0), self.clock)


def _driven(steps: list[tuple[Op, int]]) -> Run:
    run = Run()
    for op, moved in steps:
        run.clock += timedelta(seconds=moved)
        run.run(op)
    run.drain()
    return run


@settings(max_examples=300, deadline=None, database=None)
@given(STEPS)
def test_activations_follow_creation_the_previous_end_and_each_other_on_any_clock(
    steps: list[tuple[Op, int]],
) -> None:
    run = _driven(steps)
    last_activation: datetime | None = None
    ended_at: dict[int, datetime] = {}
    previous: int | None = None
    for event in run.events:
        if isinstance(event, PackageExpired):
            ended_at[event.item_id] = event.expired_at
        elif isinstance(event, PackageCancelled) and event.was_active:
            ended_at[event.item_id] = event.cancelled_at
        elif isinstance(event, PackageActivated):
            at, item = event.activated_at, event.item_id
            assert at >= run.created_at[item], f"item {item} activated before it was created"
            if previous is not None:
                assert previous in ended_at, f"item {item} activated while {previous} was active"
                assert at >= ended_at[previous], f"item {item} activated before {previous} ended"
            assert last_activation is None or at >= last_activation, "activations out of order"
            last_activation, previous = at, item


@settings(max_examples=300, deadline=None, database=None)
@given(STEPS)
def test_a_time_packages_expire_at_counts_from_its_activation_on_any_clock(
    steps: list[tuple[Op, int]],
) -> None:
    run = _driven(steps)
    activations = [e for e in run.events if isinstance(e, PackageActivated)]
    for event in activations:
        duration = run.durations[event.item_id]
        expected = None if duration is None else event.activated_at + duration
        assert event.expire_at == expected
        item = run.queue.item(event.item_id)
        assert item.activated_at == event.activated_at  # what is stored is what was announced
        assert item.expire_at == expected


# -- examples: the two cases the clamp exists for --------------------------------------------


MONTHLY = Package(2, "monthly", 1_000, timedelta(days=30))


def test_a_queue_push_on_a_clock_read_before_the_purchase_activates_at_the_purchase() -> None:
    queue = UserQueue(USER)
    bought = T0 + timedelta(milliseconds=55)
    queue.purchase(MONTHLY, None, 1, [1], bought)

    (activated, *_) = queue.advance(T0)  # the push's transaction began before, then waited

    assert isinstance(activated, PackageActivated)
    assert activated.activated_at == bought
    assert queue.item(1).expire_at == bought + timedelta(days=30)


def test_the_next_item_is_not_activated_before_the_previous_one_ended_on_a_clock_behind() -> None:
    queue = UserQueue(USER)
    queue.purchase(MONTHLY, None, 1, [1], T0)
    queue.advance(T0)
    used_up = T0 + timedelta(minutes=5)
    (expired, *_) = queue.record_usage(0, 1_000, used_up)
    queue.purchase(MONTHLY, None, 1, [2], T0 + timedelta(minutes=1))  # a clock that stepped back

    (activated, *_) = queue.advance(T0 + timedelta(minutes=2))

    assert isinstance(expired, PackageExpired)
    assert expired.expired_at == used_up
    assert isinstance(activated, PackageActivated)
    assert activated.activated_at == used_up
    assert queue.item(2).expire_at == used_up + timedelta(days=30)
