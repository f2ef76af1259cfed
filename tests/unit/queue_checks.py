"""The properties of `UserQueue`, each group a `check_*` function over a whole trace
(tests/unit/queue_driver.py): checked on random operation sequences by
tests/unit/test_domain_queue_properties.py and on fixed ones by
tests/unit/test_domain_queue_sequences.py."""

from __future__ import annotations

from datetime import datetime

from domain.events import (
    AllPackagesExpired,
    ExpiryUnscheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
)
from domain.model import ExpiryReason
from tests.unit.queue_driver import Billing, Trace
from tests.unit.queue_operations import TRIGGER_OPS, USER

# Each group of properties is a `check_*` function over a whole trace. Each hypothesis test runs
# its own random operation sequences and checks one group on every step; the groups keep the
# number of hypothesis runs (and the run time) small. The fixed sequences, known to reach the
# late-relay and late-usage paths, run every group on them.


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
