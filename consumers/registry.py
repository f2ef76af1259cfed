"""Which handler serves which route."""

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
from consumers.unit_of_work import Handler
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
