"""Example-based tests of the `UserQueue` aggregate (domain/queue.py), one behaviour per test:
purchases, amounts, and activation in purchase order."""

from __future__ import annotations

import pytest

from domain.errors import (
    MAX_AMOUNT,
    InvalidAmountError,
)
from domain.events import (
    PackageActivated,
    PackagesQueued,
)
from domain.model import ItemStatus
from tests.unit.queue_builders import (
    BASIC,
    ORDER,
    T0,
    USER,
    active_queue,
    at,
    new_queue,
    of_type,
    queue_with,
    status_of,
)

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
