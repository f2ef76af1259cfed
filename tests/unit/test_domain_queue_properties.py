"""Property tests: `UserQueue` driven by random operations and checked against a reference model.

The reference model below is deliberately simple and independent of `domain`: one user's queue
is a list of items with limit/adjust/traffic/status, and every transition advances the queue at
once. The real aggregate is driven the way the consumers drive it: after every command, each
emitted `PackagesQueued` runs the queue push (`advance`), each `PackageExpired` is fed back into
`expire()` (the package_expiring consumer), and `ExpiryScheduled`/`ExpiryUnscheduled` maintain a
fake relay whose due time-expiry timers fire `expire_due()` (the expiry_due consumer) as time
advances; whatever a timer emits flows through the consumers in turn.

Purchases come in every kind of plan (traffic and time, traffic only, time only (unlimited
traffic), zero traffic, zero duration), some name an order that was bought before (a resend:
nothing is queued), and the catalog entry last bought can be edited and bought again: items
keep the terms they were bought with, as the reference items keep their own copies.

The relay is not on time: it can lag (the clock moves on while due timers stay pending, so usage,
adjustments and purchases arrive after the active item's expire_at), it delivers a timer that
was already due when the domain unscheduled it (it was on its way), and it may deliver a timer
twice, early, or long after the item left `active`. Once nothing is left to react to, the real
state must equal the reference state.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import ItemNotAdjustableError, ItemNotCancellableError, UnlimitedTrafficError
from domain.events import (
    AllPackagesExpired,
    DomainEvent,
    DuplicateOrder,
    ExpiryScheduled,
    ExpiryUnscheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
    PackagesQueued,
)
from domain.model import ExpiryReason, Package
from domain.queue import UserQueue

USER = UUID("00000000-0000-4000-8000-000000000002")
T0 = datetime(2024, 1, 1, tzinfo=UTC)
MAX_REACTIONS = 10_000
"""Reactions one step may cause before the driver calls it a loop."""

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, database=None)


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


# -- observable state (shared shape of the real aggregate and the reference) -----------------


@dataclass(frozen=True)
class ItemState:
    status: str
    upload: int
    download: int
    adjust: int
    quota: int | None
    remaining: int | None
    activated_at: datetime | None
    expire_at: datetime | None

    def time_is_up(self, now: datetime) -> bool:
        return self.expire_at is not None and self.expire_at <= now


@dataclass(frozen=True)
class State:
    items: dict[int, ItemState]
    unbilled: tuple[int, int]
    access: bool

    def statuses(self) -> dict[int, str]:
        return {item_id: item.status for item_id, item in self.items.items()}

    def active_ids(self) -> list[int]:
        return [item_id for item_id, item in self.items.items() if item.status == "active"]

    def traffic(self) -> dict[int, tuple[int, int]]:
        return {item_id: (item.upload, item.download) for item_id, item in self.items.items()}


def real_state(queue: UserQueue) -> State:
    return State(
        items={
            item.id: ItemState(
                status=item.status.value,
                upload=item.upload,
                download=item.download,
                adjust=item.adjust_quota,
                quota=item.quota,
                remaining=item.remaining,
                activated_at=item.activated_at,
                expire_at=item.expire_at,
            )
            for item in queue.items
        },
        unbilled=(queue.unbilled_upload, queue.unbilled_download),
        access=queue.has_access,
    )


# -- the reference model ---------------------------------------------------------------------


@dataclass
class RefItem:
    id: int
    limit: int | None
    duration: timedelta | None
    created_at: datetime
    status: str = "in_queue"
    adjust: int = 0
    upload: int = 0
    download: int = 0
    activated_at: datetime | None = None
    expire_at: datetime | None = None


@dataclass
class RefQueue:
    """One user's queue in the simplest terms; every change of the active item advances at once.

    An item leaves `active` by usage, by time (as soon as anything happens at or after its
    expire_at: its timer, a usage report, a quota adjustment) or by a cancel; only the first two
    count as expirations, each recorded once.
    """

    items: list[RefItem] = field(default_factory=list)
    unbilled_upload: int = 0
    unbilled_download: int = 0
    access: bool = False
    activations: list[tuple[int, int | None, int | None]] = field(default_factory=list)
    """(item id, quota, remaining) at each activation, in order."""
    access_losses: int = 0
    orders: set[int] = field(default_factory=set)
    cancellations: list[tuple[int, bool]] = field(default_factory=list)
    """(item id, was active) of every item a cancel took out of the queue, in order."""
    expirations: list[tuple[int, str, datetime]] = field(default_factory=list)
    """(item id, reason, expired at) of every item that ran out, in order. Expired at is the
    item's expire_at for time, the moment it happened for usage."""

    def find(self, item_id: int) -> RefItem:
        return next(item for item in self.items if item.id == item_id)

    def active(self) -> RefItem | None:
        return next((item for item in self.items if item.status == "active"), None)

    @staticmethod
    def quota(item: RefItem) -> int | None:
        return None if item.limit is None else item.limit + item.adjust

    @staticmethod
    def remaining(item: RefItem) -> int | None:
        quota = RefQueue.quota(item)
        return None if quota is None else max(quota - item.upload - item.download, 0)

    @staticmethod
    def out_of_traffic(item: RefItem) -> bool:
        quota = RefQueue.quota(item)
        return quota is not None and item.upload + item.download >= quota

    def current(self, now: datetime) -> int | None:
        """GetCurrentPackage: the active item unless its time is up."""
        item = self.active()
        return None if item is None or self.out_of_time(item, now) else item.id

    @staticmethod
    def out_of_time(item: RefItem, now: datetime) -> bool:
        return item.expire_at is not None and item.expire_at <= now

    def run_out(self, item: RefItem, reason: str, now: datetime) -> None:
        item.status = "consumed"
        at = item.expire_at if reason == "time" and item.expire_at is not None else now
        self.expirations.append((item.id, reason, at))

    def advance(self, now: datetime) -> None:
        if self.active() is not None:
            return
        waiting = [item for item in self.items if item.status == "in_queue"]
        for item in sorted(waiting, key=lambda i: (i.created_at, i.id)):
            item.status = "active"
            item.activated_at = now
            item.expire_at = None if item.duration is None else now + item.duration
            item.upload += self.unbilled_upload
            item.download += self.unbilled_download
            self.unbilled_upload = self.unbilled_download = 0
            self.access = True
            self.activations.append((item.id, self.quota(item), self.remaining(item)))
            if self.out_of_traffic(item):
                self.run_out(item, "usage", now)
            elif self.out_of_time(item, now):
                self.run_out(item, "time", now)
            else:
                return
        if self.access:
            self.access = False
            self.access_losses += 1

    def expire_by_time(self, now: datetime) -> None:
        """Whatever happens at or after the active item's expire_at first ends it by time."""
        item = self.active()
        while item is not None and self.out_of_time(item, now):
            self.run_out(item, "time", now)
            self.advance(now)
            item = self.active()

    def purchase(
        self,
        ids: list[int],
        limit: int | None,
        duration: timedelta | None,
        order: int | None,
        now: datetime,
    ) -> str:
        if order is not None:
            if order in self.orders:
                return "duplicate"
            self.orders.add(order)
        for item_id in ids:
            self.items.append(RefItem(item_id, limit, duration, now))
        self.advance(now)
        return "ok"

    def usage(self, upload: int, download: int, now: datetime) -> int | None:
        """Bill the traffic; return the id of the item it went to (None: kept as unbilled)."""
        self.expire_by_time(now)
        item = self.active()
        if item is None:
            self.unbilled_upload += upload
            self.unbilled_download += download
            return None
        item.upload += upload
        item.download += download
        if self.out_of_traffic(item):
            self.run_out(item, "usage", now)
            self.advance(now)
        return item.id

    def cancel(self, item_id: int, now: datetime) -> str:
        item = self.find(item_id)
        if item.status == "consumed":
            return "not_cancellable"
        if item.status == "cancelled":
            return "ok"
        if item.status == "active" and self.out_of_time(item, now):
            return "not_cancellable"  # its time is up: as good as consumed, timer or not
        was_active = item.status == "active"
        item.status = "cancelled"
        self.cancellations.append((item.id, was_active))
        if was_active:
            self.advance(now)
        return "ok"

    def adjust(self, item_id: int, delta: int, now: datetime) -> str:
        item = self.find(item_id)
        if item.status in ("consumed", "cancelled"):
            return "not_adjustable"
        if item.limit is None:
            return "unlimited"
        item.adjust += delta
        if item.status != "active":
            return "ok"
        if self.out_of_time(item, now):
            self.run_out(item, "time", now)
            self.advance(now)
        elif self.out_of_traffic(item):
            self.run_out(item, "usage", now)
            self.advance(now)
        return "ok"

    def tick(self, now: datetime) -> None:
        self.expire_by_time(now)

    def state(self) -> State:
        return State(
            items={
                item.id: ItemState(
                    status=item.status,
                    upload=item.upload,
                    download=item.download,
                    adjust=item.adjust,
                    quota=self.quota(item),
                    remaining=self.remaining(item),
                    activated_at=item.activated_at,
                    expire_at=item.expire_at,
                )
                for item in self.items
            },
            unbilled=(self.unbilled_upload, self.unbilled_download),
            access=self.access,
        )


# -- the driver ------------------------------------------------------------------------------

TimerKind = Literal["due", "in_flight", "stale", "duplicate", "early"]
"""Why a timer fired: it is due (and still scheduled); it was already due when the domain
unscheduled it, so it was on its way; it was unscheduled and the relay fires it anyway; it
fired before; it fired before the item's time was up."""


@dataclass(frozen=True)
class TimerFiring:
    """One `expire_due` call, seen before any consumer reacted to what it returned."""

    item_id: int
    package_id: int
    kind: TimerKind
    now: datetime
    returned: list[DomainEvent]
    before: State
    after: State


@dataclass(frozen=True)
class Billing:
    """One `record_usage` call, seen before any consumer reacted to what it returned."""

    traffic: tuple[int, int]
    now: datetime
    returned: list[DomainEvent]
    before: State
    after: State
    ref_target: int | None
    """The item the reference billed the traffic to (None: kept as unbilled)."""


@dataclass
class Step:
    op: Op
    now: datetime
    """The clock after the operation (the time every call in it ran at)."""
    outcome: str
    ref_outcome: str
    events: list[DomainEvent]
    """Everything the domain emitted in this step, the consumers' reactions included."""
    before: State
    after: State
    ref_after: State
    ref_activations: list[tuple[int, int | None, int | None]]
    ref_access_losses: int
    ref_cancellations: list[tuple[int, bool]]
    current: int | None
    """GetCurrentPackage after the step (`current_at` the step's clock)."""
    ref_current: int | None
    pending: dict[int, datetime]
    recorded: tuple[int, int]


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)
    max_active: int = 0
    """Most items seen active at once, checked after every single domain call."""
    schedule_errors: list[str] = field(default_factory=list)
    created_at: dict[int, datetime] = field(default_factory=dict)
    ref_expirations: list[tuple[int, str, datetime]] = field(default_factory=list)
    timers: list[TimerFiring] = field(default_factory=list)
    billings: list[Billing] = field(default_factory=list)

    def events(self) -> list[DomainEvent]:
        return [event for step in self.steps for event in step.events]


class Driver:
    def __init__(self) -> None:
        self.queue = UserQueue(user_id=USER)
        self.ref = RefQueue()
        self.now = T0
        self.next_id = 1
        self.pending: dict[int, datetime] = {}
        """Scheduled timers not fired yet: item id -> due at."""
        self.in_flight: dict[int, datetime] = {}
        """Timers unscheduled when already due: the relay had them on their way; they fire at
        the next Tick all the same."""
        self.voided: list[int] = []
        self.fired: list[int] = []
        self.delivered: list[tuple[int, ExpiryReason]] = []
        """PackageExpired events delivered to `expire()`."""
        self.recorded_upload = 0
        self.recorded_download = 0
        self.trace = Trace()
        self.last_bought: Package | None = None
        """The catalog entry last bought, as the catalog has it now (EditCatalog changes it)."""

    def observe(self) -> None:
        active = len(real_state(self.queue).active_ids())
        self.trace.max_active = max(self.trace.max_active, active)

    def settle(self, first: list[DomainEvent]) -> list[DomainEvent]:
        """React to events as the consumers would, until nothing is left to react to."""
        emitted: list[DomainEvent] = []
        todo: deque[DomainEvent] = deque(first)
        while todo:
            if len(emitted) > MAX_REACTIONS:
                raise AssertionError(f"no quiescence after {MAX_REACTIONS} events")
            event = todo.popleft()
            emitted.append(event)
            reaction: list[DomainEvent] = []
            if isinstance(event, PackagesQueued):
                reaction = self.queue.advance(self.now)
            elif isinstance(event, PackageExpired):
                self.delivered.append((event.item_id, event.reason))
                reaction = self.queue.expire(event.item_id, event.reason, self.now)
            elif isinstance(event, ExpiryScheduled):
                if event.item_id in self.pending:
                    self.trace.schedule_errors.append(f"scheduled twice: {event.item_id}")
                self.pending[event.item_id] = event.due_at
            elif isinstance(event, ExpiryUnscheduled):
                due_at = self.pending.pop(event.item_id, None)
                if due_at is None:
                    self.trace.schedule_errors.append(f"never scheduled: {event.item_id}")
                else:
                    self.voided.append(event.item_id)
                    if due_at <= self.now:
                        self.in_flight[event.item_id] = due_at
            self.observe()
            todo.extend(reaction)
        return emitted

    def fire_timer(self, item_id: int, kind: TimerKind) -> list[DomainEvent]:
        """The relay delivers one timer: `expire_due`, recorded before anyone reacts to it."""
        before = real_state(self.queue)
        returned = self.queue.expire_due(item_id, self.now)
        self.observe()
        self.trace.timers.append(
            TimerFiring(
                item_id=item_id,
                package_id=self.queue.item(item_id).package_id,
                kind=kind,
                now=self.now,
                returned=list(returned),
                before=before,
                after=real_state(self.queue),
            )
        )
        if kind == "due":
            self.fired.append(item_id)
        return returned

    def fire_due_timers(self, *, twice: bool, settle_each: bool) -> list[DomainEvent]:
        """Fire every due timer, oldest first. With `settle_each` the consumers react to each
        one before the next fires; without, the caller gets the unsettled events."""
        emitted: list[DomainEvent] = []
        while True:
            due: list[tuple[datetime, int, TimerKind]] = [
                (at, item_id, "due") for item_id, at in self.pending.items() if at <= self.now
            ]
            due += [(at, item_id, "in_flight") for item_id, at in self.in_flight.items()]
            if not due:
                return emitted
            _, item_id, kind = min(due)
            del (self.pending if kind == "due" else self.in_flight)[item_id]
            returned = self.fire_timer(item_id, kind)
            if twice:
                returned += self.fire_timer(item_id, "duplicate")
            emitted += self.settle(returned) if settle_each else returned

    def record_usage(self, usage: Usage) -> list[DomainEvent]:
        """The usage consumer, recorded before anyone reacts to what it returned."""
        self.recorded_upload += usage.upload
        self.recorded_download += usage.download
        ref_target = self.ref.usage(usage.upload, usage.download, self.now)
        before = real_state(self.queue)
        returned = self.queue.record_usage(usage.upload, usage.download, self.now)
        self.observe()
        self.trace.billings.append(
            Billing(
                traffic=(usage.upload, usage.download),
                now=self.now,
                returned=list(returned),
                before=before,
                after=real_state(self.queue),
                ref_target=ref_target,
            )
        )
        return returned

    def item_ids(self) -> list[int]:
        return sorted(item.id for item in self.queue.items)

    def apply(self, op: Op) -> tuple[str, str, list[DomainEvent]]:
        """Run one operation on both models: (real outcome, reference outcome, events)."""
        queue, ref, now = self.queue, self.ref, self.now
        if isinstance(op, EditCatalog):
            if self.last_bought is None:
                return "skipped", "skipped", []
            duration = None if op.duration is None else timedelta(seconds=op.duration)
            self.last_bought = Package(self.last_bought.id, "edited", op.limit, duration)
            return "ok", "ok", []
        if isinstance(op, Purchase | Rebuy):
            if isinstance(op, Purchase):
                duration = None if op.duration is None else timedelta(seconds=op.duration)
                self.last_bought = Package(self.next_id, f"p{self.next_id}", op.limit, duration)
            elif self.last_bought is None:
                return "skipped", "skipped", []
            package = self.last_bought
            ids = list(range(self.next_id, self.next_id + op.amount))
            self.next_id += op.amount
            for item_id in ids:
                self.trace.created_at[item_id] = now
            ref_outcome = ref.purchase(ids, package.traffic_limit, package.duration, op.order, now)
            order = None if op.order is None else UUID(int=op.order)
            events = queue.purchase(package, order, op.amount, ids, now)
            outcome = "duplicate" if any(isinstance(e, DuplicateOrder) for e in events) else "ok"
            return outcome, ref_outcome, self.settle(events)
        if isinstance(op, Usage | RacingUsage):
            unsettled: list[DomainEvent] = []
            for usage in (op,) if isinstance(op, Usage) else (op.first, op.second):
                unsettled += self.record_usage(usage)
            return "ok", "ok", self.settle(unsettled)
        if isinstance(op, AdjustActive):
            active = queue.current()
            if active is None:
                return "skipped", "skipped", []
            op = Adjust(pick=self.item_ids().index(active.id), delta=op.delta)
        if isinstance(op, Cancel | Adjust):
            ids = self.item_ids()
            if not ids:
                return "skipped", "skipped", []
            item_id = ids[op.pick % len(ids)]
            if isinstance(op, Cancel):
                ref_outcome = ref.cancel(item_id, now)
                try:
                    return "ok", ref_outcome, self.settle(queue.cancel(item_id, now))
                except ItemNotCancellableError:
                    return "not_cancellable", ref_outcome, []
            ref_outcome = ref.adjust(item_id, op.delta, now)
            try:
                return "ok", ref_outcome, self.settle(queue.adjust_quota(item_id, op.delta, now))
            except ItemNotAdjustableError:
                return "not_adjustable", ref_outcome, []
            except UnlimitedTrafficError:
                return "unlimited", ref_outcome, []
        if isinstance(op, Tick):
            self.now = now + timedelta(seconds=op.seconds)
            ref.tick(self.now)
            return "ok", "ok", self.fire_due_timers(twice=op.twice, settle_each=True)
        if isinstance(op, Lag):
            self.now = now + timedelta(seconds=op.seconds)
            return "ok", "ok", []
        if isinstance(op, LagPastExpiry):
            active = queue.current()
            if active is None or active.expire_at is None:
                return "skipped", "skipped", []
            self.now = max(now, active.expire_at + timedelta(seconds=op.extra))
            return "ok", "ok", []
        if isinstance(op, UsageRacingTimers):
            self.now = now + timedelta(seconds=op.seconds)
            ref.tick(self.now)
            unsettled = self.fire_due_timers(twice=False, settle_each=False)
            unsettled += self.record_usage(op.usage)
            return "ok", "ok", self.settle(unsettled)
        if isinstance(op, StaleTimer | DuplicateTimer):
            timers = self.voided if isinstance(op, StaleTimer) else self.fired
            if not timers:
                return "skipped", "skipped", []
            kind: TimerKind = "stale" if isinstance(op, StaleTimer) else "duplicate"
            return "ok", "ok", self.settle(self.fire_timer(timers[op.pick % len(timers)], kind))
        if isinstance(op, Replay | StaleTrigger):
            pool = (
                self.delivered
                if isinstance(op, Replay)
                else [(item_id, ExpiryReason.TIME) for item_id in self.voided]
            )
            if not pool:
                return "skipped", "skipped", []
            item_id, reason = pool[op.pick % len(pool)]
            return "ok", "ok", self.settle(queue.expire(item_id, reason, now))
        active = queue.current()
        # Early means not due: once the active item's time is up, a timer for it is just late.
        if active is None or active.time_exhausted(now):
            return "skipped", "skipped", []
        if isinstance(op, EarlyTimer):
            return "ok", "ok", self.settle(self.fire_timer(active.id, "early"))
        return "ok", "ok", self.settle(queue.expire(active.id, op.reason, now))

    def run(self, ops: list[Op]) -> Trace:
        for op in ops:
            before = real_state(self.queue)
            activations_before = len(self.ref.activations)
            losses_before = self.ref.access_losses
            cancellations_before = len(self.ref.cancellations)
            outcome, ref_outcome, events = self.apply(op)
            self.trace.steps.append(
                Step(
                    op=op,
                    now=self.now,
                    outcome=outcome,
                    ref_outcome=ref_outcome,
                    events=events,
                    before=before,
                    after=real_state(self.queue),
                    ref_after=self.ref.state(),
                    ref_activations=self.ref.activations[activations_before:],
                    ref_access_losses=self.ref.access_losses - losses_before,
                    ref_cancellations=self.ref.cancellations[cancellations_before:],
                    current=(c.id if (c := self.queue.current_at(self.now)) else None),
                    ref_current=self.ref.current(self.now),
                    pending=dict(self.pending),
                    recorded=(self.recorded_upload, self.recorded_download),
                )
            )
        self.trace.ref_expirations = list(self.ref.expirations)
        return self.trace


def run(ops: list[Op]) -> Trace:
    return Driver().run(ops)


# -- properties --------------------------------------------------------------------------------
# Each group of properties is a `check_*` function over a whole trace. Each hypothesis test runs
# its own random operation sequences and checks one group on every step; the groups keep the
# number of hypothesis runs (and the file's run time) small. The last test replays one fixed
# sequence that is known to reach the late-relay paths and runs every group on it.


def check_one_active_item_and_fifo_activation(trace: Trace) -> None:
    assert trace.max_active <= 1, "more than one active item"
    activated = [e.item_id for e in trace.events() if isinstance(e, PackageActivated)]
    keys = [(trace.created_at[item_id], item_id) for item_id in activated]
    assert keys == sorted(keys), "activations out of (created_at, id) order"
    assert len(set(keys)) == len(keys), "an item was activated twice"


def check_traffic_conserved_and_billed_like_the_reference(trace: Trace) -> None:
    for step in trace.steps:
        items = step.after.items.values()
        upload = sum(item.upload for item in items) + step.after.unbilled[0]
        download = sum(item.download for item in items) + step.after.unbilled[1]
        assert (upload, download) == step.recorded, f"traffic not conserved after {step.op}"
        assert (step.after.traffic(), step.after.unbilled) == (
            step.ref_after.traffic(),
            step.ref_after.unbilled,
        ), step.op


def check_no_traffic_for_an_item_whose_time_is_up(trace: Trace) -> None:
    """A usage report is billed to an item whose time is not up, or kept as unbilled; it ends an
    active item whose time is up (timer still pending) by time first. Over a whole step, no
    item gains traffic after its expire_at. (Unbilled traffic carried over at activation lands
    on the new item even when its duration is zero and it ends by time at once: that happens at
    its expire_at, not after it, and the reference does the same.)"""
    for billing in trace.billings:
        if billing.traffic == (0, 0):
            continue
        old = billing.before.traffic()
        grew = {
            item_id: (upload - old[item_id][0], download - old[item_id][1])
            for item_id, (upload, download) in billing.after.traffic().items()
            if (upload, download) != old[item_id]
        }
        unbilled = (
            billing.after.unbilled[0] - billing.before.unbilled[0],
            billing.after.unbilled[1] - billing.before.unbilled[1],
        )
        if billing.ref_target is None:
            assert (grew, unbilled) == ({}, billing.traffic), f"not kept as unbilled: {billing}"
        else:
            assert grew == {billing.ref_target: billing.traffic}, f"billed elsewhere: {billing}"
            target = billing.after.items[billing.ref_target]
            assert not target.time_is_up(billing.now), f"billed to a timed-out item: {billing}"
        for item_id in billing.before.active_ids():
            item = billing.before.items[item_id]
            if not item.time_is_up(billing.now):
                continue
            # Usage after expire_at, its timer still pending: the item ends by time right here.
            assert billing.after.items[item_id].status == "consumed", billing
            expired = [
                (e.reason, e.expired_at)
                for e in billing.returned
                if isinstance(e, PackageExpired) and e.item_id == item_id
            ]
            assert expired == [(ExpiryReason.TIME, item.expire_at)], billing
            assert ExpiryUnscheduled(USER, item_id) in billing.returned, billing
    for step in trace.steps:
        for item_id, (upload, download) in step.after.traffic().items():
            was = step.before.items.get(item_id)
            if was is None or (was.upload, was.download) == (upload, download):
                continue
            expire_at = step.after.items[item_id].expire_at
            assert expire_at is None or step.now <= expire_at, (
                f"traffic added to item {item_id} after its expire_at in {step.op}"
            )


def check_state_quota_and_outcomes_match_the_reference(trace: Trace) -> None:
    for step in trace.steps:
        assert step.outcome == step.ref_outcome, step.op
        assert step.after.statuses() == step.ref_after.statuses(), step.op
        real_quota = {i: (s.adjust, s.quota, s.remaining) for i, s in step.after.items.items()}
        ref_quota = {i: (s.adjust, s.quota, s.remaining) for i, s in step.ref_after.items.items()}
        assert real_quota == ref_quota, f"quota arithmetic differs after {step.op}"
        real_times = {i: (s.activated_at, s.expire_at) for i, s in step.after.items.items()}
        ref_times = {i: (s.activated_at, s.expire_at) for i, s in step.ref_after.items.items()}
        assert real_times == ref_times, step.op
        assert step.after.access == step.ref_after.access, step.op
        assert step.after == step.ref_after, step.op
        assert step.current == step.ref_current, f"GetCurrentPackage differs after {step.op}"


def check_each_transition_announced_exactly_once(trace: Trace) -> None:
    for step in trace.steps:
        announced = [
            (e.item_id, e.quota, e.remaining)
            for e in step.events
            if isinstance(e, PackageActivated)
        ]
        assert announced == step.ref_activations, f"PackageActivated mismatch after {step.op}"
        cancelled = [
            (e.item_id, e.was_active) for e in step.events if isinstance(e, PackageCancelled)
        ]
        assert cancelled == step.ref_cancellations, f"PackageCancelled mismatch after {step.op}"
        lost = [e for e in step.events if isinstance(e, AllPackagesExpired)]
        assert len(lost) == step.ref_access_losses, f"AllPackagesExpired mismatch after {step.op}"
        if lost:
            assert step.after.access is False
            assert step.after.active_ids() == []
        for event in step.events:
            if isinstance(event, PackageExpired):
                item = step.after.items[event.item_id]
                assert item.status == "consumed", f"expired item not consumed in {step.op}"
                if event.reason is ExpiryReason.TIME:
                    assert event.expired_at == item.expire_at, step.op
                    assert item.time_is_up(step.now), f"expired by time too early in {step.op}"
                else:
                    assert event.expired_at == step.now, step.op
        expected_pending = {
            item_id: item.expire_at
            for item_id, item in step.after.items.items()
            if item.status == "active" and item.expire_at is not None
        }
        assert step.pending == expected_pending, f"time expiry timers wrong after {step.op}"
    expired = [
        (e.item_id, e.reason.value, e.expired_at)
        for e in trace.events()
        if isinstance(e, PackageExpired)
    ]
    assert expired == trace.ref_expirations, "PackageExpired differs from the reference"
    expired_ids = [item_id for item_id, _, _ in expired]
    assert len(expired_ids) == len(set(expired_ids)), "an item got more than one PackageExpired"
    consumed = {i for i, s in trace.steps[-1].after.items.items() if s.status == "consumed"}
    assert set(expired_ids) == consumed, "a consumed item got no PackageExpired"
    assert trace.schedule_errors == []


def check_due_timers_expire_by_time_without_advancing(trace: Trace) -> None:
    for timer in trace.timers:
        if timer.kind != "due":
            continue
        item = timer.before.items[timer.item_id]
        assert item.status == "active", timer
        assert item.expire_at is not None, timer
        assert item.time_is_up(timer.now), timer
        assert timer.returned == [
            PackageExpired(USER, timer.item_id, timer.package_id, item.expire_at, ExpiryReason.TIME)
        ], timer
        assert timer.after.items[timer.item_id].status == "consumed", timer
        assert timer.after.active_ids() == [], f"expire_due advanced the queue: {timer}"
        others_before = {i: s for i, s in timer.before.items.items() if i != timer.item_id}
        others_after = {i: s for i, s in timer.after.items.items() if i != timer.item_id}
        assert others_after == others_before, timer
        assert (timer.after.unbilled, timer.after.access) == (
            timer.before.unbilled,
            timer.before.access,
        ), timer


def check_stale_duplicate_and_early_triggers_change_nothing(trace: Trace) -> None:
    for step in trace.steps:
        if isinstance(step.op, TRIGGER_OPS):
            assert step.events == [], step.op
            assert step.after == step.before, step.op
    for timer in trace.timers:
        if timer.kind != "due":
            assert timer.returned == [], f"a {timer.kind} timer emitted: {timer}"
            assert timer.after == timer.before, f"a {timer.kind} timer changed: {timer}"


@PROPERTY_SETTINGS
@given(ops=operations)
def test_at_most_one_item_is_active_and_activation_is_fifo(ops: list[Op]) -> None:
    check_one_active_item_and_fifo_activation(run(ops))


@PROPERTY_SETTINGS
@given(ops=operations)
def test_traffic_is_conserved_and_billed_like_the_reference(ops: list[Op]) -> None:
    check_traffic_conserved_and_billed_like_the_reference(run(ops))


@PROPERTY_SETTINGS
@given(ops=operations)
def test_traffic_is_never_billed_to_an_item_whose_time_is_up(ops: list[Op]) -> None:
    check_no_traffic_for_an_item_whose_time_is_up(run(ops))


@PROPERTY_SETTINGS
@given(ops=operations)
def test_item_state_quota_and_command_outcomes_match_the_reference(ops: list[Op]) -> None:
    check_state_quota_and_outcomes_match_the_reference(run(ops))


@PROPERTY_SETTINGS
@given(ops=operations)
def test_events_announce_each_transition_exactly_once(ops: list[Op]) -> None:
    check_each_transition_announced_exactly_once(run(ops))


@PROPERTY_SETTINGS
@given(ops=operations)
def test_timers_expire_due_items_once_and_stale_duplicate_early_ones_change_nothing(
    ops: list[Op],
) -> None:
    trace = run(ops)

    check_due_timers_expire_by_time_without_advancing(trace)
    check_stale_duplicate_and_early_triggers_change_nothing(trace)


LATE_RELAY: list[Op] = [
    Purchase(limit=300, duration=10, amount=2),
    Lag(seconds=15),  # item 1's time is up at T0+10; its timer is still pending
    Usage(upload=20, download=30),  # ends item 1 by time, billed to item 2
    Tick(seconds=0),  # item 1's timer was already due: it is on its way and fires now
    Purchase(limit=300, duration=None, amount=1),
    Tick(seconds=20, twice=True),  # item 2's timer fires (twice) and item 3 activates
    DuplicateTimer(pick=0),
    Purchase(limit=300, duration=5, amount=1),
    Cancel(pick=2),  # item 3: item 4 activates
    LagPastExpiry(extra=0),
    Adjust(pick=3, delta=1_000),  # item 4's time is up: ends by time, the delta is kept
    Usage(upload=1, download=1),  # nothing queued: unbilled
    Purchase(limit=300, duration=5, amount=1),
    UsageRacingTimers(seconds=5, usage=Usage(upload=2, download=3)),  # item 5 ends by time
    StaleTimer(pick=0),
    StaleTimer(pick=1),
    StaleTrigger(pick=0),
    Purchase(limit=300, duration=100, amount=1),
    EarlyTimer(),
    LagPastExpiry(extra=0),
    Usage(upload=1, download=1),  # exactly at item 6's expire_at: ends it, nothing queued
    Replay(pick=0),
]


def test_late_relay_sequence_reaches_usage_after_expire_at_and_stale_timers() -> None:
    trace = run(LATE_RELAY)

    time_ups = [
        item_id
        for billing in trace.billings
        for item_id in billing.before.active_ids()
        if billing.before.items[item_id].time_is_up(billing.now)
    ]
    assert time_ups == [1, 6], "usage at or after expire_at was not reached"
    assert {timer.kind for timer in trace.timers} == {
        "due",
        "in_flight",
        "stale",
        "duplicate",
        "early",
    }
    final = trace.steps[-1].after
    assert (final.items[4].status, final.items[4].adjust) == ("consumed", 1_000)
    assert (final.items[6].status, final.unbilled, final.access) == ("consumed", (1, 1), False)
    assert [step.outcome for step in trace.steps].count("skipped") == 0
    check_one_active_item_and_fifo_activation(trace)
    check_traffic_conserved_and_billed_like_the_reference(trace)
    check_no_traffic_for_an_item_whose_time_is_up(trace)
    check_state_quota_and_outcomes_match_the_reference(trace)
    check_each_transition_announced_exactly_once(trace)
    check_due_timers_expire_by_time_without_advancing(trace)
    check_stale_duplicate_and_early_triggers_change_nothing(trace)


TERMS_AND_ORDERS: list[Op] = [
    Purchase(limit=None, duration=30, amount=1, order=1),  # item 1: time only, active
    Purchase(limit=500, duration=None, amount=1, order=1),  # the same order resent: nothing
    Purchase(limit=500, duration=None, amount=1, order=2),  # item 3: traffic only
    EditCatalog(limit=50, duration=5),  # item 3 keeps 500 bytes and no expiry
    Rebuy(amount=1, order=None),  # item 4: bought on the edited terms
    Usage(upload=4_000, download=4_000),  # unlimited item 1 takes it all and stays active
    AdjustActive(delta=-10),  # refused: unlimited traffic
    Purchase(limit=0, duration=10, amount=1, order=3),  # item 5: zero traffic
    LagPastExpiry(extra=0),  # item 1's time is up; GetCurrentPackage says none
    Tick(seconds=0),  # its timer: item 3 activates
    Usage(upload=300, download=200),  # item 3 used up at its own 500, item 4 activates
    Cancel(pick=3),  # item 5, queued: announced, not active
    Rebuy(amount=1, order=2),  # resent again: nothing
    Tick(seconds=5),  # item 4's 5 s are up: nothing left, access ends
]


def test_resent_orders_catalog_edits_and_plans_without_a_limit_match_the_reference() -> None:
    trace = run(TERMS_AND_ORDERS)

    outcomes = [step.outcome for step in trace.steps]
    assert outcomes.count("duplicate") == 2
    assert outcomes[6] == "unlimited"
    assert trace.steps[8].current is None
    assert trace.steps[8].before.active_ids() == [1]
    final = trace.steps[-1].after
    assert final.items[1].quota is None
    assert final.items[1].upload == 4_000
    assert (final.items[3].quota, final.items[3].expire_at) == (500, None)
    assert final.items[4].quota == 50
    assert [i for i, s in final.items.items() if s.status == "cancelled"] == [5]
    assert sorted(final.items) == [1, 3, 4, 5]  # id 2 went to the resent order, unused
    assert final.access is False
    check_one_active_item_and_fifo_activation(trace)
    check_traffic_conserved_and_billed_like_the_reference(trace)
    check_no_traffic_for_an_item_whose_time_is_up(trace)
    check_state_quota_and_outcomes_match_the_reference(trace)
    check_each_transition_announced_exactly_once(trace)
    check_due_timers_expire_by_time_without_advancing(trace)
    check_stale_duplicate_and_early_triggers_change_nothing(trace)
