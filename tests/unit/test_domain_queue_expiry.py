"""Example-based tests of the `UserQueue` aggregate (domain/queue.py), one behaviour per test:
time expiry, the expiry timer, and commands that arrive after the time is up but before the
timer fired."""

from __future__ import annotations

from datetime import timedelta

import pytest

from domain.errors import (
    ItemNotFoundError,
)
from domain.events import (
    AllPackagesExpired,
    ExpiryScheduled,
    ExpiryUnscheduled,
    PackageActivated,
    PackageExpired,
    UsageRemaining,
)
from domain.model import ExpiryReason, ItemStatus
from tests.unit.queue_builders import (
    BASIC,
    HOUR,
    MONTHLY,
    MONTHLY_DUE,
    T0,
    USER,
    active_queue,
    at,
    of_type,
    queue_with,
    status_of,
)

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
