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

from datetime import datetime

from hypothesis import given, settings

from domain.events import (
    AllPackagesExpired,
    ExpiryUnscheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
)
from domain.model import ExpiryReason
from tests.unit.queue_driver import Billing, Trace, run
from tests.unit.queue_operations import (
    TRIGGER_OPS,
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
    Rebuy,
    Replay,
    StaleTimer,
    StaleTrigger,
    Tick,
    Usage,
    UsageRacingTimers,
    operations,
)

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, database=None)


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


def _late(billing: Billing, item_id: int | None) -> bool:
    """Whether `billing` is late traffic of item `item_id`: reported after the item's expire_at
    (its expiry not applied yet) but recorded before it, so billed to it."""
    if item_id is None or billing.recorded_at is None:
        return False
    item = billing.before.items.get(item_id)
    return (
        item is not None
        and item.status == "active"
        and item.expire_at is not None
        and item.time_is_up(billing.now)
        and billing.recorded_at < item.expire_at
    )


def check_no_traffic_for_an_item_whose_time_is_up(trace: Trace) -> None:
    """A usage report is billed to an item whose time is not up, or kept as unbilled; it ends an
    active item whose time is up (timer still pending) by time first, unless the traffic was
    recorded before that item's expire_at: then it is billed to it, which then runs out (by
    usage if that used it up, else by time). Over a whole step, no item gains traffic after its
    expire_at but such late traffic. (Unbilled traffic carried over at activation lands on the
    new item even when its duration is zero and it ends by time at once: that happens at its
    expire_at, not after it, and the reference does the same.)"""
    late_billed: set[tuple[datetime, int]] = set()
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
            late = _late(billing, billing.ref_target)
            if late:
                late_billed.add((billing.now, billing.ref_target))
            assert late or not target.time_is_up(billing.now), (
                f"billed to a timed-out item: {billing}"
            )
        for item_id in billing.before.active_ids():
            item = billing.before.items[item_id]
            if not item.time_is_up(billing.now):
                continue
            # Usage after expire_at, its timer still pending: the item ends right here, by time
            # (or by usage, when late traffic of its own used it up).
            assert billing.after.items[item_id].status == "consumed", billing
            expired = [
                (e.reason, e.expired_at)
                for e in billing.returned
                if isinstance(e, PackageExpired) and e.item_id == item_id
            ]
            ends = [[(ExpiryReason.TIME, item.expire_at)]]
            if _late(billing, item_id) and billing.ref_target == item_id:
                ends.append([(ExpiryReason.USAGE, billing.now)])
            assert expired in ends, billing
            assert ExpiryUnscheduled(USER, item_id) in billing.returned, billing
    for step in trace.steps:
        for item_id, (upload, download) in step.after.traffic().items():
            was = step.before.items.get(item_id)
            if was is None or (was.upload, was.download) == (upload, download):
                continue
            expire_at = step.after.items[item_id].expire_at
            if (step.now, item_id) in late_billed:
                continue  # recorded before its expire_at, reported after: its own
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


LATE_USAGE: list[Op] = [
    Purchase(limit=300, duration=10, amount=3),
    Lag(seconds=15),  # item 1's time is up at T0+10; its timer is still pending
    Usage(upload=20, download=30, recorded_before=8),  # happened at T0+7: item 1's own
    Tick(seconds=0),  # item 1's timer was on its way: it changes nothing now
    LagPastExpiry(extra=3),  # item 2's time is up; its timer pending
    Usage(upload=5, download=5, recorded_before=1),  # happened after its expire_at: item 3's
    LagPastExpiry(extra=2),  # item 3's time is up; its timer pending
    Usage(upload=200, download=200, recorded_before=5),  # item 3's own, and it uses it up
    Usage(upload=1, download=1, recorded_before=100),  # long ago, but item 3 has run out
]


def test_late_usage_is_billed_to_the_item_it_happened_in_until_its_expiry_is_applied() -> None:
    trace = run(LATE_USAGE)
    late = [b.ref_target for b in trace.billings if _late(b, b.ref_target)]
    assert late == [1, 3], "late usage of an item whose expiry was pending was not reached"
    targets = [b.ref_target for b in trace.billings]
    assert targets == [1, 3, 3, None]
    expired = [(e.item_id, e.reason) for e in trace.events() if isinstance(e, PackageExpired)]
    assert expired == [
        (1, ExpiryReason.TIME),
        (2, ExpiryReason.TIME),
        (3, ExpiryReason.USAGE),
    ]
    for check in (
        check_traffic_conserved_and_billed_like_the_reference,
        check_no_traffic_for_an_item_whose_time_is_up,
        check_state_quota_and_outcomes_match_the_reference,
        check_each_transition_announced_exactly_once,
    ):
        check(trace)
