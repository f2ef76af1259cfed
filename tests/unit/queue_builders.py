"""Builders shared by the example tests of `UserQueue` (tests/unit/test_domain_queue_*.py): a
user, a clock and catalog entries, and queues in a known state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TypeVar
from uuid import UUID

from domain.events import (
    DomainEvent,
)
from domain.model import ItemStatus, Package
from domain.queue import UserQueue

USER = UUID("00000000-0000-4000-8000-000000000001")
ORDER = UUID("00000000-0000-4000-8000-0000000000aa")
T0 = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)

E = TypeVar("E")

BASIC = Package(id=1, name="basic", traffic_limit=1_000)
MONTHLY = Package(id=2, name="monthly", traffic_limit=1_000, duration=timedelta(days=30))
INSTANT = Package(id=3, name="instant", traffic_limit=1_000, duration=timedelta(0))
MONTHLY_DUE = T0 + timedelta(days=30)
"""expire_at of a MONTHLY item activated at T0."""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def new_queue() -> UserQueue:
    return UserQueue(user_id=USER)


def queue_with(*packages: Package, now: datetime = T0) -> UserQueue:
    """A queue holding one item per package, ids 1..n in purchase order, nothing active yet."""
    queue = new_queue()
    for item_id, package in enumerate(packages, start=1):
        queue.purchase(package, None, 1, [item_id], now)
    return queue


def active_queue(*packages: Package, now: datetime = T0) -> UserQueue:
    """Like `queue_with`, then the queue-push consumer has run once."""
    queue = queue_with(*packages, now=now)
    queue.advance(now)
    return queue


def of_type(events: list[DomainEvent], kind: type[E]) -> list[E]:
    return [event for event in events if isinstance(event, kind)]


def status_of(queue: UserQueue, item_id: int) -> ItemStatus:
    return queue.item(item_id).status
