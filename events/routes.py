"""The route table: routing key -> message type, schema version and body model."""

from __future__ import annotations

from dataclasses import dataclass, field

from events.models import (
    AdjustQuota,
    AllPackageExpiredEvent,
    CancelPackage,
    PackageActivateEvent,
    PackageCancelledEvent,
    PackageExpiringEvent,
    PackageExpiryDue,
    PackageQueuePushEvent,
    PurchasePackage,
    RecordUsage,
    WireModel,
)
from events.versions import RECORD_USAGE_V1, Previous


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    """The routing key on the `telecom` topic exchange, e.g. `telecom.package_purchase`."""
    model: type[WireModel]
    schema_version: int = 1
    """The version pkgq writes and the current body model is of (header x-schema-version)."""
    previous: Previous | None = None
    """Version N-1, still accepted and turned into N on decode (events/versions.py)."""
    inbound: bool = False
    """Whether outsiders (shop, billing, admin tools) may publish on it. The others are pkgq's
    own lifecycle and internal routes: their consumers accept only messages that pkgq itself
    published (the broker-validated AMQP user_id; see consumers/delivery/decode.py)."""

    message_type: str = field(init=False)
    """The AMQP `type` property: the body model's name (a field: read for every delivery)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "message_type", self.model.__name__)

    @property
    def accepted_versions(self) -> tuple[int, ...]:
        """The schema versions its consumer applies: N-1 (when it has one) and N."""
        if self.previous is None:
            return (self.schema_version,)
        return (self.previous.version, self.schema_version)

    @property
    def short_name(self) -> str:
        return self.name.removeprefix("telecom.")


PACKAGE_PURCHASE = Route("telecom.package_purchase", PurchasePackage, inbound=True)
USAGE_RECORD = Route(
    "telecom.usage_record", RecordUsage, schema_version=2, previous=RECORD_USAGE_V1, inbound=True
)
PACKAGE_CANCEL = Route("telecom.package_cancel", CancelPackage, inbound=True)
QUOTA_ADJUST = Route("telecom.quota_adjust", AdjustQuota, inbound=True)
PACKAGE_QUEUING = Route("telecom.package_queuing", PackageQueuePushEvent)
PACKAGE_ACTIVATE = Route("telecom.package_activate", PackageActivateEvent)
PACKAGE_EXPIRING = Route("telecom.package_expiring", PackageExpiringEvent)
ALL_EXPIRED = Route("telecom.all_expired", AllPackageExpiredEvent)
EXPIRY_DUE = Route("telecom.expiry_due", PackageExpiryDue)
"""Internal: the scheduler's time-expiry timer. Its consumer emits PackageExpiringEvent(time)
only if it is the transaction that expires the item, so a stale timer never reaches the
public package_expiring route."""

PACKAGE_CANCELLED = Route("telecom.package_cancelled", PackageCancelledEvent)
"""Published by pkgq through the outbox for outside subscribers (refunds, CRM); pkgq consumes
none of it. Its queue is declared with the topology all the same, so that the relay's mandatory
publish is routed and nothing is lost before a subscriber attaches."""

ROUTES: dict[str, Route] = {
    r.name: r
    for r in (
        PACKAGE_PURCHASE,
        USAGE_RECORD,
        PACKAGE_CANCEL,
        QUOTA_ADJUST,
        PACKAGE_QUEUING,
        PACKAGE_ACTIVATE,
        PACKAGE_EXPIRING,
        ALL_EXPIRED,
        EXPIRY_DUE,
    )
}
"""The routes pkgq consumes (a consumer each)."""

SUBSCRIBER_ROUTES: dict[str, Route] = {PACKAGE_CANCELLED.name: PACKAGE_CANCELLED}
"""Routes pkgq only publishes, for outside subscribers."""

INBOUND_ROUTES: dict[str, Route] = {r.name: r for r in ROUTES.values() if r.inbound}
"""The commands outsiders publish; every other route is published by pkgq only."""

UNTRUSTED_PUBLISHER = "untrusted_publisher"
"""The reason a message is buried with when it came on a route that is not inbound from
anyone but pkgq (consumers/delivery/decode.py). Such dead letters are never replayed."""

ALL_ROUTES: dict[str, Route] = {**ROUTES, **SUBSCRIBER_ROUTES}
"""Every route on the exchange: the topology and the AsyncAPI document."""


class UnknownRouteError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown route {name!r}; known routes: {', '.join(ROUTES)}")
        self.name = name


def route_named(name: str) -> Route:
    """Look a route up by its full (`telecom.usage_record`) or short (`usage_record`) name."""
    full = name if name.startswith("telecom.") else f"telecom.{name}"
    try:
        return ROUTES[full]
    except KeyError:
        raise UnknownRouteError(name) from None
