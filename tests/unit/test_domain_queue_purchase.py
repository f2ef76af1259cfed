"""Example-based tests of the `UserQueue` aggregate: one behaviour per test."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID

import pytest

from domain.errors import (
    MAX_AMOUNT,
    InvalidAmountError,
    ItemNotAdjustableError,
    ItemNotCancellableError,
    ItemNotFoundError,
    NegativeUsageError,
)
from domain.events import (
    AllPackagesExpired,
    DomainEvent,
    ExpiryScheduled,
    ExpiryUnscheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
    PackagesQueued,
    UsageRemaining,
)
from domain.model import ExpiryReason, ItemStatus, Package
from domain.queue import UserQueue

USER = UUID("00000000-0000-4000-8000-000000000001")
ORDER = UUID("00000000-0000-4000-8000-0000000000aa")
T0 = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)

E = TypeVar("E")

BASIC = Package(id=1, name="basic", traffic_limit=1_000)
MONTHLY = Package(id=2, name="monthly", traffic_limit=1_000, duration=timedelta(days=30))
INSTANT = Package(id=3, name="instant", traffic_limit=1_000, duration=timedelta(0))
MONTHLY_DUE = T0 + timedelta(days=30)
"""expire_at of a MONTHLY item activated at T0."""


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_queue() -> UserQueue:
    return UserQueue(user_id=USER)


def queue_with(*packages: Package, now: datetime = T0) -> UserQueue:
    """A queue holding one item per package, ids 1..n in purchase order, nothing active yet."""
    queue = new_queue()
    for item_id, package in enumerate(packages, start=1):
        queue.purchase(package, None, 1, [item_id], now)
    return queue


def active_queue(*packages: Package, now: datetime = T0) -> UserQueue:
    """Like `queue_with`, then the queue-push consumer has run once."""
    queue = queue_with(*packages, now=now)
    queue.advance(now)
    return queue


def of_type(events: list[DomainEvent], kind: type[E]) -> list[E]:
    return [event for event in events if isinstance(event, kind)]


def status_of(queue: UserQueue, item_id: int) -> ItemStatus:
    return queue.item(item_id).status


# -- purchase / amount validation ---------------------------------------------------------


def test_purchase_rejects_zero_amount() -> None:
    queue = new_queue()

    with pytest.raises(InvalidAmountError) as raised:
        queue.purchase(BASIC, None, 0, [], T0)

    assert raised.value.amount == 0
    assert queue.items == []


def test_purchase_rejects_negative_amount() -> None:
    queue = new_queue()

    with pytest.raises(InvalidAmountError) as raised:
        queue.purchase(BASIC, None, -3, [], T0)

    assert raised.value.amount == -3
    assert queue.items == []


def test_purchase_rejects_amount_above_max_amount() -> None:
    queue = new_queue()
    ids = list(range(1, MAX_AMOUNT + 2))

    with pytest.raises(InvalidAmountError):
        queue.purchase(BASIC, None, MAX_AMOUNT + 1, ids, T0)

    assert queue.items == []


def test_purchase_accepts_exactly_max_amount() -> None:
    queue = new_queue()

    queue.purchase(BASIC, None, MAX_AMOUNT, list(range(1, MAX_AMOUNT + 1)), T0)

    assert len(queue.items) == MAX_AMOUNT


def test_purchase_rejects_item_id_count_different_from_amount() -> None:
    queue = new_queue()

    with pytest.raises(ValueError, match="need 2 item ids"):
        queue.purchase(BASIC, None, 2, [1], T0)

    assert queue.items == []


def test_purchase_queues_amount_items_and_emits_one_packages_queued() -> None:
    queue = new_queue()

    events = queue.purchase(BASIC, ORDER, 3, [7, 8, 9], T0)

    assert events == [PackagesQueued(USER, BASIC.id, (7, 8, 9), T0)]
    assert [(i.id, i.status, i.created_at, i.by_order) for i in queue.all_items()] == [
        (7, ItemStatus.IN_QUEUE, T0, ORDER),
        (8, ItemStatus.IN_QUEUE, T0, ORDER),
        (9, ItemStatus.IN_QUEUE, T0, ORDER),
    ]


def test_purchase_alone_does_not_activate_anything() -> None:
    queue = new_queue()

    queue.purchase(BASIC, None, 1, [1], T0)

    assert queue.current() is None
    assert queue.has_access is False


# -- advance: FIFO activation ---------------------------------------------------------------


def test_advance_activates_oldest_queued_item_by_created_at_then_id() -> None:
    queue = new_queue()
    queue.purchase(BASIC, None, 1, [5], at(20))
    queue.purchase(BASIC, None, 2, [12, 11], at(10))
    now = at(30)

    events = queue.advance(now)
    for _ in range(2):
        current = queue.current()
        assert current is not None
        events += queue.cancel(current.id, now)

    assert [e.item_id for e in of_type(events, PackageActivated)] == [11, 12, 5]


def test_all_items_lists_items_in_queue_order() -> None:
    queue = new_queue()
    queue.purchase(BASIC, None, 1, [5], at(20))
    queue.purchase(BASIC, None, 2, [12, 11], at(10))

    assert [i.id for i in queue.all_items()] == [11, 12, 5]


def test_advance_emits_package_activated_with_quota_remaining_and_no_expiry() -> None:
    queue = queue_with(BASIC)

    events = queue.advance(at(5))

    assert events == [PackageActivated(USER, 1, BASIC.id, at(5), 1_000, 1_000, None)]
    item = queue.item(1)
    assert item.status is ItemStatus.ACTIVE
    assert item.activated_at == at(5)
    assert item.expire_at is None
    assert queue.has_access is True


def test_current_returns_the_active_item() -> None:
    queue = active_queue(BASIC, BASIC)

    current = queue.current()

    assert current is not None
    assert current.id == 1


def test_current_is_none_when_nothing_is_active() -> None:
    assert queue_with(BASIC).current() is None


def test_advance_does_nothing_while_an_item_is_active() -> None:
    queue = active_queue(BASIC, BASIC)

    events = queue.advance(at(1))

    assert events == []
    assert status_of(queue, 1) is ItemStatus.ACTIVE
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE


def test_advance_on_empty_queue_without_access_emits_nothing() -> None:
    queue = new_queue()

    assert queue.advance(T0) == []
    assert queue.has_access is False


def test_advance_skips_cancelled_queued_items() -> None:
    queue = queue_with(BASIC, BASIC)
    queue.cancel(1, T0)

    events = queue.advance(T0)

    assert [e.item_id for e in of_type(events, PackageActivated)] == [2]


# -- usage -----------------------------------------------------------------------------------


def test_usage_below_limit_keeps_item_active_and_emits_usage_remaining() -> None:
    queue = active_queue(BASIC)

    events = queue.record_usage(100, 200, at(1))

    assert events == [UsageRemaining(USER, 1, 700)]
    item = queue.item(1)
    assert (item.upload, item.download, item.status) == (100, 200, ItemStatus.ACTIVE)


def test_usage_one_byte_below_limit_keeps_item_active() -> None:
    queue = active_queue(BASIC)

    events = queue.record_usage(499, 500, at(1))

    assert events == [UsageRemaining(USER, 1, 1)]
    assert status_of(queue, 1) is ItemStatus.ACTIVE


def test_usage_reaching_exactly_the_limit_consumes_item_with_usage_reason() -> None:
    queue = active_queue(BASIC)

    events = queue.record_usage(400, 600, at(1))

    assert events == [PackageExpired(USER, 1, BASIC.id, at(1), ExpiryReason.USAGE)]
    assert status_of(queue, 1) is ItemStatus.CONSUMED


def test_usage_overshooting_the_limit_keeps_all_traffic_on_the_consumed_item() -> None:
    queue = active_queue(BASIC, BASIC)

    queue.record_usage(900, 300, at(1))

    assert queue.item(1).used == 1_200
    assert queue.item(2).used == 0
    assert (queue.unbilled_upload, queue.unbilled_download) == (0, 0)


def test_usage_consumption_does_not_advance_until_expire_is_called() -> None:
    queue = active_queue(BASIC, BASIC)

    events = queue.record_usage(0, 1_000, at(1))

    assert of_type(events, PackageActivated) == []
    assert queue.current() is None
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE


def test_expire_after_usage_consumption_activates_next_item() -> None:
    queue = active_queue(BASIC, BASIC)
    queue.record_usage(0, 1_000, at(1))

    events = queue.expire(1, ExpiryReason.USAGE, at(2))

    assert events == [PackageActivated(USER, 2, BASIC.id, at(2), 1_000, 1_000, None)]


def test_negative_adjust_quota_lowers_the_usage_threshold() -> None:
    queue = active_queue(BASIC)
    queue.adjust_quota(1, -300, at(1))

    below = queue.record_usage(0, 699, at(2))
    reached = queue.record_usage(0, 1, at(3))

    assert below == [UsageRemaining(USER, 1, 1)]
    assert reached == [PackageExpired(USER, 1, BASIC.id, at(3), ExpiryReason.USAGE)]
    assert queue.item(1).quota == 700


def test_positive_adjust_quota_raises_the_usage_threshold() -> None:
    queue = active_queue(BASIC)
    queue.adjust_quota(1, 500, at(1))

    events = queue.record_usage(0, 1_499, at(2))

    assert events == [UsageRemaining(USER, 1, 1)]
    assert status_of(queue, 1) is ItemStatus.ACTIVE


@pytest.mark.parametrize(("upload", "download"), [(-1, 0), (0, -1), (-5, -5)])
def test_record_usage_rejects_negative_traffic(upload: int, download: int) -> None:
    queue = active_queue(BASIC)

    with pytest.raises(NegativeUsageError):
        queue.record_usage(upload, download, at(1))

    assert queue.item(1).used == 0


def test_usage_without_active_item_is_kept_as_unbilled() -> None:
    queue = new_queue()

    events = queue.record_usage(30, 70, T0)

    assert events == []
    assert (queue.unbilled_upload, queue.unbilled_download) == (30, 70)


def test_usage_while_consumed_item_awaits_expire_activates_and_bills_the_next_item() -> None:
    queue = active_queue(BASIC, BASIC)
    queue.record_usage(0, 1_000, at(1))

    events = queue.record_usage(5, 6, at(2))

    assert events == [
        PackageActivated(USER, 2, BASIC.id, at(2), 1_000, 1_000, None),
        UsageRemaining(USER, 2, 989),
    ]
    assert queue.item(1).used == 1_000
    assert (queue.item(2).upload, queue.item(2).download) == (5, 6)
    assert (queue.unbilled_upload, queue.unbilled_download) == (0, 0)


def test_expire_trigger_arriving_after_usage_advanced_the_queue_is_a_no_op() -> None:
    queue = active_queue(BASIC, BASIC)
    queue.record_usage(0, 1_000, at(1))
    queue.record_usage(5, 6, at(2))

    events = queue.expire(1, ExpiryReason.USAGE, at(3))

    assert events == []
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_usage_while_last_consumed_item_awaits_expire_is_kept_as_unbilled() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(0, 1_000, at(1))

    events = queue.record_usage(5, 6, at(2))
    events += queue.expire(1, ExpiryReason.USAGE, at(3))

    assert events == [AllPackagesExpired(USER, at(2))]
    assert queue.item(1).used == 1_000
    assert (queue.unbilled_upload, queue.unbilled_download) == (5, 6)


def test_unbilled_usage_is_added_to_next_item_at_activation() -> None:
    queue = new_queue()
    queue.record_usage(30, 70, T0)
    queue.purchase(BASIC, None, 1, [1], at(1))

    events = queue.advance(at(1))

    assert events == [PackageActivated(USER, 1, BASIC.id, at(1), 1_000, 900, None)]
    item = queue.item(1)
    assert (item.upload, item.download) == (30, 70)
    assert (queue.unbilled_upload, queue.unbilled_download) == (0, 0)


def test_unbilled_usage_exhausting_next_item_consumes_it_at_activation() -> None:
    queue = new_queue()
    queue.record_usage(600, 400, T0)
    queue.purchase(BASIC, None, 2, [1, 2], at(1))

    events = queue.advance(at(1))

    assert events == [
        PackageActivated(USER, 1, BASIC.id, at(1), 1_000, 0, None),
        PackageExpired(USER, 1, BASIC.id, at(1), ExpiryReason.USAGE),
        PackageActivated(USER, 2, BASIC.id, at(1), 1_000, 1_000, None),
    ]
    assert queue.item(1).used == 1_000
    assert queue.item(2).used == 0


# -- exhausted at activation --------------------------------------------------------------


def test_zero_duration_item_expires_at_activation_and_next_item_activates() -> None:
    queue = queue_with(INSTANT, BASIC)

    events = queue.advance(at(1))

    assert events == [
        PackageActivated(USER, 1, INSTANT.id, at(1), 1_000, 1_000, at(1)),
        PackageExpired(USER, 1, INSTANT.id, at(1), ExpiryReason.TIME),
        PackageActivated(USER, 2, BASIC.id, at(1), 1_000, 1_000, None),
    ]
    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_zero_duration_item_expiring_at_activation_is_never_scheduled() -> None:
    queue = queue_with(INSTANT, BASIC)

    events = queue.advance(at(1))

    assert of_type(events, ExpiryScheduled) == []


def test_queue_of_only_zero_duration_items_ends_with_one_all_packages_expired() -> None:
    queue = queue_with(INSTANT, INSTANT, INSTANT)

    events = queue.advance(at(1))

    assert [e.item_id for e in of_type(events, PackageActivated)] == [1, 2, 3]
    assert [e.item_id for e in of_type(events, PackageExpired)] == [1, 2, 3]
    assert of_type(events, AllPackagesExpired) == [AllPackagesExpired(USER, at(1))]
    assert isinstance(events[-1], AllPackagesExpired)
    assert len(events) == 7
    assert {i.status for i in queue.items} == {ItemStatus.CONSUMED}
    assert queue.has_access is False


def test_advance_after_all_packages_expired_emits_nothing() -> None:
    queue = queue_with(INSTANT, INSTANT)
    queue.advance(at(1))

    assert queue.advance(at(2)) == []
    assert queue.expire(2, ExpiryReason.TIME, at(2)) == []


def test_item_with_negative_quota_expires_at_activation_with_usage_reason() -> None:
    queue = queue_with(BASIC, BASIC)
    queue.adjust_quota(1, -1_000, T0)

    events = queue.advance(at(1))

    assert events[:2] == [
        PackageActivated(USER, 1, BASIC.id, at(1), 0, 0, None),
        PackageExpired(USER, 1, BASIC.id, at(1), ExpiryReason.USAGE),
    ]
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_zero_traffic_package_expires_at_activation() -> None:
    empty = Package(id=9, name="empty", traffic_limit=0)
    queue = queue_with(empty)

    events = queue.advance(at(1))

    assert of_type(events, PackageExpired) == [
        PackageExpired(USER, 1, empty.id, at(1), ExpiryReason.USAGE)
    ]
    assert of_type(events, AllPackagesExpired) == [AllPackagesExpired(USER, at(1))]


# -- time expiry ------------------------------------------------------------------------------


def test_activation_of_timed_item_schedules_expiry_at_activation_plus_duration() -> None:
    queue = queue_with(MONTHLY)
    due = at(5) + timedelta(days=30)

    events = queue.advance(at(5))

    assert events == [
        PackageActivated(USER, 1, MONTHLY.id, at(5), 1_000, 1_000, due),
        ExpiryScheduled(USER, 1, MONTHLY.id, due),
    ]
    assert queue.item(1).expire_at == due


def test_activation_of_untimed_item_schedules_no_expiry() -> None:
    queue = queue_with(BASIC)

    events = queue.advance(T0)

    assert of_type(events, ExpiryScheduled) == []


def test_time_expire_before_due_is_a_no_op() -> None:
    queue = active_queue(MONTHLY, BASIC)
    early = T0 + timedelta(days=30) - timedelta(seconds=1)

    events = queue.expire(1, ExpiryReason.TIME, early)

    assert events == []
    assert status_of(queue, 1) is ItemStatus.ACTIVE


def test_external_time_expired_event_consumes_due_active_item_and_activates_next() -> None:
    # pkgq's own PackageExpired is emitted by the transaction that consumed the item; an event
    # for an item still active can only come from outside, and is the item's expiry itself.
    queue = active_queue(MONTHLY, BASIC)

    events = queue.expire(1, ExpiryReason.TIME, MONTHLY_DUE)

    assert events == [PackageActivated(USER, 2, BASIC.id, MONTHLY_DUE, 1_000, 1_000, None)]
    assert status_of(queue, 1) is ItemStatus.CONSUMED


def test_timer_then_expire_event_activates_next_item_at_delivery_time() -> None:
    queue = active_queue(MONTHLY, BASIC)
    delivered = MONTHLY_DUE + HOUR

    events = queue.expire_due(1, delivered)
    events += queue.expire(1, ExpiryReason.TIME, delivered)

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME),
        PackageActivated(USER, 2, BASIC.id, delivered, 1_000, 1_000, None),
    ]


def test_time_expired_event_for_untimed_active_item_is_a_no_op() -> None:
    queue = active_queue(BASIC)

    events = queue.expire(1, ExpiryReason.TIME, T0 + timedelta(days=3650))

    assert events == []
    assert status_of(queue, 1) is ItemStatus.ACTIVE


def test_usage_trigger_for_active_item_with_traffic_left_is_a_no_op() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(0, 10, at(1))

    events = queue.expire(1, ExpiryReason.USAGE, at(2))

    assert events == []
    assert status_of(queue, 1) is ItemStatus.ACTIVE


def test_time_expiry_of_last_item_emits_package_expired_then_all_packages_expired() -> None:
    queue = active_queue(MONTHLY)

    events = queue.expire_due(1, MONTHLY_DUE)
    events += queue.expire(1, ExpiryReason.TIME, MONTHLY_DUE)

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME),
        AllPackagesExpired(USER, MONTHLY_DUE),
    ]
    assert queue.has_access is False


def test_usage_consumption_of_timed_item_unschedules_its_time_expiry() -> None:
    queue = active_queue(MONTHLY)

    events = queue.record_usage(0, 1_000, at(1))

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, at(1), ExpiryReason.USAGE),
        ExpiryUnscheduled(USER, 1),
    ]


def test_usage_consumption_of_untimed_item_unschedules_nothing() -> None:
    queue = active_queue(BASIC)

    events = queue.record_usage(0, 1_000, at(1))

    assert of_type(events, ExpiryUnscheduled) == []


def test_stale_time_expired_event_after_usage_consumption_is_a_no_op() -> None:
    queue = active_queue(MONTHLY, BASIC)
    queue.record_usage(0, 1_000, at(1))
    queue.expire(1, ExpiryReason.USAGE, at(2))
    due = T0 + timedelta(days=30)

    events = queue.expire(1, ExpiryReason.TIME, due)

    assert events == []
    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_stale_time_expired_event_for_cancelled_item_is_a_no_op() -> None:
    queue = active_queue(MONTHLY, BASIC)
    queue.cancel(1, at(1))

    events = queue.expire(1, ExpiryReason.TIME, T0 + timedelta(days=30))

    assert events == []
    assert status_of(queue, 1) is ItemStatus.CANCELLED


def test_duplicate_expire_trigger_emits_nothing_new() -> None:
    queue = active_queue(MONTHLY, BASIC)
    due = T0 + timedelta(days=30)
    first = queue.expire_due(1, due)
    first += queue.expire(1, ExpiryReason.TIME, due)

    again = queue.expire(1, ExpiryReason.TIME, due + HOUR)

    assert of_type(first, PackageActivated) != []
    assert again == []
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_duplicate_expire_trigger_after_all_expired_emits_nothing_new() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(0, 1_000, at(1))
    first = queue.expire(1, ExpiryReason.USAGE, at(2))

    again = queue.expire(1, ExpiryReason.USAGE, at(3))

    assert first == [AllPackagesExpired(USER, at(2))]
    assert again == []


def test_expire_of_unknown_item_raises_item_not_found() -> None:
    queue = active_queue(BASIC)

    with pytest.raises(ItemNotFoundError) as raised:
        queue.expire(99, ExpiryReason.TIME, at(1))

    assert (raised.value.item_id, raised.value.user_id) == (99, USER)


# -- the time-expiry timer (expire_due) -------------------------------------------------------


def test_expire_due_consumes_due_active_item_and_emits_one_time_expiry_without_advancing() -> None:
    queue = active_queue(MONTHLY, BASIC)

    events = queue.expire_due(1, MONTHLY_DUE)

    assert events == [PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME)]
    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert queue.current() is None
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE


def test_late_timer_expires_the_item_at_its_expire_at_not_at_delivery() -> None:
    queue = active_queue(MONTHLY)

    events = queue.expire_due(1, MONTHLY_DUE + timedelta(days=1))

    assert events == [PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME)]


def test_expire_due_before_expire_at_does_nothing() -> None:
    queue = active_queue(MONTHLY, BASIC)

    events = queue.expire_due(1, MONTHLY_DUE - timedelta(seconds=1))

    assert events == []
    assert status_of(queue, 1) is ItemStatus.ACTIVE
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE


def test_expire_due_for_untimed_item_does_nothing() -> None:
    queue = active_queue(BASIC)

    events = queue.expire_due(1, T0 + timedelta(days=3650))

    assert events == []
    assert status_of(queue, 1) is ItemStatus.ACTIVE


def test_expire_due_for_item_consumed_by_usage_first_emits_nothing() -> None:
    queue = active_queue(MONTHLY, BASIC)
    queue.record_usage(0, 1_000, at(1))
    queue.expire(1, ExpiryReason.USAGE, at(2))

    events = queue.expire_due(1, MONTHLY_DUE)

    assert events == []
    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_expire_due_for_cancelled_item_emits_nothing() -> None:
    queue = active_queue(MONTHLY, BASIC)
    queue.cancel(1, at(1))

    events = queue.expire_due(1, MONTHLY_DUE)

    assert events == []
    assert status_of(queue, 1) is ItemStatus.CANCELLED
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_second_expire_due_for_the_same_item_emits_nothing() -> None:
    queue = active_queue(MONTHLY, BASIC)
    queue.expire_due(1, MONTHLY_DUE)

    again = queue.expire_due(1, MONTHLY_DUE + HOUR)

    assert again == []
    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE


def test_expire_due_of_unknown_item_raises_item_not_found() -> None:
    queue = active_queue(MONTHLY)

    with pytest.raises(ItemNotFoundError) as raised:
        queue.expire_due(99, MONTHLY_DUE)

    assert (raised.value.item_id, raised.value.user_id) == (99, USER)


# -- time is up but the timer has not fired yet -------------------------------------------------


def test_usage_after_expire_at_expires_the_item_by_time_and_bills_the_next_item() -> None:
    queue = active_queue(MONTHLY, BASIC)
    late = MONTHLY_DUE + HOUR

    events = queue.record_usage(5, 6, late)

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME),
        ExpiryUnscheduled(USER, 1),
        PackageActivated(USER, 2, BASIC.id, late, 1_000, 1_000, None),
        UsageRemaining(USER, 2, 989),
    ]
    assert queue.item(1).used == 0
    assert (queue.item(2).upload, queue.item(2).download) == (5, 6)


def test_usage_exactly_at_expire_at_is_billed_to_the_next_item() -> None:
    queue = active_queue(MONTHLY, BASIC)

    queue.record_usage(5, 6, MONTHLY_DUE)

    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert queue.item(1).used == 0
    assert (queue.item(2).upload, queue.item(2).download) == (5, 6)


def test_usage_after_expire_at_with_nothing_queued_is_unbilled_and_ends_access_once() -> None:
    queue = active_queue(MONTHLY)
    late = MONTHLY_DUE + HOUR

    events = queue.record_usage(5, 6, late)
    events += queue.expire(1, ExpiryReason.TIME, late)  # the expiring consumer reacts
    events += queue.expire_due(1, late)  # the timer that was already on its way

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME),
        ExpiryUnscheduled(USER, 1),
        AllPackagesExpired(USER, late),
    ]
    assert queue.item(1).used == 0
    assert (queue.unbilled_upload, queue.unbilled_download) == (5, 6)
    assert queue.has_access is False


def test_timer_arriving_after_usage_expired_the_item_by_time_emits_nothing() -> None:
    queue = active_queue(MONTHLY, BASIC)
    late = MONTHLY_DUE + HOUR
    queue.record_usage(5, 6, late)
    queue.expire(1, ExpiryReason.TIME, late)

    events = queue.expire_due(1, late)

    assert events == []
    assert status_of(queue, 2) is ItemStatus.ACTIVE
    assert (queue.item(2).upload, queue.item(2).download) == (5, 6)


def test_adjust_quota_after_expire_at_consumes_the_item_by_time_and_records_the_delta() -> None:
    queue = active_queue(MONTHLY, BASIC)

    events = queue.adjust_quota(1, 500, MONTHLY_DUE + HOUR)

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME),
        ExpiryUnscheduled(USER, 1),
    ]
    assert queue.item(1).adjust_quota == 500
    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert queue.current() is None


def test_adjust_quota_exhausting_traffic_after_expire_at_expires_the_item_by_time() -> None:
    queue = active_queue(MONTHLY)
    queue.record_usage(0, 600, at(1))

    events = queue.adjust_quota(1, -500, MONTHLY_DUE)

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, MONTHLY_DUE, ExpiryReason.TIME),
        ExpiryUnscheduled(USER, 1),
    ]


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_in_queue_item_marks_it_cancelled_and_announces_only_the_cancel() -> None:
    queue = active_queue(BASIC, BASIC)

    events = queue.cancel(2, at(1), "refund", "ops@host")

    assert events == [PackageCancelled(USER, 2, BASIC.id, at(1), False, "refund", "ops@host")]
    assert status_of(queue, 2) is ItemStatus.CANCELLED
    assert status_of(queue, 1) is ItemStatus.ACTIVE


def test_cancel_active_item_activates_next_item() -> None:
    queue = active_queue(BASIC, BASIC)

    events = queue.cancel(1, at(1))

    assert events == [
        PackageCancelled(USER, 1, BASIC.id, at(1), True),
        PackageActivated(USER, 2, BASIC.id, at(1), 1_000, 1_000, None),
    ]
    assert status_of(queue, 1) is ItemStatus.CANCELLED


def test_cancel_active_timed_item_unschedules_its_time_expiry() -> None:
    queue = active_queue(MONTHLY, BASIC)

    events = queue.cancel(1, at(1))

    assert events[:2] == [
        PackageCancelled(USER, 1, MONTHLY.id, at(1), True),
        ExpiryUnscheduled(USER, 1),
    ]
    assert of_type(events, PackageActivated)[0].item_id == 2


def test_cancel_active_untimed_item_unschedules_nothing() -> None:
    queue = active_queue(BASIC, BASIC)

    events = queue.cancel(1, at(1))

    assert of_type(events, ExpiryUnscheduled) == []


def test_cancel_last_active_item_emits_all_packages_expired() -> None:
    queue = active_queue(BASIC)

    events = queue.cancel(1, at(1))

    assert events == [
        PackageCancelled(USER, 1, BASIC.id, at(1), True),
        AllPackagesExpired(USER, at(1)),
    ]
    assert queue.has_access is False


def test_cancel_cancelled_item_is_a_no_op() -> None:
    queue = active_queue(BASIC, BASIC)
    queue.cancel(1, at(1))

    events = queue.cancel(1, at(2))

    assert events == []
    assert status_of(queue, 1) is ItemStatus.CANCELLED
    assert status_of(queue, 2) is ItemStatus.ACTIVE


def test_cancel_consumed_item_raises_item_not_cancellable() -> None:
    queue = active_queue(BASIC, BASIC)
    queue.record_usage(0, 1_000, at(1))

    with pytest.raises(ItemNotCancellableError) as raised:
        queue.cancel(1, at(2))

    assert (raised.value.item_id, raised.value.status) == (1, "consumed")
    assert status_of(queue, 1) is ItemStatus.CONSUMED


def test_cancel_unknown_item_raises_item_not_found() -> None:
    queue = active_queue(BASIC)

    with pytest.raises(ItemNotFoundError):
        queue.cancel(42, at(1))


# -- adjust_quota -----------------------------------------------------------------------------


def test_adjust_quota_on_queued_item_changes_its_quota_without_events() -> None:
    queue = active_queue(BASIC, BASIC)

    events = queue.adjust_quota(2, -250, at(1))

    assert events == []
    assert queue.item(2).quota == 750
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE


def test_adjust_quota_below_zero_on_queued_item_keeps_it_queued() -> None:
    queue = active_queue(BASIC, BASIC)

    events = queue.adjust_quota(2, -5_000, at(1))

    assert events == []
    assert queue.item(2).quota == -4_000
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE


def test_adjust_quota_on_active_item_emits_new_remaining() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(0, 100, at(1))

    events = queue.adjust_quota(1, 50, at(2))

    assert events == [UsageRemaining(USER, 1, 950)]


def test_lowering_active_quota_below_usage_consumes_it_at_once() -> None:
    queue = active_queue(BASIC, BASIC)
    queue.record_usage(0, 600, at(1))

    events = queue.adjust_quota(1, -500, at(2))

    assert events == [PackageExpired(USER, 1, BASIC.id, at(2), ExpiryReason.USAGE)]
    assert status_of(queue, 1) is ItemStatus.CONSUMED
    assert queue.current() is None


def test_lowering_active_quota_exactly_to_usage_consumes_it() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(0, 600, at(1))

    events = queue.adjust_quota(1, -400, at(2))

    assert of_type(events, PackageExpired) != []
    assert status_of(queue, 1) is ItemStatus.CONSUMED


def test_lowering_timed_active_quota_below_usage_unschedules_its_time_expiry() -> None:
    queue = active_queue(MONTHLY)
    queue.record_usage(0, 600, at(1))

    events = queue.adjust_quota(1, -500, at(2))

    assert events == [
        PackageExpired(USER, 1, MONTHLY.id, at(2), ExpiryReason.USAGE),
        ExpiryUnscheduled(USER, 1),
    ]


def test_expire_after_quota_lowering_activates_next_item() -> None:
    queue = active_queue(BASIC, BASIC)
    queue.adjust_quota(1, -1_000, at(1))

    events = queue.expire(1, ExpiryReason.USAGE, at(2))

    assert [e.item_id for e in of_type(events, PackageActivated)] == [2]


def test_adjust_quota_on_consumed_item_raises_item_not_adjustable() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(0, 1_000, at(1))

    with pytest.raises(ItemNotAdjustableError) as raised:
        queue.adjust_quota(1, 500, at(2))

    assert (raised.value.item_id, raised.value.status) == (1, "consumed")
    assert queue.item(1).adjust_quota == 0


def test_adjust_quota_on_cancelled_item_raises_item_not_adjustable() -> None:
    queue = queue_with(BASIC)
    queue.cancel(1, T0)

    with pytest.raises(ItemNotAdjustableError):
        queue.adjust_quota(1, 500, at(1))


def test_adjust_quota_on_unknown_item_raises_item_not_found() -> None:
    queue = new_queue()

    with pytest.raises(ItemNotFoundError):
        queue.adjust_quota(1, 500, T0)


# -- access / AllPackagesExpired ------------------------------------------------------------


def test_all_packages_expired_is_emitted_only_once_per_loss_of_access() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(0, 1_000, at(1))
    events = queue.expire(1, ExpiryReason.USAGE, at(2))
    events += queue.advance(at(3))
    events += queue.expire(1, ExpiryReason.USAGE, at(4))

    assert of_type(events, AllPackagesExpired) == [AllPackagesExpired(USER, at(2))]


def test_access_is_regained_when_a_new_package_is_bought_after_all_expired() -> None:
    queue = active_queue(BASIC)
    queue.cancel(1, at(1))
    queue.purchase(BASIC, None, 1, [2], at(2))

    events = queue.advance(at(2))

    assert [e.item_id for e in of_type(events, PackageActivated)] == [2]
    assert queue.has_access is True


def test_cancel_of_an_active_item_whose_time_is_up_is_refused_like_a_consumed_one() -> None:
    queue = active_queue(MONTHLY, BASIC)
    with pytest.raises(ItemNotCancellableError, match="time is up"):
        queue.cancel(1, MONTHLY_DUE)
    assert status_of(queue, 1) is ItemStatus.ACTIVE  # the timer will expire it
    assert status_of(queue, 2) is ItemStatus.IN_QUEUE
