"""Fixed operation sequences through `UserQueue` and the reference model (the model and the
driver: tests/unit/test_domain_queue_properties.py), each known to reach paths random sequences
reach rarely, with every property checked on it: a late relay (usage after an item's expire_at
with its timer pending; timers in flight, stale, duplicated and early), resent orders, catalog
edits and plans without a limit, and late usage billed to the item it happened in.
"""

from __future__ import annotations

from domain.events import PackageExpired
from domain.model import ExpiryReason
from tests.unit.queue_checks import (
    _late,
    check_due_timers_expire_by_time_without_advancing,
    check_each_transition_announced_exactly_once,
    check_no_traffic_for_an_item_whose_time_is_up,
    check_one_active_item_and_fifo_activation,
    check_stale_duplicate_and_early_triggers_change_nothing,
    check_state_quota_and_outcomes_match_the_reference,
    check_traffic_conserved_and_billed_like_the_reference,
)
from tests.unit.queue_driver import run
from tests.unit.queue_operations import (
    Adjust,
    AdjustActive,
    Cancel,
    DuplicateTimer,
    EarlyTimer,
    EditCatalog,
    Lag,
    LagPastExpiry,
    Op,
    Purchase,
    Rebuy,
    Replay,
    StaleTimer,
    StaleTrigger,
    Tick,
    Usage,
    UsageRacingTimers,
)

LATE_RELAY: list[Op] = [
    Purchase(limit=300, duration=10, amount=2),
    Lag(seconds=15),  # item 1's time is up at T0+10; its timer is still pending
    Usage(upload=20, download=30),  # ends item 1 by time, billed to item 2
    Tick(seconds=0),  # item 1's timer was already due: it is on its way and fires now
    Purchase(limit=300, duration=None, amount=1),
    Tick(seconds=20, twice=True),  # item 2's timer fires (twice) and item 3 activates
    DuplicateTimer(pick=0),
    Purchase(limit=300, duration=5, amount=1),
    Cancel(pick=2),  # item 3: item 4 activates
    LagPastExpiry(extra=0),
    Adjust(pick=3, delta=1_000),  # item 4's time is up: ends by time, the delta is kept
    Usage(upload=1, download=1),  # nothing queued: unbilled
    Purchase(limit=300, duration=5, amount=1),
    UsageRacingTimers(seconds=5, usage=Usage(upload=2, download=3)),  # item 5 ends by time
    StaleTimer(pick=0),
    StaleTimer(pick=1),
    StaleTrigger(pick=0),
    Purchase(limit=300, duration=100, amount=1),
    EarlyTimer(),
    LagPastExpiry(extra=0),
    Usage(upload=1, download=1),  # exactly at item 6's expire_at: ends it, nothing queued
    Replay(pick=0),
]


def test_late_relay_sequence_reaches_usage_after_expire_at_and_stale_timers() -> None:
    trace = run(LATE_RELAY)

    time_ups = [
        item_id
        for billing in trace.billings
        for item_id in billing.before.active_ids()
        if billing.before.items[item_id].time_is_up(billing.now)
    ]
    assert time_ups == [1, 6], "usage at or after expire_at was not reached"
    assert {timer.kind for timer in trace.timers} == {
        "due",
        "in_flight",
        "stale",
        "duplicate",
        "early",
    }
    final = trace.steps[-1].after
    assert (final.items[4].status, final.items[4].adjust) == ("consumed", 1_000)
    assert (final.items[6].status, final.unbilled, final.access) == ("consumed", (1, 1), False)
    assert [step.outcome for step in trace.steps].count("skipped") == 0
    check_one_active_item_and_fifo_activation(trace)
    check_traffic_conserved_and_billed_like_the_reference(trace)
    check_no_traffic_for_an_item_whose_time_is_up(trace)
    check_state_quota_and_outcomes_match_the_reference(trace)
    check_each_transition_announced_exactly_once(trace)
    check_due_timers_expire_by_time_without_advancing(trace)
    check_stale_duplicate_and_early_triggers_change_nothing(trace)


TERMS_AND_ORDERS: list[Op] = [
    Purchase(limit=None, duration=30, amount=1, order=1),  # item 1: time only, active
    Purchase(limit=500, duration=None, amount=1, order=1),  # the same order resent: nothing
    Purchase(limit=500, duration=None, amount=1, order=2),  # item 3: traffic only
    EditCatalog(limit=50, duration=5),  # item 3 keeps 500 bytes and no expiry
    Rebuy(amount=1, order=None),  # item 4: bought on the edited terms
    Usage(upload=4_000, download=4_000),  # unlimited item 1 takes it all and stays active
    AdjustActive(delta=-10),  # refused: unlimited traffic
    Purchase(limit=0, duration=10, amount=1, order=3),  # item 5: zero traffic
    LagPastExpiry(extra=0),  # item 1's time is up; GetCurrentPackage says none
    Tick(seconds=0),  # its timer: item 3 activates
    Usage(upload=300, download=200),  # item 3 used up at its own 500, item 4 activates
    Cancel(pick=3),  # item 5, queued: announced, not active
    Rebuy(amount=1, order=2),  # resent again: nothing
    Tick(seconds=5),  # item 4's 5 s are up: nothing left, access ends
]


def test_resent_orders_catalog_edits_and_plans_without_a_limit_match_the_reference() -> None:
    trace = run(TERMS_AND_ORDERS)

    outcomes = [step.outcome for step in trace.steps]
    assert outcomes.count("duplicate") == 2
    assert outcomes[6] == "unlimited"
    assert trace.steps[8].current is None
    assert trace.steps[8].before.active_ids() == [1]
    final = trace.steps[-1].after
    assert final.items[1].quota is None
    assert final.items[1].upload == 4_000
    assert (final.items[3].quota, final.items[3].expire_at) == (500, None)
    assert final.items[4].quota == 50
    assert [i for i, s in final.items.items() if s.status == "cancelled"] == [5]
    assert sorted(final.items) == [1, 3, 4, 5]  # id 2 went to the resent order, unused
    assert final.access is False
    check_one_active_item_and_fifo_activation(trace)
    check_traffic_conserved_and_billed_like_the_reference(trace)
    check_no_traffic_for_an_item_whose_time_is_up(trace)
    check_state_quota_and_outcomes_match_the_reference(trace)
    check_each_transition_announced_exactly_once(trace)
    check_due_timers_expire_by_time_without_advancing(trace)
    check_stale_duplicate_and_early_triggers_change_nothing(trace)


LATE_USAGE: list[Op] = [
    Purchase(limit=300, duration=10, amount=3),
    Lag(seconds=15),  # item 1's time is up at T0+10; its timer is still pending
    Usage(upload=20, download=30, recorded_before=8),  # happened at T0+7: item 1's own
    Tick(seconds=0),  # item 1's timer was on its way: it changes nothing now
    LagPastExpiry(extra=3),  # item 2's time is up; its timer pending
    Usage(upload=5, download=5, recorded_before=1),  # happened after its expire_at: item 3's
    LagPastExpiry(extra=2),  # item 3's time is up; its timer pending
    Usage(upload=200, download=200, recorded_before=5),  # item 3's own, and it uses it up
    Usage(upload=1, download=1, recorded_before=100),  # long ago, but item 3 has run out
]


def test_late_usage_is_billed_to_the_item_it_happened_in_until_its_expiry_is_applied() -> None:
    trace = run(LATE_USAGE)
    late = [b.ref_target for b in trace.billings if _late(b, b.ref_target)]
    assert late == [1, 3], "late usage of an item whose expiry was pending was not reached"
    targets = [b.ref_target for b in trace.billings]
    assert targets == [1, 3, 3, None]
    expired = [(e.item_id, e.reason) for e in trace.events() if isinstance(e, PackageExpired)]
    assert expired == [
        (1, ExpiryReason.TIME),
        (2, ExpiryReason.TIME),
        (3, ExpiryReason.USAGE),
    ]
    for check in (
        check_traffic_conserved_and_billed_like_the_reference,
        check_no_traffic_for_an_item_whose_time_is_up,
        check_state_quota_and_outcomes_match_the_reference,
        check_each_transition_announced_exactly_once,
    ):
        check(trace)
