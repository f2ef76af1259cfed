"""Example-based tests of the `UserQueue` aggregate (domain/queue.py), one behaviour per test:
operators' commands (cancel, adjust_quota), and access with the end of the last package."""

from __future__ import annotations

import pytest

from domain.errors import (
    ItemNotAdjustableError,
    ItemNotCancellableError,
    ItemNotFoundError,
)
from domain.events import (
    AllPackagesExpired,
    ExpiryUnscheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
    UsageRemaining,
)
from domain.model import ExpiryReason, ItemStatus
from tests.unit.queue_builders import (
    BASIC,
    MONTHLY,
    MONTHLY_DUE,
    T0,
    USER,
    active_queue,
    at,
    new_queue,
    of_type,
    queue_with,
    status_of,
)

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
