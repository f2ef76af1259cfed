"""A user holds at most `max_queued_items` live items (in_queue and active; PKGQ_MAX_QUEUED_ITEMS,
1,000 by default): a purchase that would take them beyond it is a broken domain rule
(QueueFullError, a DomainError: `domain_rule`), raised before anything changes. Examples first,
then a property over arbitrary queues, caps, amounts and orders.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from uuid import UUID

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from domain.errors import (
    MAX_AMOUNT,
    MAX_QUEUED_ITEMS,
    DomainError,
    InvalidAmountError,
    PackageRetiredError,
    QueueFullError,
)
from domain.events import DomainEvent, DuplicateOrder, PackagesQueued
from domain.model import ItemStatus, QueueItem
from domain.queue import UserQueue
from tests.unit.queue_builders import BASIC, ORDER, T0, USER, at, new_queue

LIVE = (ItemStatus.IN_QUEUE, ItemStatus.ACTIVE)


def _ids(first: int, amount: int) -> list[int]:
    return list(range(first, first + max(amount, 0)))


def _attempt(purchase: Callable[[], list[DomainEvent]]) -> list[DomainEvent] | DomainError:
    """The purchase's events, or the domain error it was refused with."""
    try:
        return purchase()
    except DomainError as refused:
        return refused


def _live(queue: UserQueue) -> int:
    return sum(1 for i in queue.items if i.status in LIVE)


# -- examples -------------------------------------------------------------------------------


def test_purchases_up_to_the_default_cap_of_1000_are_queued_and_the_next_item_is_refused() -> None:
    queue = new_queue()
    queue.purchase(BASIC, None, 600, _ids(1, 600), T0)
    queue.purchase(BASIC, None, 400, _ids(601, 400), at(1))
    assert queue.live() == MAX_QUEUED_ITEMS == 1000
    before = copy.deepcopy(queue)

    with pytest.raises(QueueFullError) as refused:
        queue.purchase(BASIC, None, 1, [1001], at(2))

    assert queue == before
    assert (refused.value.live, refused.value.amount, refused.value.cap) == (1000, 1, 1000)
    assert "would make 1001, beyond the 1000 one user may hold" in str(refused.value)
    assert isinstance(refused.value, DomainError)  # buried as domain_rule, holding nothing


def test_a_purchase_that_would_overshoot_the_cap_is_refused_whole_not_cut_to_fit() -> None:
    queue = new_queue()
    queue.purchase(BASIC, None, 3, [1, 2, 3], T0, max_queued_items=5)

    with pytest.raises(QueueFullError, match="holds 3 live item"):
        queue.purchase(BASIC, None, 3, [4, 5, 6], at(1), max_queued_items=5)

    assert [i.id for i in queue.items] == [1, 2, 3]
    events = queue.purchase(BASIC, None, 2, [7, 8], at(2), max_queued_items=5)
    assert events == [PackagesQueued(USER, BASIC.id, (7, 8), at(2))]  # exactly at the cap
    assert queue.live() == 5


def test_consumed_and_cancelled_items_leave_room_under_the_cap() -> None:
    queue = new_queue()
    queue.purchase(BASIC, None, 2, [1, 2], T0, max_queued_items=2)
    queue.advance(T0)
    queue.record_usage(BASIC.traffic_limit or 0, 0, at(1))  # item 1 used up, item 2 active
    queue.cancel(2, at(2))
    assert [i.status for i in queue.items] == [ItemStatus.CONSUMED, ItemStatus.CANCELLED]

    queue.purchase(BASIC, None, 2, [3, 4], at(3), max_queued_items=2)

    assert queue.live() == 2


def test_the_active_item_counts_towards_the_cap() -> None:
    queue = new_queue()
    queue.purchase(BASIC, None, 2, [1, 2], T0, max_queued_items=2)
    queue.advance(T0)
    assert queue.current() is not None

    with pytest.raises(QueueFullError, match="holds 2 live item"):
        queue.purchase(BASIC, None, 1, [3], at(1), max_queued_items=2)


def test_a_resent_order_at_the_cap_is_still_a_duplicate_not_a_refusal() -> None:
    queue = new_queue()
    queue.purchase(BASIC, ORDER, 2, [1, 2], T0, max_queued_items=2)

    events = queue.purchase(BASIC, ORDER, 2, [3, 4], at(1), max_queued_items=2)

    assert events == [DuplicateOrder(USER, ORDER, (1, 2))]
    assert queue.live() == 2


def test_a_queue_over_a_lowered_cap_takes_no_purchase_until_it_is_back_under() -> None:
    queue = new_queue()
    queue.purchase(BASIC, None, 5, _ids(1, 5), T0)  # bought under the default cap

    with pytest.raises(QueueFullError, match="beyond the 3 one user may hold"):
        queue.purchase(BASIC, None, 1, [6], at(1), max_queued_items=3)

    for item_id in (1, 2, 3):
        queue.cancel(item_id, at(2))
    queue.purchase(BASIC, None, 1, [6], at(3), max_queued_items=3)
    assert queue.live() == 3


# -- properties -----------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, database=None)
BOUGHT = UUID("00000000-0000-4000-8000-0000000000bb")
"""The order every generated queue bought already: buying it again is a duplicate."""
NEW_ORDER = UUID("00000000-0000-4000-8000-0000000000cc")


@st.composite
def queues(draw: st.DrawFn) -> UserQueue:
    """A user's queue as a batch loads it: up to one active item, any number queued (up to
    somewhat beyond the largest cap drawn, as a lowered cap leaves it), and items gone
    (consumed, cancelled) that a command may have loaded too."""
    active = draw(st.booleans())
    queued = draw(st.integers(0, 1_300))
    gone = draw(st.lists(st.sampled_from([ItemStatus.CONSUMED, ItemStatus.CANCELLED]), max_size=5))
    statuses = [*gone, *([ItemStatus.ACTIVE] if active else []), *[ItemStatus.IN_QUEUE] * queued]
    items = [
        QueueItem(
            id=n,
            user_id=USER,
            terms=BASIC.terms(),
            by_order=None,
            status=status,
            created_at=T0 + timedelta(microseconds=n),
            activated_at=T0 if status is not ItemStatus.IN_QUEUE else None,
        )
        for n, status in enumerate(statuses, start=1)
    ]
    return UserQueue(USER, items=items, has_access=active, orders={BOUGHT: (1,)})


CAPS = st.one_of(st.none(), st.integers(1, 1_200), st.sampled_from([1, MAX_AMOUNT]))
"""None: the default (MAX_QUEUED_ITEMS)."""
AMOUNTS = st.one_of(
    st.integers(1, MAX_AMOUNT), st.sampled_from([-1, 0, 1, MAX_AMOUNT, MAX_AMOUNT + 1])
)


@PROPERTY_SETTINGS
@given(
    queue=queues(),
    cap=CAPS,
    amount=AMOUNTS,
    order=st.sampled_from([None, BOUGHT, NEW_ORDER]),
    retired=st.booleans(),
)
@example(
    queue=UserQueue(USER, orders={BOUGHT: (1,)}),
    cap=None,
    amount=MAX_AMOUNT,
    order=None,
    retired=False,
)
def test_a_purchase_either_queues_within_the_cap_or_is_refused_and_changes_nothing(
    queue: UserQueue, cap: int | None, amount: int, order: UUID | None, retired: bool
) -> None:
    limit = MAX_QUEUED_ITEMS if cap is None else cap
    package = replace(BASIC, retired_at=T0) if retired else BASIC
    # The queue's own copy (its items and orders copied; what they hold is immutable to the
    # type checker): a deep copy of up to 1,300 items made this test take 43 s of the suite.
    before = queue.copy()
    live = _live(queue)
    ids = _ids(10_000, amount)
    kwargs = {} if cap is None else {"max_queued_items": cap}

    outcome = _attempt(lambda: queue.purchase(package, order, amount, ids, at(1), **kwargs))

    if isinstance(outcome, DomainError):
        assert queue == before, "a refused purchase changed the queue"
        if isinstance(outcome, QueueFullError):
            assert live + amount > limit
            assert (outcome.live, outcome.amount, outcome.cap) == (live, amount, limit)
        else:
            assert isinstance(outcome, InvalidAmountError | PackageRetiredError)
        return
    events = outcome
    if order == BOUGHT:  # a resend of an order queues nothing, full or not
        assert events == [DuplicateOrder(USER, BOUGHT, (1,))]
        assert queue == before
        return
    assert _live(queue) == live + amount <= limit
    assert events == [PackagesQueued(USER, BASIC.id, tuple(ids), at(1))]


@PROPERTY_SETTINGS
@given(queue=queues(), cap=st.integers(1, 1_200), amount=st.integers(1, MAX_AMOUNT))
def test_a_purchase_is_refused_for_the_cap_exactly_when_it_would_end_beyond_it(
    queue: UserQueue, cap: int, amount: int
) -> None:
    fits = _live(queue) + amount <= cap
    outcome = _attempt(
        lambda: queue.purchase(
            BASIC, None, amount, _ids(10_000, amount), at(1), max_queued_items=cap
        )
    )
    assert isinstance(outcome, QueueFullError) is not fits
