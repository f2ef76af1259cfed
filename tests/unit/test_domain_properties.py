"""Property tests: `UserQueue` driven by random operations and checked against a reference model.

The reference model below is deliberately simple and independent of `domain`: one user's queue
is a list of items with limit/adjust/traffic/status, and every transition advances the queue at
once. The real aggregate is driven the way the consumers drive it: after every command, each
emitted `PackagesQueued` runs the queue push (`advance`), each `PackageExpired` is fed back into
`expire()` (the package_expiring consumer), and `ExpiryScheduled`/`ExpiryUnscheduled` maintain a
fake scheduler whose due time triggers are delivered as time advances. Once nothing is left to
react to, the real state must equal the reference state.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.errors import ItemNotAdjustableError, ItemNotCancellableError
from domain.events import (
    AllPackagesExpired,
    DomainEvent,
    ExpiryScheduled,
    ExpiryUnscheduled,
    PackageActivated,
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
    limit: int
    duration: int | None  # seconds; None = never expires by time
    amount: int


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
class Tick:
    seconds: int  # the clock moves on; due time triggers are delivered


@dataclass(frozen=True)
class Replay:
    pick: int  # deliver an already delivered PackageExpired once more


@dataclass(frozen=True)
class StaleTrigger:
    pick: int  # deliver a time trigger that the domain unscheduled (the scheduler was late)


@dataclass(frozen=True)
class EarlyTrigger:
    reason: ExpiryReason  # a trigger for the active item while it is not due


Op = Purchase | Usage | RacingUsage | Cancel | Adjust | Tick | Replay | StaleTrigger | EarlyTrigger
TRIGGER_OPS = (Replay, StaleTrigger, EarlyTrigger)

picks = st.integers(min_value=0, max_value=50)
purchases = st.builds(
    Purchase,
    limit=st.integers(min_value=0, max_value=300),
    duration=st.one_of(st.none(), st.just(0), st.integers(min_value=1, max_value=100)),
    amount=st.integers(min_value=1, max_value=3),
)
usages = st.builds(
    Usage,
    upload=st.integers(min_value=0, max_value=150),
    download=st.integers(min_value=0, max_value=150),
)
ticks = st.builds(Tick, seconds=st.integers(min_value=0, max_value=120))
operations = st.lists(
    # purchases, usage and the clock are listed twice so that they come up more often
    st.one_of(
        purchases,
        usages,
        ticks,
        purchases,
        usages,
        ticks,
        st.builds(RacingUsage, first=usages, second=usages),
        st.builds(Cancel, pick=picks),
        st.builds(Adjust, pick=picks, delta=st.integers(min_value=-300, max_value=300)),
        st.builds(Replay, pick=picks),
        st.builds(StaleTrigger, pick=picks),
        st.builds(EarlyTrigger, reason=st.sampled_from(ExpiryReason)),
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
    quota: int
    remaining: int
    activated_at: datetime | None
    expire_at: datetime | None


@dataclass(frozen=True)
class State:
    items: dict[int, ItemState]
    unbilled: tuple[int, int]
    access: bool

    def statuses(self) -> dict[int, str]:
        return {item_id: item.status for item_id, item in self.items.items()}

    def active_ids(self) -> list[int]:
        return [item_id for item_id, item in self.items.items() if item.status == "active"]


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
    limit: int
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
    """One user's queue in the simplest terms; every change of the active item advances at once."""

    items: list[RefItem] = field(default_factory=list)
    unbilled_upload: int = 0
    unbilled_download: int = 0
    access: bool = False
    activations: list[tuple[int, int, int]] = field(default_factory=list)
    """(item id, quota, remaining) at each activation, in order."""
    access_losses: int = 0
    expirations: list[tuple[int, str]] = field(default_factory=list)
    """(item id, reason) of every item that ran out by usage or at activation, in order."""

    def find(self, item_id: int) -> RefItem:
        return next(item for item in self.items if item.id == item_id)

    def active(self) -> RefItem | None:
        return next((item for item in self.items if item.status == "active"), None)

    @staticmethod
    def out_of_traffic(item: RefItem) -> bool:
        return item.upload + item.download >= item.limit + item.adjust

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
            quota = item.limit + item.adjust
            remaining = max(quota - item.upload - item.download, 0)
            self.activations.append((item.id, quota, remaining))
            if self.out_of_traffic(item):
                item.status = "consumed"
                self.expirations.append((item.id, "usage"))
            elif item.expire_at is not None and item.expire_at <= now:
                item.status = "consumed"
                self.expirations.append((item.id, "time"))
            else:
                return
        if self.access:
            self.access = False
            self.access_losses += 1

    def purchase(
        self, ids: list[int], limit: int, duration: timedelta | None, now: datetime
    ) -> None:
        for item_id in ids:
            self.items.append(RefItem(item_id, limit, duration, now))
        self.advance(now)

    def usage(self, upload: int, download: int, now: datetime) -> None:
        item = self.active()
        if item is None:
            self.unbilled_upload += upload
            self.unbilled_download += download
            return
        item.upload += upload
        item.download += download
        if self.out_of_traffic(item):
            item.status = "consumed"
            self.expirations.append((item.id, "usage"))
            self.advance(now)

    def cancel(self, item_id: int, now: datetime) -> str:
        item = self.find(item_id)
        if item.status == "consumed":
            return "not_cancellable"
        if item.status == "cancelled":
            return "ok"
        was_active = item.status == "active"
        item.status = "cancelled"
        if was_active:
            self.advance(now)
        return "ok"

    def adjust(self, item_id: int, delta: int, now: datetime) -> str:
        item = self.find(item_id)
        if item.status in ("consumed", "cancelled"):
            return "not_adjustable"
        item.adjust += delta
        if item.status == "active" and self.out_of_traffic(item):
            item.status = "consumed"
            self.expirations.append((item.id, "usage"))
            self.advance(now)
        return "ok"

    def tick(self, now: datetime) -> None:
        item = self.active()
        while item is not None and item.expire_at is not None and item.expire_at <= now:
            item.status = "consumed"
            self.advance(now)
            item = self.active()

    def state(self) -> State:
        return State(
            items={
                item.id: ItemState(
                    status=item.status,
                    upload=item.upload,
                    download=item.download,
                    adjust=item.adjust,
                    quota=item.limit + item.adjust,
                    remaining=max(item.limit + item.adjust - item.upload - item.download, 0),
                    activated_at=item.activated_at,
                    expire_at=item.expire_at,
                )
                for item in self.items
            },
            unbilled=(self.unbilled_upload, self.unbilled_download),
            access=self.access,
        )


# -- the driver ------------------------------------------------------------------------------


@dataclass
class Step:
    op: Op
    outcome: str
    ref_outcome: str
    events: list[DomainEvent]
    """Everything the domain emitted in this step, the consumers' reactions included."""
    before: State
    after: State
    ref_after: State
    ref_activations: list[tuple[int, int, int]]
    ref_access_losses: int
    pending: dict[int, datetime]
    recorded: tuple[int, int]


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)
    max_active: int = 0
    """Most items seen active at once, checked after every single domain call."""
    schedule_errors: list[str] = field(default_factory=list)
    created_at: dict[int, datetime] = field(default_factory=dict)
    ref_expirations: list[tuple[int, str]] = field(default_factory=list)

    def events(self) -> list[DomainEvent]:
        return [event for step in self.steps for event in step.events]


class Driver:
    def __init__(self) -> None:
        self.queue = UserQueue(user_id=USER)
        self.ref = RefQueue()
        self.now = T0
        self.next_id = 1
        self.pending: dict[int, datetime] = {}
        self.voided: list[int] = []
        self.delivered: list[tuple[int, ExpiryReason]] = []
        self.recorded_upload = 0
        self.recorded_download = 0
        self.trace = Trace()

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
                if self.pending.pop(event.item_id, None) is None:
                    self.trace.schedule_errors.append(f"never scheduled: {event.item_id}")
                else:
                    self.voided.append(event.item_id)
            self.observe()
            todo.extend(reaction)
        return emitted

    def fire_due_triggers(self) -> list[DomainEvent]:
        emitted: list[DomainEvent] = []
        while True:
            due = sorted((at, item_id) for item_id, at in self.pending.items() if at <= self.now)
            if not due:
                return emitted
            item_id = due[0][1]
            del self.pending[item_id]
            self.delivered.append((item_id, ExpiryReason.TIME))
            emitted += self.settle(self.queue.expire(item_id, ExpiryReason.TIME, self.now))
            self.observe()

    def item_ids(self) -> list[int]:
        return sorted(item.id for item in self.queue.items)

    def apply(self, op: Op) -> tuple[str, str, list[DomainEvent]]:
        """Run one operation on both models: (real outcome, reference outcome, events)."""
        queue, ref, now = self.queue, self.ref, self.now
        if isinstance(op, Purchase):
            ids = list(range(self.next_id, self.next_id + op.amount))
            self.next_id += op.amount
            duration = None if op.duration is None else timedelta(seconds=op.duration)
            package = Package(ids[0], f"p{ids[0]}", op.limit, duration)
            for item_id in ids:
                self.trace.created_at[item_id] = now
            ref.purchase(ids, op.limit, duration, now)
            return "ok", "ok", self.settle(queue.purchase(package, None, op.amount, ids, now))
        if isinstance(op, Usage | RacingUsage):
            unsettled: list[DomainEvent] = []
            for usage in (op,) if isinstance(op, Usage) else (op.first, op.second):
                self.recorded_upload += usage.upload
                self.recorded_download += usage.download
                ref.usage(usage.upload, usage.download, now)
                unsettled += queue.record_usage(usage.upload, usage.download, now)
                self.observe()
            return "ok", "ok", self.settle(unsettled)
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
        if isinstance(op, Tick):
            self.now = now + timedelta(seconds=op.seconds)
            ref.tick(self.now)
            return "ok", "ok", self.fire_due_triggers()
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
        if active is None:
            return "skipped", "skipped", []
        return "ok", "ok", self.settle(queue.expire(active.id, op.reason, now))

    def run(self, ops: list[Op]) -> Trace:
        for op in ops:
            before = real_state(self.queue)
            activations_before = len(self.ref.activations)
            losses_before = self.ref.access_losses
            outcome, ref_outcome, events = self.apply(op)
            self.trace.steps.append(
                Step(
                    op=op,
                    outcome=outcome,
                    ref_outcome=ref_outcome,
                    events=events,
                    before=before,
                    after=real_state(self.queue),
                    ref_after=self.ref.state(),
                    ref_activations=self.ref.activations[activations_before:],
                    ref_access_losses=self.ref.access_losses - losses_before,
                    pending=dict(self.pending),
                    recorded=(self.recorded_upload, self.recorded_download),
                )
            )
        self.trace.ref_expirations = list(self.ref.expirations)
        return self.trace


def run(ops: list[Op]) -> Trace:
    return Driver().run(ops)


# -- properties --------------------------------------------------------------------------------
# Each test runs its own random operation sequences and checks one group of properties on every
# step; the groups keep the number of hypothesis runs (and the file's run time) small.


@PROPERTY_SETTINGS
@given(ops=operations)
def test_at_most_one_item_is_active_and_activation_is_fifo(ops: list[Op]) -> None:
    trace = run(ops)

    assert trace.max_active <= 1, "more than one active item"
    activated = [e.item_id for e in trace.events() if isinstance(e, PackageActivated)]
    keys = [(trace.created_at[item_id], item_id) for item_id in activated]
    assert keys == sorted(keys), "activations out of (created_at, id) order"
    assert len(set(keys)) == len(keys), "an item was activated twice"


@PROPERTY_SETTINGS
@given(ops=operations)
def test_traffic_is_conserved_and_billed_like_the_reference(ops: list[Op]) -> None:
    trace = run(ops)

    for step in trace.steps:
        items = step.after.items.values()
        upload = sum(item.upload for item in items) + step.after.unbilled[0]
        download = sum(item.download for item in items) + step.after.unbilled[1]
        assert (upload, download) == step.recorded, f"traffic not conserved after {step.op}"
        real = {i: (s.upload, s.download) for i, s in step.after.items.items()}
        ref = {i: (s.upload, s.download) for i, s in step.ref_after.items.items()}
        assert (real, step.after.unbilled) == (ref, step.ref_after.unbilled), step.op


@PROPERTY_SETTINGS
@given(ops=operations)
def test_item_state_quota_and_command_outcomes_match_the_reference(ops: list[Op]) -> None:
    trace = run(ops)

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


@PROPERTY_SETTINGS
@given(ops=operations)
def test_events_announce_each_transition_exactly_once(ops: list[Op]) -> None:
    trace = run(ops)

    for step in trace.steps:
        announced = [
            (e.item_id, e.quota, e.remaining)
            for e in step.events
            if isinstance(e, PackageActivated)
        ]
        assert announced == step.ref_activations, f"PackageActivated mismatch after {step.op}"
        lost = [e for e in step.events if isinstance(e, AllPackagesExpired)]
        assert len(lost) == step.ref_access_losses, f"AllPackagesExpired mismatch after {step.op}"
        if lost:
            assert step.after.access is False
            assert step.after.active_ids() == []
        expected_pending = {
            item_id: item.expire_at
            for item_id, item in step.after.items.items()
            if item.status == "active" and item.expire_at is not None
        }
        assert step.pending == expected_pending, f"time expiry schedule wrong after {step.op}"
    expired = [(e.item_id, e.reason.value) for e in trace.events() if isinstance(e, PackageExpired)]
    assert expired == trace.ref_expirations, "PackageExpired not once per item with its reason"
    assert trace.schedule_errors == []


@PROPERTY_SETTINGS
@given(ops=operations)
def test_stale_duplicate_and_early_triggers_change_nothing(ops: list[Op]) -> None:
    trace = run(ops)

    for step in trace.steps:
        if isinstance(step.op, TRIGGER_OPS):
            assert step.events == [], step.op
            assert step.after == step.before, step.op
