"""The read paths node management calls at high rates (`pkgq web`'s /api/v1): each answers in
one statement, on indexes (the active item: package_queue_one_active; a user's items in queue
order, a page at a time by keyset: package_queue_user_order, migration 0008; access and users:
their primary keys), and carries the database clock, so that an item past its expire_at is
judged by the same clock pkgq expires by."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.model import QueueItem
from infra.postgres.batch_read import ITEM_COLUMNS, item_of
from infra.postgres.pool import Conn

_ACCESS_COLUMNS = """
    a.granted AS a_granted, a.item_id AS a_item_id, a.package_id AS a_package_id,
    a.remaining AS a_remaining, a.expire_at AS a_expire_at, a.seq AS a_seq,
    a.updated_at AS a_updated_at
"""
_KNOWN = "EXISTS (SELECT 1 FROM telecom.queue_users u WHERE u.user_id = $1) AS known"


@dataclass(frozen=True, slots=True)
class Access:
    """The user's row of the access read model (telecom.access)."""

    granted: bool
    item_id: int | None
    package_id: int | None
    remaining: int | None
    expire_at: datetime | None
    seq: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Current:
    now: datetime
    known: bool
    """False: pkgq has never seen a message for this user."""
    active: QueueItem | None
    """The stored active item (it may be past its expire_at: see QueueItem.status_at)."""
    queued: int
    access: Access | None


def _access(row: Any) -> Access | None:
    if row["a_granted"] is None:
        return None
    return Access(
        granted=row["a_granted"],
        item_id=row["a_item_id"],
        package_id=row["a_package_id"],
        remaining=row["a_remaining"],
        expire_at=row["a_expire_at"],
        seq=row["a_seq"],
        updated_at=row["a_updated_at"],
    )


async def current(conn: Conn, user_id: UUID) -> Current:
    """GetCurrentPackage's facts in one statement: the clock, whether the user is known, the
    active item with its terms, how many wait behind it, and the access row."""
    row = await conn.fetchrow(
        f"""
        SELECT now() AS now, {_KNOWN},
               (SELECT count(*) FROM telecom.package_queue w
                WHERE w.user_id = $1 AND w.status = 'in_queue') AS queued,
               {_ACCESS_COLUMNS}, {ITEM_COLUMNS}
        FROM (SELECT 1) AS one
        LEFT JOIN telecom.access a ON a.user_id = $1
        LEFT JOIN telecom.package_queue q ON q.user_id = $1 AND q.status = 'active'
        """,
        user_id,
    )
    assert row is not None  # FROM (SELECT 1): always one row
    return Current(
        now=row["now"],
        known=row["known"],
        active=item_of(row) if row["id"] is not None else None,
        queued=int(row["queued"]),
        access=_access(row),
    )


@dataclass(frozen=True, slots=True)
class UserState:
    """A user's whole state as it is now (`pkgq user show`'s facts)."""

    now: datetime
    known: bool
    """False: pkgq has never seen a message for this user."""
    items: list[QueueItem]
    """Every item of the user, in queue order."""
    access: Access | None
    unbilled: tuple[int, int] | None
    """Usage not yet billed to an item: (upload, download); None for an unknown user."""


async def user_state(conn: Conn, user_id: UUID) -> UserState:
    """The clock, the user's row, access row and every item in queue order, in one statement
    (one row per item, or one row of NULL item columns when the user has none)."""
    rows = await conn.fetch(
        f"""
        SELECT now() AS now, u.user_id IS NOT NULL AS known,
               u.unbilled_upload AS u_unbilled_upload, u.unbilled_download AS u_unbilled_download,
               {_ACCESS_COLUMNS}, {ITEM_COLUMNS}
        FROM (SELECT 1) AS one
        LEFT JOIN telecom.queue_users u ON u.user_id = $1
        LEFT JOIN telecom.access a ON a.user_id = $1
        LEFT JOIN telecom.package_queue q ON q.user_id = $1
        ORDER BY q.created_at, q.id
        """,
        user_id,
    )
    first = rows[0]  # FROM (SELECT 1) LEFT JOIN ...: at least one row
    return UserState(
        now=first["now"],
        known=first["known"],
        items=[item_of(r) for r in rows if r["id"] is not None],
        access=_access(first),
        unbilled=(
            (first["u_unbilled_upload"], first["u_unbilled_download"]) if first["known"] else None
        ),
    )


@dataclass(frozen=True, slots=True)
class Position:
    """A place in a user's queue order (created_at, id): the keyset a page starts after."""

    created_at: datetime
    item_id: int


@dataclass(frozen=True, slots=True)
class PackagesPage:
    """One page of a user's items in queue order (GetAllMyPackages, paginated)."""

    now: datetime
    known: bool
    """False: pkgq has never seen a message for this user."""
    items: list[QueueItem]
    """At most `limit` items, in queue order, after the position asked for."""
    more: bool
    """Items follow the page's last one."""
    total: int
    """Every item of the user, whatever its status."""
    before: int
    """Items of the user at or before the position asked for (0 for the first page)."""
    current_id: int | None
    """The active item, unless the clock says its time is up (QueueItem.status_at)."""


_AFTER = "coalesce($2::timestamptz, '-infinity'), coalesce($3::bigint, 0)"
"""The position a page starts after; NULL: before every item. Never NULL itself, so the row
comparison is an index condition in a generic plan too (not a filter over the rows before)."""


async def packages_page(
    conn: Conn, user_id: UUID, after: Position | None, limit: int
) -> PackagesPage:
    """A page of the user's items in queue order, keyset-paginated on (created_at, id) after
    `after` (None: from the first), in one statement: the clock, whether the user is known,
    their item count (and how many come up to `after`), the current item's id, and up to
    `limit` items (one more is read to tell whether any follow). The page walks the index
    package_queue_user_order; the counts, its index entries of this one user."""
    created_at, item_id = (after.created_at, after.item_id) if after else (None, None)
    rows = await conn.fetch(
        f"""
        SELECT now() AS now, {_KNOWN}, c.total, c.before,
               (SELECT a.id FROM telecom.package_queue a
                WHERE a.user_id = $1 AND a.status = 'active'
                  AND (a.expire_at IS NULL OR a.expire_at > now())) AS current_id,
               {ITEM_COLUMNS}
        FROM (SELECT count(*) AS total,
                     count(*) FILTER (WHERE (p.created_at, p.id) <= ({_AFTER})) AS before
              FROM telecom.package_queue p WHERE p.user_id = $1) AS c
        LEFT JOIN LATERAL (
            SELECT * FROM telecom.package_queue q
            WHERE q.user_id = $1 AND (q.created_at, q.id) > ({_AFTER})
            ORDER BY q.created_at, q.id
            LIMIT $4
        ) AS q ON true
        ORDER BY q.created_at, q.id
        """,
        user_id,
        created_at,
        item_id,
        limit + 1,
    )
    first = rows[0]  # the counts are one row; LEFT JOIN LATERAL keeps it without items
    items = [item_of(r) for r in rows if r["id"] is not None]
    return PackagesPage(
        now=first["now"],
        known=first["known"],
        items=items[:limit],
        more=len(items) > limit,
        total=int(first["total"]),
        before=int(first["before"] or 0),
        current_id=first["current_id"],
    )


async def item_by_id(conn: Conn, item_id: int) -> tuple[datetime, QueueItem | None]:
    """One item with its terms, whoever's it is, and the clock, in one statement."""
    row = await conn.fetchrow(
        f"""
        SELECT now() AS now, {ITEM_COLUMNS}
        FROM (SELECT 1) AS one
        LEFT JOIN telecom.package_queue q ON q.id = $1
        """,
        item_id,
    )
    assert row is not None  # FROM (SELECT 1): always one row
    return row["now"], item_of(row) if row["id"] is not None else None


async def access(conn: Conn, user_id: UUID) -> tuple[datetime, bool, Access | None]:
    """The access read model's row in one statement: (the clock, known, the row or None)."""
    row = await conn.fetchrow(
        f"""
        SELECT now() AS now, {_KNOWN}, {_ACCESS_COLUMNS}
        FROM (SELECT 1) AS one
        LEFT JOIN telecom.access a ON a.user_id = $1
        """,
        user_id,
    )
    assert row is not None
    return row["now"], row["known"], _access(row)
