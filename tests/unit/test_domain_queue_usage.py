"""Example-based tests of the `UserQueue` aggregate (domain/queue.py), one behaviour per test:
usage, and items exhausted at activation."""

from __future__ import annotations

import pytest

from domain.errors import (
    NegativeUsageError,
)
from domain.events import (
    AllPackagesExpired,
    ExpiryScheduled,
    PackageActivated,
    PackageExpired,
    UsageRemaining,
)
from domain.model import ExpiryReason, ItemStatus, Package
from tests.unit.queue_builders import (
    BASIC,
    INSTANT,
    T0,
    USER,
    active_queue,
    at,
    new_queue,
    of_type,
    queue_with,
    status_of,
)

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
