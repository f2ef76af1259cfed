"""One user's queue as node management and operators see it now: the shapes `pkgq user show
--json`, the console's user page and the read API (`/api/v1/users/...`) all answer with, built
here once from the same domain objects and the database clock; and the cursor a page of a
user's items is continued from."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from domain.model import ItemStatus, QueueItem
from infra.postgres.read_api import Access, Current, PackagesPage, Position

PAGE_DEFAULT = 100
"""Items on a page of the read API unless `limit` says otherwise."""
PAGE_MAX = 1000
"""The most items one page may ask for (a larger `limit` is refused)."""
CURSOR_PATTERN = r"^[0-9]{1,19}\.[0-9]{1,19}$"
"""A cursor: the queue position (created_at in microseconds since the epoch, item id) of the
last item of the page before. Clients pass it back as they got it."""
_CURSOR = re.compile(CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_MAX_ID = 2**63 - 1


def cursor_of(item: QueueItem) -> str:
    """The cursor of the page that starts after `item` (in queue order: created_at, id)."""
    return f"{(item.created_at - _EPOCH) // _MICROSECOND}.{item.id}"


def position_of(cursor: str) -> Position:
    """The queue position a cursor names; ValueError for anything `cursor_of` cannot make."""
    if not _CURSOR.fullmatch(cursor):
        raise ValueError("not a cursor this API gave out (a `next` of a previous page)")
    micros, item_id = (int(part) for part in cursor.split("."))
    try:
        created_at = _EPOCH + micros * _MICROSECOND
    except OverflowError:
        raise ValueError("not a cursor this API gave out (its time is out of range)") from None
    if item_id > _MAX_ID:
        raise ValueError("not a cursor this API gave out (its item id is out of range)")
    return Position(created_at, item_id)


def item_row(item: QueueItem, now: datetime) -> dict[str, Any]:
    """One item as it is reported: its status as the clock sees it (an active item past its
    expire_at is consumed, even while its timer is on its way), and its own terms."""
    status = item.status_at(now)
    return {
        "id": item.id,
        "package": item.terms.package_name,
        "package_id": item.package_id,
        "status": status.value,
        "expired_by_time_pending_timer": status is not item.status,
        "by_order": str(item.by_order) if item.by_order else None,
        "created_at": item.created_at.isoformat(),
        "activated_at": item.activated_at.isoformat() if item.activated_at else None,
        "expire_at": item.expire_at.isoformat() if item.expire_at else None,
        "traffic_limit": item.terms.traffic_limit,
        "duration_s": (
            int(item.terms.duration.total_seconds()) if item.terms.duration is not None else None
        ),
        "upload": item.upload,
        "download": item.download,
        "used": item.used,
        "adjust_quota": item.adjust_quota,
        "quota": item.quota,
        "remaining": item.remaining if status.value in ("active", "in_queue") else 0,
    }


def access_row(access: Access | None, now: datetime) -> dict[str, Any] | None:
    """The access read model's row, with `granted_now`: granted, and not past its expire_at by
    the database clock (the row itself changes only when all_expired is applied)."""
    if access is None:
        return None
    return {
        "granted": access.granted,
        "granted_now": access.granted and (access.expire_at is None or access.expire_at > now),
        "item_id": access.item_id,
        "package_id": access.package_id,
        "remaining": access.remaining,
        "expire_at": access.expire_at.isoformat() if access.expire_at else None,
        "seq": access.seq,
        "updated_at": access.updated_at.isoformat(),
    }


def current_package(user_id: UUID, facts: Current) -> dict[str, Any]:
    """GetCurrentPackage. `state`: active (access granted on it), expired (the active item is
    past its expire_at and its timer has not run yet: reported expired all the same), queued
    (items wait, none active yet) or none."""
    now, active = facts.now, facts.active
    item = item_row(active, now) if active is not None else None
    if active is not None and active.status_at(now) is ItemStatus.ACTIVE:
        state = "active"
    elif active is not None:
        state = "expired"
    else:
        state = "queued" if facts.queued else "none"
    access = access_row(facts.access, now)
    granted = state == "active" and access is not None and access["granted_now"]
    return {
        "user_id": str(user_id),
        "as_of": now.isoformat(),
        "state": state,
        "access_granted": granted,
        "item": item,
        "expire_at": item["expire_at"] if item else None,
        "traffic_used": (active.used if active is not None else None),
        "traffic_remaining": item["remaining"] if item else None,
        "queued": facts.queued,
        "access": access,
    }


def packages_page(user_id: UUID, page: PackagesPage) -> dict[str, Any]:
    """GetAllMyPackages, a page at a time: the items in queue order, the current item, every
    item's count, and the cursor of the next page (None: this is the last)."""
    return {
        "user_id": str(user_id),
        "as_of": page.now.isoformat(),
        "current_item_id": page.current_id,
        "total": page.total,
        "next": cursor_of(page.items[-1]) if page.more else None,
        "packages": [item_row(i, page.now) for i in page.items],
    }
