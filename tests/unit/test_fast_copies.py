"""The hand-written copies on the hot path (savepoints, the trust gate's stamp) keep every
field: each is checked against dataclasses.replace on values that all differ from the
defaults, so a field added later and forgotten in the copy fails here."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from uuid import uuid4

from domain.model import BilledUsage, ItemStatus, QueueItem, Terms
from domain.queue import UserQueue
from events.decoding import RawDelivery

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def full_item(item_id: int) -> QueueItem:
    return QueueItem(
        id=item_id,
        user_id=uuid4(),
        terms=Terms(7, "big", 10_000, timedelta(days=30)),
        by_order=uuid4(),
        status=ItemStatus.ACTIVE,
        created_at=NOW - timedelta(days=1),
        activated_at=NOW + timedelta(seconds=1),
        upload=11,
        download=12,
        adjust_quota=13,
        expire_at=NOW + timedelta(days=30),
    )


def test_an_items_copy_equals_the_item_in_every_field_and_changes_apart_from_it() -> None:
    item = full_item(1)
    defaults = QueueItem(0, uuid4(), Terms(0, "x", None, None), None, ItemStatus.IN_QUEUE, NOW)
    differing = [
        f.name
        for f in dataclasses.fields(QueueItem)
        if getattr(item, f.name) == getattr(defaults, f.name)
    ]

    copy = item.copy()
    copy.upload += 1

    assert differing == []  # every field of the item below is set to a non-default value
    assert dataclasses.replace(item, upload=item.upload + 1) == copy
    assert item.upload == 11


def test_a_queues_copy_equals_the_queue_and_shares_no_item_order_or_usage_map() -> None:
    billed = {"cdr-1": BilledUsage(1, 2, 3, NOW)}
    queue = UserQueue(
        uuid4(), [full_item(1), full_item(2)], 5, 6, True, {uuid4(): (1, 2)}, billed, NOW
    )
    defaults = UserQueue(queue.user_id)
    assert [
        f.name
        for f in dataclasses.fields(UserQueue)
        if f.name != "user_id" and getattr(queue, f.name) == getattr(defaults, f.name)
    ] == []

    copy = queue.copy()

    assert copy == queue
    assert copy.clock == queue.clock  # not compared by ==: time passing is not a change
    assert all(a is not b for a, b in zip(copy.items, queue.items, strict=True))
    assert copy.orders is not queue.orders
    assert copy.usages is not queue.usages


def test_a_delivery_with_other_headers_keeps_every_other_field() -> None:
    raw = RawDelivery(
        body=b"{}",
        message_id=str(uuid4()),
        message_type="t",
        content_type="application/json",
        timestamp=NOW,
        headers={"a": 1},
        routing_key="telecom.usage_record",
        publisher="pkgq",
        exchange="telecom",
    )
    assert None not in [getattr(raw, f.name) for f in dataclasses.fields(RawDelivery)]

    assert raw.with_headers({"b": 2}) == dataclasses.replace(raw, headers={"b": 2})
