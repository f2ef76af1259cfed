"""The driver of the property tests of `UserQueue`: it runs operations through the real
aggregate the way the consumers do (with a relay that is not on time) and through the
reference, and records the trace the properties check
(tests/unit/test_domain_queue_properties.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

from domain.errors import ItemNotAdjustableError, ItemNotCancellableError, UnlimitedTrafficError
from domain.events import (
    DomainEvent,
    DuplicateOrder,
    ExpiryScheduled,
    ExpiryUnscheduled,
    PackageExpired,
    PackagesQueued,
)
from domain.model import ExpiryReason, Package
from domain.queue import UserQueue
from tests.unit.queue_operations import (
    MAX_REACTIONS,
    T0,
    USER,
    Adjust,
    AdjustActive,
    Cancel,
    DuplicateTimer,
    EarlyTimer,
    EditCatalog,
    Lag,
    LagPastExpiry,
    Op,
    Purchase,
    RacingUsage,
    Rebuy,
    Replay,
    StaleTimer,
    StaleTrigger,
    Tick,
    Usage,
    UsageRacingTimers,
)
from tests.unit.queue_reference import RefQueue, State, real_state

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
    recorded_at: datetime | None = None
    """When the traffic happened, as reported (None: not said)."""


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
        recorded_at = (
            None
            if usage.recorded_before is None
            else self.now - timedelta(seconds=usage.recorded_before)
        )
        ref_target = self.ref.usage(usage.upload, usage.download, self.now, recorded_at)
        before = real_state(self.queue)
        returned = self.queue.record_usage(
            usage.upload, usage.download, self.now, recorded_at=recorded_at
        )
        self.observe()
        self.trace.billings.append(
            Billing(
                traffic=(usage.upload, usage.download),
                now=self.now,
                returned=list(returned),
                before=before,
                after=real_state(self.queue),
                ref_target=ref_target,
                recorded_at=recorded_at,
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
