"""One example message per route for the AsyncAPI document (events/asyncapi.py). Each payload
is validated against its body model by tests/unit/test_asyncapi.py, so an example can never
show a message pkgq would refuse."""

from __future__ import annotations

from typing import Any

USER = "3f0c9a52-6b1e-4e7a-9d55-2a8c4f1b7e10"
ORDER = "8d2e4b71-0c3a-4f59-b6e2-91a7c5d3f804"
AT = 1_767_225_600  # 2026-01-01T00:00:00Z

PAYLOADS: dict[str, dict[str, Any]] = {
    "PurchasePackage": {"user_id": USER, "package_id": 7, "amount": 2, "by_order": ORDER},
    "RecordUsage": {
        "user_id": USER,
        "upload": 1_048_576,
        "download": 15_728_640,
        "usage_id": "cdr-2026-11-26-000042",
        "recorded_at": 1_764_115_200,
    },
    "CancelPackage": {
        "user_id": USER,
        "item_id": 42,
        "reason": "refund requested",
        "operator": "alice@admin",
    },
    "AdjustQuota": {
        "user_id": USER,
        "item_id": 42,
        "delta": 536_870_912,
        "reason": "goodwill",
        "operator": "alice@admin",
    },
    "PackageQueuePushEvent": {
        "user_id": USER,
        "item_ids": [42, 43],
        "package_id": 7,
        "pushed_at": AT,
    },
    "PackageActivateEvent": {"user_id": USER, "item_id": 42, "package_id": 7, "activated_at": AT},
    "PackageExpiringEvent": {
        "user_id": USER,
        "item_id": 42,
        "package_id": 7,
        "expired_at": AT + 2_592_000,
        "reason": "time",
    },
    "AllPackageExpiredEvent": {"user_id": USER, "expired_at": AT + 5_184_000},
    "PackageExpiryDue": {"user_id": USER, "item_id": 42, "package_id": 7, "due_at": AT},
    "PackageCancelledEvent": {
        "user_id": USER,
        "item_id": 43,
        "package_id": 7,
        "cancelled_at": AT + 60,
        "was_active": False,
        "reason": "refund requested",
        "operator": "alice@admin",
    },
}
