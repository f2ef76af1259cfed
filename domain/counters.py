"""The bigint counters of a user's queue: which numbers must stay within a Postgres bigint,
and the check that refuses a transition taking one beyond it (CounterOverflowError) before
anything changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, Self, TypeVar

from domain.errors import MAX_COUNTER, MIN_COUNTER, CounterOverflowError
from domain.model import ItemStatus, QueueItem


class UserQueue(Protocol):
    """What these checks read of a user's queue (domain.queue.UserQueue)."""

    items: list[QueueItem]
    unbilled_upload: int
    unbilled_download: int

    def copy(self) -> Self: ...


Q = TypeVar("Q", bound=UserQueue)


def of(queue: UserQueue) -> dict[str, int]:
    """Every number of `queue` that Postgres stores as a bigint, or that pkgq adds up from them
    (an item's used traffic and quota, the unbilled total), by name: each must stay within
    MIN_COUNTER..MAX_COUNTER. The unbilled total is bounded because it all moves onto the next
    item activated, where it becomes that item's used traffic."""
    found = {
        "unbilled upload": queue.unbilled_upload,
        "unbilled download": queue.unbilled_download,
        "unbilled traffic (upload + download)": queue.unbilled_upload + queue.unbilled_download,
    }
    for item in queue.items:
        found[f"item {item.id} upload"] = item.upload
        found[f"item {item.id} download"] = item.download
        found[f"item {item.id} used traffic (upload + download)"] = item.used
        found[f"item {item.id} adjust_quota"] = item.adjust_quota
        if item.quota is not None:
            found[f"item {item.id} quota (traffic_limit + adjust_quota)"] = item.quota
    return found


_LIVE = (ItemStatus.IN_QUEUE, ItemStatus.ACTIVE)


def fits_wherever_billed(queue: UserQueue, traffic: int) -> bool:
    """True when no counter can overflow whichever live item (or the unbilled counters)
    `traffic` and the unbilled usage land on: the quick answer for every usage record that is
    nowhere near a bigint's limit."""
    most = 0
    for item in queue.items:  # a loop: run for every usage record
        if item.status in _LIVE and item.upload + item.download > most:
            most = item.upload + item.download
    return most + queue.unbilled_upload + queue.unbilled_download + traffic <= MAX_COUNTER


def refuse_overflow(queue: Q, transition: Callable[[Q], object]) -> None:
    """Run `transition` on a copy of `queue` and raise CounterOverflowError if it takes a counter
    beyond a bigint. `queue` is not touched either way."""
    copy = queue.copy()
    transition(copy)
    before = of(queue)
    for counter, value in of(copy).items():
        refuse_beyond_bigint(counter, value, before.get(counter, 0))


def refuse_beyond_bigint(counter: str, value: int, stored: int) -> None:
    """Raise CounterOverflowError if `counter` would become `value`, beyond a bigint. A counter
    that does not change is not judged here (it is what is stored)."""
    if value != stored and not MIN_COUNTER <= value <= MAX_COUNTER:
        raise CounterOverflowError(counter, value, stored)
