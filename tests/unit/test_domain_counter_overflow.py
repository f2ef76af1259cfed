"""Counters that Postgres stores as bigint never overflow: a usage record or a quota change that
would take one beyond 2^63-1 (or below -2^63), on its own or summed with what is stored, is a
broken domain rule (CounterOverflowError, a DomainError: `domain_rule`), raised before anything
changes in memory. Examples first, then properties over arbitrary stored counters and deltas.
"""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from domain import counters
from domain.errors import MAX_COUNTER, MIN_COUNTER, CounterOverflowError, DomainError
from domain.events import UsageRemaining
from domain.model import ItemStatus, Package, QueueItem, Terms
from domain.queue import UserQueue
from tests.unit.queue_builders import BASIC, T0, USER, active_queue, at, new_queue, queue_with

BIG = 2**62
"""The largest traffic one message may carry (events.models.Bytes): two of them overflow."""

# -- examples -------------------------------------------------------------------------------


def test_a_second_usage_of_2_62_for_a_user_without_items_is_refused_and_changes_nothing() -> None:
    queue = new_queue()
    queue.record_usage(BIG, 0, T0)

    with pytest.raises(CounterOverflowError, match="unbilled upload would be 9223372036854775808"):
        queue.record_usage(BIG, 0, at(1))

    assert (queue.unbilled_upload, queue.unbilled_download) == (BIG, 0)
    queue.record_usage(5, 0, at(2))  # the user's next ordinary record is billed as usual
    assert queue.unbilled_upload == BIG + 5


def test_the_overflow_error_is_a_domain_error_naming_the_counter_and_what_is_stored() -> None:
    queue = new_queue()
    queue.record_usage(0, MAX_COUNTER, T0)

    with pytest.raises(DomainError) as refused:
        queue.record_usage(0, 1, at(1))

    assert isinstance(refused.value, CounterOverflowError)
    assert refused.value.counter == "unbilled download"
    assert (refused.value.value, refused.value.stored) == (MAX_COUNTER + 1, MAX_COUNTER)
    assert "nothing changed" in str(refused.value)


def test_a_single_usage_value_beyond_a_bigint_is_refused_on_its_own() -> None:
    queue = active_queue(BASIC)

    with pytest.raises(CounterOverflowError, match="item 1 download"):
        queue.record_usage(0, 2**63, at(1))

    assert queue == active_queue(BASIC)


def test_usage_that_fills_a_counter_to_exactly_the_largest_bigint_is_billed() -> None:
    queue = new_queue()
    queue.record_usage(BIG, 0, T0)
    queue.record_usage(BIG - 1, 0, at(1))
    assert queue.unbilled_upload == MAX_COUNTER


def test_upload_and_download_that_each_fit_but_together_overflow_are_refused() -> None:
    # Unbilled traffic all moves onto the next item activated, as its used traffic.
    queue = new_queue()
    queue.record_usage(BIG, 0, T0)

    with pytest.raises(CounterOverflowError, match=r"unbilled traffic \(upload \+ download\)"):
        queue.record_usage(0, BIG, at(1))

    assert (queue.unbilled_upload, queue.unbilled_download) == (BIG, 0)


def test_usage_that_would_overflow_the_item_it_activates_leaves_that_item_queued() -> None:
    # The unbilled upload is carried onto the queued item as it activates; the new download
    # lands there too and their sum overflows: nothing moves, nothing activates.
    queue = new_queue()
    queue.record_usage(BIG, 0, T0)
    queue.purchase(Package(id=9, name="huge", traffic_limit=MAX_COUNTER), None, 1, [1], at(1))
    before = copy.deepcopy(queue)

    with pytest.raises(CounterOverflowError, match=r"item 1 used traffic \(upload \+ download\)"):
        queue.record_usage(0, BIG, at(2))

    assert queue == before
    assert queue.item(1).status is ItemStatus.IN_QUEUE


def test_usage_billed_to_a_full_active_item_is_refused_when_its_used_traffic_would_overflow() -> (
    None
):
    queue = queue_with(Package(id=9, name="huge", traffic_limit=MAX_COUNTER))
    queue.advance(T0)
    queue.record_usage(BIG, BIG - 2, at(1))  # used: MAX_COUNTER - 1, still active

    with pytest.raises(CounterOverflowError, match="item 1 used traffic"):
        queue.record_usage(1, 1, at(2))

    assert queue.item(1).used == MAX_COUNTER - 1
    queue.record_usage(1, 0, at(3))  # exactly full: used up
    assert queue.item(1).status is ItemStatus.CONSUMED


def test_a_quota_raised_by_2_62_twice_is_refused_the_second_time_and_the_first_raise_stays() -> (
    None
):
    queue = queue_with(BASIC)
    queue.adjust_quota(1, BIG, T0)

    with pytest.raises(CounterOverflowError, match="item 1 adjust_quota would be"):
        queue.adjust_quota(1, BIG, at(1))

    assert queue.item(1).adjust_quota == BIG


def test_a_quota_lowered_below_the_smallest_bigint_is_refused() -> None:
    queue = queue_with(BASIC)
    queue.adjust_quota(1, -BIG, T0)
    queue.adjust_quota(1, -BIG, T0)  # exactly MIN_COUNTER: still a bigint

    with pytest.raises(CounterOverflowError, match="item 1 adjust_quota"):
        queue.adjust_quota(1, -1, at(1))

    assert queue.item(1).adjust_quota == MIN_COUNTER


def test_a_quota_whose_limit_plus_adjustment_would_exceed_a_bigint_is_refused() -> None:
    queue = active_queue(BASIC)  # traffic_limit 1000
    queue.adjust_quota(1, MAX_COUNTER - 1_000, T0)
    assert queue.item(1).quota == MAX_COUNTER

    with pytest.raises(CounterOverflowError, match=r"quota \(traffic_limit \+ adjust_quota\)"):
        queue.adjust_quota(1, 1, at(1))

    assert queue.item(1).quota == MAX_COUNTER
    assert queue.record_usage(1, 0, at(2)) == [UsageRemaining(USER, 1, MAX_COUNTER - 1)]


# -- properties -----------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, database=None)
NOW = T0 + timedelta(hours=1)
EDGES = [0, 1, BIG - 1, BIG, MAX_COUNTER - 1, MAX_COUNTER]


def amounts(top: int) -> st.SearchStrategy[int]:
    """Non-negative amounts up to `top`, often at a bigint's edges."""
    edges = [e for e in EDGES if e <= top]
    return st.one_of(
        st.sampled_from(edges), st.integers(0, top), st.integers(max(top - 1_000, 0), top)
    )


DELTAS = st.one_of(st.integers(-(2**64), 2**64), st.sampled_from([-BIG, BIG, MIN_COUNTER]))
USAGE = st.one_of(amounts(MAX_COUNTER), st.integers(MAX_COUNTER, 2**64))


@st.composite
def split(draw: st.DrawFn, total: int) -> tuple[int, int]:
    """Two non-negative counters whose sum is at most `total`."""
    both = draw(amounts(total))
    first = draw(st.integers(0, both))
    return first, both - first


@st.composite
def items(draw: st.DrawFn, item_id: int, status: ItemStatus) -> QueueItem:
    """An item whose every counter is what the domain could have stored."""
    limit = draw(st.one_of(st.none(), amounts(MAX_COUNTER)))
    duration = draw(st.sampled_from([None, timedelta(0), timedelta(minutes=30), timedelta(days=1)]))
    if limit is None and duration is None:
        duration = timedelta(days=1)
    adjust = 0 if limit is None else draw(st.integers(MIN_COUNTER, MAX_COUNTER - limit))
    upload, download = draw(split(MAX_COUNTER))
    created = T0 + timedelta(seconds=item_id)
    activated = created if status is not ItemStatus.IN_QUEUE else None
    expire_at = activated + duration if activated is not None and duration is not None else None
    return QueueItem(
        id=item_id,
        user_id=USER,
        terms=Terms(item_id, f"plan {item_id}", limit, duration),
        by_order=None,
        status=status,
        created_at=created,
        activated_at=activated,
        upload=upload,
        download=download,
        adjust_quota=adjust,
        expire_at=expire_at,
    )


@st.composite
def queues(draw: st.DrawFn) -> UserQueue:
    """A user's queue as loaded: at most one active item, some queued, maybe a consumed one,
    unbilled usage, every counter within a bigint (and each sum pkgq makes of them too)."""
    statuses = [ItemStatus.ACTIVE] if draw(st.booleans()) else []
    statuses += [ItemStatus.IN_QUEUE] * draw(st.integers(0, 3))
    statuses += [ItemStatus.CONSUMED] if draw(st.booleans()) else []
    loaded = [draw(items(i, status)) for i, status in enumerate(statuses, start=1)]
    upload, download = draw(split(MAX_COUNTER))
    return UserQueue(
        USER,
        loaded,
        unbilled_upload=upload,
        unbilled_download=download,
        has_access=bool(statuses and statuses[0] is ItemStatus.ACTIVE),
    )


def assert_every_counter_fits(queue: UserQueue) -> None:
    for counter, value in counters.of(queue).items():
        assert MIN_COUNTER <= value <= MAX_COUNTER, f"{counter} = {value}"
    traffic = [queue.unbilled_upload, queue.unbilled_download]
    traffic += [n for item in queue.items for n in (item.upload, item.download)]
    assert all(0 <= n <= MAX_COUNTER for n in traffic)


def overflows(queue: UserQueue) -> bool:
    return any(not MIN_COUNTER <= v <= MAX_COUNTER for v in counters.of(queue).values())


@PROPERTY_SETTINGS
@given(queue=queues(), upload=USAGE, download=USAGE, minutes=st.integers(0, 24 * 60 * 2))
@example(
    queue=UserQueue(USER, unbilled_upload=BIG), upload=BIG, download=0, minutes=0
)  # the live bug: two usage records of 2^62
def test_usage_keeps_every_counter_within_a_bigint_or_is_refused_and_changes_nothing(
    queue: UserQueue, upload: int, download: int, minutes: int
) -> None:
    now = NOW + timedelta(minutes=minutes)
    before, objects = copy.deepcopy(queue), list(queue.items)
    unbounded = copy.deepcopy(queue)
    unbounded_events, _ = unbounded._bill(upload, download, now, None)  # unchecked

    if overflows(unbounded):
        with pytest.raises(CounterOverflowError) as refused:
            queue.record_usage(upload, download, now)
        assert not MIN_COUNTER <= refused.value.value <= MAX_COUNTER
        assert queue == before
        assert all(a is b for a, b in zip(queue.items, objects, strict=True))
    else:
        events = queue.record_usage(upload, download, now)
        assert_every_counter_fits(queue)
        assert (queue, events) == (unbounded, unbounded_events)


@PROPERTY_SETTINGS
@given(queue=queues(), pick=st.integers(0, 5), delta=DELTAS)
@example(
    queue=UserQueue(
        USER,
        [QueueItem(1, USER, BASIC.terms(), None, ItemStatus.IN_QUEUE, T0, adjust_quota=BIG)],
    ),
    pick=0,
    delta=BIG,
)  # the live bug: a quota raised by 2^62 twice
def test_a_quota_change_keeps_every_counter_within_a_bigint_or_is_refused_and_changes_nothing(
    queue: UserQueue, pick: int, delta: int
) -> None:
    if not queue.items:
        return
    item = queue.items[pick % len(queue.items)]
    before, objects = copy.deepcopy(queue), list(queue.items)
    limit, adjust = item.terms.traffic_limit, item.adjust_quota
    adjustable = limit is not None and item.status in (ItemStatus.IN_QUEUE, ItemStatus.ACTIVE)
    fits = limit is None or (
        MIN_COUNTER <= adjust + delta <= MAX_COUNTER and limit + adjust + delta <= MAX_COUNTER
    )

    if adjustable and fits:
        queue.adjust_quota(item.id, delta, NOW)
        assert_every_counter_fits(queue)
        assert queue.item(item.id).adjust_quota == adjust + delta
        return
    # Refused: a counter would overflow, or the item cannot be adjusted (as before).
    with pytest.raises(CounterOverflowError if adjustable else DomainError) as refused:
        queue.adjust_quota(item.id, delta, NOW)
    if isinstance(refused.value, CounterOverflowError):
        assert not MIN_COUNTER <= refused.value.value <= MAX_COUNTER
    assert queue == before
    assert all(a is b for a, b in zip(queue.items, objects, strict=True))
