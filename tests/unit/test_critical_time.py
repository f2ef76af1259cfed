"""The time a user waits, without I/O: where it starts (a pkgq copy's mark, the publisher's
timestamp, pkgq's first sight), how a skewed clock is bounded, the console's approximate
quantiles, and the purchase's time carried along its follow-ups to the grant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from prometheus_client import REGISTRY

from consumers.unit_of_work import HandlerContext, UnitOfWork, transition
from domain.model import Package
from events.decoding import RawDelivery
from events.envelope import H_ORIGIN_TS, H_SINCE, H_SINCE_CLOCK, Envelope
from events.routes import ALL_EXPIRED, PACKAGE_ACTIVATE, PACKAGE_PURCHASE, PACKAGE_QUEUING
from infra.observability import (
    CRITICAL_BOUNDS,
    FIRST_SIGHT,
    MAX_CRITICAL_S,
    PUBLISHER,
    bounded,
    critical_bucket,
    since_of,
)
from infra.postgres.batch_read import UserRow, loaded_queue
from infra.postgres.trends import quantile

USER = UUID("00000000-0000-4000-8000-00000000000a")
T0 = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
SEEN = T0 + timedelta(seconds=5)
MONTHLY = Package(id=2, name="monthly", traffic_limit=100, duration=timedelta(days=30))


def raw(timestamp: datetime | None = None, **headers: str) -> RawDelivery:
    return RawDelivery(b"{}", "m", "t", "application/json", timestamp, headers)


def envelope(message_type: str = "t", seen: datetime = SEEN) -> Envelope:
    return Envelope(UUID(int=1), message_type, 1, USER, seq=1, timestamp=seen)


def skew(direction: str) -> float:
    labels = {"route": "telecom.test", "direction": direction}
    return REGISTRY.get_sample_value("pkgq_publisher_clock_skew_total", labels) or 0.0


def test_the_wait_starts_at_the_publishers_timestamp_else_at_pkgqs_first_sight() -> None:
    assert since_of(raw(T0), envelope()) == (T0, PUBLISHER)
    assert since_of(raw(None), envelope()) == (SEEN, FIRST_SIGHT)


def test_pkgqs_own_copy_keeps_the_start_and_clock_of_the_first_publication() -> None:
    retry_published = T0 + timedelta(minutes=3)
    copy = raw(retry_published, **{H_SINCE: T0.isoformat(), H_SINCE_CLOCK: FIRST_SIGHT})
    assert since_of(copy, envelope()) == (T0, FIRST_SIGHT)
    unreadable = raw(retry_published, **{H_SINCE: "yesterday"})
    assert since_of(unreadable, envelope()) == (retry_published, PUBLISHER)


def test_a_clock_ahead_counts_as_no_wait_and_one_far_behind_as_a_day_both_counted() -> None:
    ahead, behind = skew("ahead"), skew("behind")
    assert bounded(-30.0, "telecom.test") == 0.0
    assert bounded(10 * MAX_CRITICAL_S, "telecom.test") == MAX_CRITICAL_S
    assert bounded(12.5, "telecom.test") == 12.5
    assert (skew("ahead"), skew("behind")) == (ahead + 1, behind + 1)
    bounded(-1.0)  # without a route: bounded, not counted (the console's figure)
    assert skew("ahead") == ahead + 1


def test_a_critical_time_falls_in_the_first_bucket_whose_bound_holds_it() -> None:
    assert critical_bucket(0.0) == 0
    assert critical_bucket(CRITICAL_BOUNDS[0]) == 0
    assert critical_bucket(CRITICAL_BOUNDS[0] + 0.001) == 1
    assert critical_bucket(MAX_CRITICAL_S) == len(CRITICAL_BOUNDS) - 1


def test_the_consoles_quantiles_interpolate_within_fixed_buckets() -> None:
    bounds = (1.0, 10.0, 100.0)
    assert quantile(0.5, [0, 0, 0], bounds) is None
    # 100 in (0, 1]: the median is half way through that bucket.
    assert quantile(0.5, [100, 0, 0], bounds) == 0.5
    # 90 in (1, 10], 10 in (10, 100]: p99 is 90 % of the way through the last bucket.
    p99 = quantile(0.99, [0, 90, 10], bounds)
    assert p99 is not None
    assert abs(p99 - 91.0) < 1e-9


def work() -> UnitOfWork:
    queues = {USER: loaded_queue(UserRow(USER, 0, 0, False, 0), [])}
    return UnitOfWork(T0, queues, {MONTHLY.id: MONTHLY}, list(range(1, 11)), T0)


def context(uow: UnitOfWork, message_type: str, delivery: RawDelivery) -> HandlerContext:
    env = envelope(message_type)
    return HandlerContext(None, T0, env, uow, None, delivery)  # type: ignore[arg-type]  # no I/O


async def test_a_purchases_time_rides_its_queuing_and_activation_to_the_grant() -> None:
    uow = work()
    purchase = context(uow, PACKAGE_PURCHASE.message_type, raw(T0))
    ids, at = purchase.new_item_ids(1)
    await transition(purchase, USER, lambda q: q.purchase(MONTHLY, None, 1, ids, at))
    (queuing,) = uow.outbox_rows
    assert queuing.route == PACKAGE_QUEUING.name
    assert queuing.headers[H_ORIGIN_TS] == T0.isoformat()

    later = T0 + timedelta(seconds=2)
    pushed = context(uow, PACKAGE_QUEUING.message_type, raw(later, **queuing.headers))
    await transition(pushed, USER, lambda q: q.advance(T0))
    activation = next(r for r in uow.outbox_rows if r.route == PACKAGE_ACTIVATE.name)
    assert activation.headers[H_ORIGIN_TS] == T0.isoformat()

    grant = context(uow, PACKAGE_ACTIVATE.message_type, raw(later, **activation.headers))
    grant.grant(USER, ids[0])
    assert uow.granted() == [T0]


async def test_an_activation_no_purchase_caused_carries_no_purchase_time() -> None:
    uow = work()
    # Bought (with its time) and activated: the follow-ups of a message that is neither a
    # purchase nor one of its follow-ups (an expiry, an all-expired) carry no origin.
    purchase = context(uow, PACKAGE_PURCHASE.message_type, raw(T0))
    ids, at = purchase.new_item_ids(1)
    await transition(purchase, USER, lambda q: q.purchase(MONTHLY, None, 1, ids, at))
    uow.outbox_rows.clear()
    expiry = context(uow, ALL_EXPIRED.message_type, raw(T0))
    await transition(expiry, USER, lambda q: q.advance(T0))
    activation = next(r for r in uow.outbox_rows if r.route == PACKAGE_ACTIVATE.name)
    assert H_ORIGIN_TS not in activation.headers
    grant = context(uow, PACKAGE_ACTIVATE.message_type, raw(T0, **activation.headers))
    grant.grant(USER, ids[0])
    assert uow.granted() == []
