"""The billing-grade rules of the domain: orders bought once, terms fixed at purchase, retired
catalog entries, plans without a traffic or time limit, a current package that follows the
clock, and cancellation announced."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest

from domain.errors import PackageRetiredError, UnlimitedTrafficError
from domain.events import (
    AllPackagesExpired,
    DuplicateOrder,
    ExpiryScheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
    PackagesQueued,
    UsageRemaining,
)
from domain.model import ExpiryReason, ItemStatus, Package, Terms
from domain.queue import UserQueue
from tests.unit.queue_builders import BASIC, ORDER, T0, USER, at

OTHER_ORDER = UUID("00000000-0000-4000-8000-0000000000bb")
TIME_ONLY = Package(id=2, name="week", traffic_limit=None, duration=timedelta(days=7))
ZERO_TRAFFIC = Package(id=3, name="empty", traffic_limit=0, duration=timedelta(days=7))


def test_a_second_purchase_of_the_same_order_queues_nothing_and_names_the_first_items() -> None:
    queue = UserQueue(USER)
    queue.purchase(BASIC, ORDER, 2, [1, 2], T0)

    events = queue.purchase(BASIC, ORDER, 2, [3, 4], at(1))

    assert events == [DuplicateOrder(USER, ORDER, (1, 2))]
    assert sorted(i.id for i in queue.items) == [1, 2]


def test_an_order_the_caller_loaded_as_bought_is_a_duplicate_even_with_its_items_gone() -> None:
    queue = UserQueue(USER, orders={ORDER: (7,)})

    events = queue.purchase(BASIC, ORDER, 1, [8], T0)

    assert events == [DuplicateOrder(USER, ORDER, (7,))]
    assert queue.items == []


def test_purchases_without_an_order_or_with_different_orders_are_all_queued() -> None:
    queue = UserQueue(USER)

    queue.purchase(BASIC, None, 1, [1], T0)
    queue.purchase(BASIC, None, 1, [2], T0)
    queue.purchase(BASIC, ORDER, 1, [3], T0)
    events = queue.purchase(BASIC, OTHER_ORDER, 1, [4], T0)

    assert events == [PackagesQueued(USER, BASIC.id, (4,), T0)]
    assert queue.orders == {ORDER: (3,), OTHER_ORDER: (4,)}
    assert len(queue.items) == 4


def test_items_keep_the_terms_they_were_bought_with_when_the_catalog_changes() -> None:
    queue = UserQueue(USER)
    queue.purchase(BASIC, None, 1, [1], T0)
    edited = replace(BASIC, name="basic+", traffic_limit=5_000, duration=timedelta(hours=1))

    queue.purchase(edited, None, 1, [2], T0)
    queue.advance(T0)

    assert queue.item(1).terms == Terms(1, "basic", 1_000, None)
    assert queue.item(1).quota == 1_000
    assert queue.item(1).expire_at is None
    assert queue.item(2).terms == Terms(1, "basic+", 5_000, timedelta(hours=1))


def test_a_retired_package_refuses_new_purchases() -> None:
    queue = UserQueue(USER)
    retired = replace(BASIC, retired_at=T0)

    with pytest.raises(PackageRetiredError):
        queue.purchase(retired, None, 1, [1], T0)
    assert queue.items == []


def test_a_package_retired_later_still_sells_until_then() -> None:
    queue = UserQueue(USER)

    events = queue.purchase(replace(BASIC, retired_at=at(60)), None, 1, [1], T0)

    assert events == [PackagesQueued(USER, BASIC.id, (1,), T0)]


def test_a_resent_order_of_a_package_retired_since_is_still_just_a_duplicate() -> None:
    queue = UserQueue(USER)
    queue.purchase(BASIC, ORDER, 1, [1], T0)

    events = queue.purchase(replace(BASIC, retired_at=T0), ORDER, 1, [2], at(1))

    assert events == [DuplicateOrder(USER, ORDER, (1,))]


def test_a_package_with_neither_a_traffic_limit_nor_a_duration_cannot_be_made() -> None:
    with pytest.raises(ValueError, match="traffic limit, a duration or both"):
        Package(id=9, name="forever", traffic_limit=None, duration=None)


def test_an_unlimited_traffic_item_is_never_consumed_by_usage_only_by_time() -> None:
    queue = UserQueue(USER)
    queue.purchase(TIME_ONLY, None, 1, [1], T0)
    activated = queue.advance(T0)

    billed = queue.record_usage(2**40, 2**40, at(3600))
    due = queue.expire_due(1, T0 + timedelta(days=7))

    assert activated == [
        PackageActivated(USER, 1, TIME_ONLY.id, T0, None, None, T0 + timedelta(days=7)),
        ExpiryScheduled(USER, 1, TIME_ONLY.id, T0 + timedelta(days=7)),
    ]
    assert billed == [UsageRemaining(USER, 1, None)]
    assert due == [PackageExpired(USER, 1, TIME_ONLY.id, T0 + timedelta(days=7), ExpiryReason.TIME)]
    assert queue.item(1).used == 2**41


def test_the_quota_of_an_unlimited_traffic_item_cannot_be_adjusted() -> None:
    queue = UserQueue(USER)
    queue.purchase(TIME_ONLY, None, 1, [1], T0)

    with pytest.raises(UnlimitedTrafficError):
        queue.adjust_quota(1, -100, T0)
    assert queue.item(1).adjust_quota == 0


def test_a_zero_traffic_package_expires_at_activation_by_usage_and_access_ends() -> None:
    queue = UserQueue(USER)
    queue.purchase(ZERO_TRAFFIC, None, 1, [1], T0)

    events = queue.advance(T0)

    assert events == [
        PackageActivated(USER, 1, ZERO_TRAFFIC.id, T0, 0, 0, T0 + timedelta(days=7)),
        PackageExpired(USER, 1, ZERO_TRAFFIC.id, T0, ExpiryReason.USAGE),
        AllPackagesExpired(USER, T0),
    ]


def test_the_current_package_is_none_once_the_active_item_is_past_its_expire_at() -> None:
    queue = UserQueue(USER)
    queue.purchase(replace(BASIC, duration=timedelta(seconds=10)), None, 1, [1], T0)
    queue.advance(T0)

    assert queue.current_at(at(9)) is queue.item(1)
    assert queue.current_at(at(10)) is None
    assert queue.item(1).status is ItemStatus.ACTIVE  # stored: its timer has not run yet
    assert queue.item(1).status_at(at(10)) is ItemStatus.CONSUMED
    assert queue.item(1).status_at(at(9)) is ItemStatus.ACTIVE


def test_a_cancel_carries_its_reason_and_operator_and_a_repeat_announces_nothing() -> None:
    queue = UserQueue(USER)
    queue.purchase(BASIC, None, 2, [1, 2], T0)
    queue.advance(T0)

    first = queue.cancel(2, at(1), "refund #12", "ops@host")
    again = queue.cancel(2, at(2), "refund #12", "ops@host")

    assert first == [PackageCancelled(USER, 2, BASIC.id, at(1), False, "refund #12", "ops@host")]
    assert again == []
