"""Map the domain's events onto the messages pkgq publishes through the outbox."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from domain.events import (
    AllPackagesExpired,
    DomainEvent,
    DuplicateOrder,
    DuplicateUsage,
    ExpiryScheduled,
    ExpiryUnscheduled,
    PackageActivated,
    PackageCancelled,
    PackageExpired,
    PackagesQueued,
    UsageRemaining,
)
from events.models import (
    AllPackageExpiredEvent,
    PackageActivateEvent,
    PackageCancelledEvent,
    PackageExpiringEvent,
    PackageExpiryDue,
    PackageQueuePushEvent,
    WireModel,
)
from events.routes import (
    ALL_EXPIRED,
    EXPIRY_DUE,
    PACKAGE_ACTIVATE,
    PACKAGE_CANCELLED,
    PACKAGE_EXPIRING,
    PACKAGE_QUEUING,
    Route,
)


@dataclass(frozen=True, slots=True)
class Outgoing:
    route: Route
    body: WireModel
    due_at: datetime | None = None
    """Deliver no earlier than this (None: as soon as the transaction commits)."""
    cancel_key: str | None = None
    """A name under which a still-pending scheduled message can be withdrawn."""


def expiry_key(item_id: int) -> str:
    return f"expire:{item_id}"


def unix(ts: datetime) -> int:
    return int(ts.timestamp())


ItemEvent = PackageActivated | PackageExpired | ExpiryScheduled | PackageCancelled


def _about_item(model: type[WireModel], event: ItemEvent, **fields: object) -> WireModel:
    """The body of a message about one item: its user, item and package, and `fields`."""
    return model.model_validate(
        {"user_id": event.user_id, "item_id": event.item_id, "package_id": event.package_id}
        | fields
    )


_LOCAL_ONLY = (UsageRemaining, ExpiryUnscheduled, DuplicateOrder, DuplicateUsage)
"""Events that cause no message (`outgoing`'s last case, tried first)."""


def outgoing(event: DomainEvent) -> Outgoing | None:
    """The message a domain event causes, or None if it only changes local state."""
    if isinstance(event, _LOCAL_ONLY):  # most events of a usage batch: no match to walk
        return None
    match event:
        case PackagesQueued():
            return Outgoing(
                PACKAGE_QUEUING,
                PackageQueuePushEvent(
                    user_id=event.user_id,
                    item_ids=list(event.item_ids),
                    package_id=event.package_id,
                    pushed_at=unix(event.pushed_at),
                ),
            )
        case PackageActivated():
            return Outgoing(
                PACKAGE_ACTIVATE,
                _about_item(PackageActivateEvent, event, activated_at=unix(event.activated_at)),
            )
        case PackageExpired():
            expired_at = unix(event.expired_at)
            return Outgoing(
                PACKAGE_EXPIRING,
                _about_item(
                    PackageExpiringEvent, event, expired_at=expired_at, reason=event.reason
                ),
            )
        case ExpiryScheduled():
            return Outgoing(
                EXPIRY_DUE,
                _about_item(PackageExpiryDue, event, due_at=unix(event.due_at)),
                due_at=event.due_at,
                cancel_key=expiry_key(event.item_id),
            )
        case PackageCancelled():
            return Outgoing(
                PACKAGE_CANCELLED,
                _about_item(
                    PackageCancelledEvent,
                    event,
                    cancelled_at=unix(event.cancelled_at),
                    was_active=event.was_active,
                    reason=event.reason,
                    operator=event.operator,
                    publisher=event.publisher,
                ),
            )
        case AllPackagesExpired():
            return Outgoing(
                ALL_EXPIRED,
                AllPackageExpiredEvent(user_id=event.user_id, expired_at=unix(event.expired_at)),
            )
        case _:
            return None
