"""The access read model for node management: who may use the network, on which package.

Updates carry the per-user event sequence number; an event older than the last one applied
(events on different routes may be consumed out of order) changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from infra.postgres.compound import Part, part_of
from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class Change:
    """The whole access row a grant (item set) or a revoke (item None) leaves, at `seq`."""

    user_id: UUID
    seq: int
    item_id: int | None = None
    package_id: int | None = None
    remaining: int | None = None
    """Traffic left on the granted item; None when granted: unlimited traffic."""
    expire_at: datetime | None = None

    @property
    def granted(self) -> bool:
        return self.item_id is not None


def write(
    changes: Mapping[UUID, Change],
    remaining: Mapping[tuple[UUID, int], int | None],
) -> tuple[Part[set[UUID]] | None, Part[None] | None]:
    """A batch's access updates, a part of its write statement per kind (None: nothing of
    that kind). `changes`: per user, the grant or revoke with the highest seq (applied in
    order, only the newest of them could stick); `remaining`: new traffic left per (user,
    item), applied where that item is the granted one. Both write `access`, so they never
    share a statement: the remaining update sees the grants. The first part's value: the users
    whose change was newer than the row's (the others were stale)."""
    granted: Part[set[UUID]] | None = None
    left: Part[None] | None = None
    if changes:
        granted = part_of(
            """
            INSERT INTO telecom.access AS a
                (user_id, granted, item_id, package_id, remaining, expire_at, seq)
            SELECT * FROM unnest($1::uuid[], $2::bool[], $3::bigint[], $4::bigint[],
                                 $5::bigint[], $6::timestamptz[], $7::bigint[])
            ON CONFLICT (user_id) DO UPDATE
            SET granted = EXCLUDED.granted, item_id = EXCLUDED.item_id,
                package_id = EXCLUDED.package_id, remaining = EXCLUDED.remaining,
                expire_at = EXCLUDED.expire_at, seq = EXCLUDED.seq, updated_at = now()
            WHERE a.seq < EXCLUDED.seq
            RETURNING a.user_id
            """,
            (
                [c.user_id for c in changes.values()],
                [c.granted for c in changes.values()],
                [c.item_id for c in changes.values()],
                [c.package_id for c in changes.values()],
                [c.remaining for c in changes.values()],
                [c.expire_at for c in changes.values()],
                [c.seq for c in changes.values()],
            ),
            ("access",),
            name="access_changed",
            result="ARRAY(SELECT user_id FROM access_changed)",
            decode=set,
        )
    if remaining:
        left = part_of(
            """
            UPDATE telecom.access a SET remaining = x.remaining, updated_at = now()
            FROM unnest($1::uuid[], $2::bigint[], $3::bigint[]) AS x(user_id, item_id, remaining)
            WHERE a.user_id = x.user_id AND a.item_id = x.item_id AND a.granted
            """,
            (
                [user for user, _ in remaining],
                [item for _, item in remaining],
                list(remaining.values()),
            ),
            ("access",),
            name="access_remaining",
        )
    return granted, left


async def get_access(conn: Conn, user_id: UUID) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM telecom.access WHERE user_id = $1", user_id)
