"""Which handler serves which route, and what each route's messages need loaded."""

from __future__ import annotations

from consumers.handlers import (
    all_expired,
    expiry_due,
    package_activate,
    package_cancel,
    package_expiring,
    package_purchase,
    package_queuing,
    quota_adjust,
    usage_record,
)
from consumers.unit_of_work import NO_NEEDS, Handler, Needs, NeedsOf
from events import routes

HANDLERS: dict[str, Handler] = {
    routes.PACKAGE_PURCHASE.name: package_purchase.handle,
    routes.USAGE_RECORD.name: usage_record.handle,
    routes.PACKAGE_CANCEL.name: package_cancel.handle,
    routes.QUOTA_ADJUST.name: quota_adjust.handle,
    routes.PACKAGE_QUEUING.name: package_queuing.handle,
    routes.PACKAGE_ACTIVATE.name: package_activate.handle,
    routes.PACKAGE_EXPIRING.name: package_expiring.handle,
    routes.ALL_EXPIRED.name: all_expired.handle,
    routes.EXPIRY_DUE.name: expiry_due.handle,
}

NEEDS: dict[str, NeedsOf] = {
    routes.PACKAGE_PURCHASE.name: package_purchase.needs,
    routes.USAGE_RECORD.name: usage_record.needs,
    routes.PACKAGE_CANCEL.name: package_cancel.needs,
    routes.QUOTA_ADJUST.name: quota_adjust.needs,
    routes.PACKAGE_ACTIVATE.name: package_activate.needs,
    routes.PACKAGE_EXPIRING.name: package_expiring.needs,
    routes.EXPIRY_DUE.name: expiry_due.needs,
}
"""Routes not named here need only their users' live items."""


def needs_of(route_name: str) -> NeedsOf:
    return NEEDS.get(route_name, _nothing)


def _nothing(_: object) -> Needs:
    return NO_NEEDS
