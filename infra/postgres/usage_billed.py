"""Usage records billed under their billing system's record id (RecordUsage version 2): what a
batch loads to find repeats, and what it writes for the records it billed. One statement each,
whatever the batch's size; both run under the users' row locks (consumers/delivery/snapshot.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

from domain.model import BilledUsage
from infra.postgres.compound import Part, part_of
from infra.postgres.pool import Conn, columns
from infra.postgres.pruning import Rule

RETENTION = Rule("usage_billed", "telecom.usage_billed", "ctid", "keep_until < now()")
"""A billed record id is forgotten once its dedup window (PKGQ_USAGE_DEDUP_DAYS) has passed."""


@dataclass(frozen=True, slots=True)
class NewBilling:
    user_id: UUID
    usage_id: str
    message_id: UUID
    billed: BilledUsage


async def load(
    conn: Conn, wanted: Iterable[tuple[UUID, str]]
) -> dict[UUID, dict[str, BilledUsage]]:
    """Which of these (user, usage_id) pairs were billed, and how, in one statement (none when
    the batch names no record id)."""
    pairs = sorted(set(wanted))
    if not pairs:
        return {}
    rows = await conn.fetch(
        """
        SELECT b.user_id, b.usage_id, b.item_id, b.upload, b.download, b.recorded_at
        FROM telecom.usage_billed b
        JOIN unnest($1::uuid[], $2::text[]) AS x(user_id, usage_id)
          ON b.user_id = x.user_id AND b.usage_id = x.usage_id
        """,
        [u for u, _ in pairs],
        [i for _, i in pairs],
    )
    found: dict[UUID, dict[str, BilledUsage]] = {}
    for r in rows:
        found.setdefault(r["user_id"], {})[r["usage_id"]] = BilledUsage(
            r["item_id"], r["upload"], r["download"], r["recorded_at"]
        )
    return found


def write(billed: Sequence[NewBilling], keep_days: int) -> Part[None] | None:
    """The records billed by a batch: a part of its write statement (none when there are
    none). No ON CONFLICT: under the users' locks a record id is never billed twice, so a
    conflict would be a bug, and the key refuses it rather than hide it."""
    if not billed:
        return None
    return part_of(
        """
        INSERT INTO telecom.usage_billed
            (user_id, usage_id, message_id, item_id, upload, download, recorded_at, keep_until)
        SELECT x.user_id, x.usage_id, x.message_id, x.item_id, x.upload, x.download,
               x.recorded_at, now() + make_interval(days => $8)
        FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::bigint[], $5::bigint[],
                    $6::bigint[], $7::timestamptz[])
             AS x(user_id, usage_id, message_id, item_id, upload, download, recorded_at)
        """,
        (
            *columns(billed, "user_id", "usage_id", "message_id", "billed.item_id"),
            *columns(billed, "billed.upload", "billed.download", "billed.recorded_at"),
            keep_days,
        ),
        ("usage_billed",),
        name="usage_billed_written",
    )
