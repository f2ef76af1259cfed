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

from hypothesis import given, settings

from tests.unit.queue_checks import (
    check_due_timers_expire_by_time_without_advancing,
    check_each_transition_announced_exactly_once,
    check_no_traffic_for_an_item_whose_time_is_up,
    check_one_active_item_and_fifo_activation,
    check_stale_duplicate_and_early_triggers_change_nothing,
    check_state_quota_and_outcomes_match_the_reference,
    check_traffic_conserved_and_billed_like_the_reference,
)
from tests.unit.queue_driver import run
from tests.unit.queue_operations import Op, operations

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, database=None)


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
