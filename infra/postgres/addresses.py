"""Addresses (rsqueue's addressed work): `telecom.addresses`, one row per address, `queued` until
its message is done or failed. A finished address is claimed again by the next message sent to
it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

RETENTION = Rule("addresses", "telecom.addresses", "address", "finished_at < {cutoff}")


@dataclass(frozen=True, slots=True)
class AddressState:
    address: str
    route: str
    message_id: UUID
    state: str
    error: str | None
    created_at: datetime
    finished_at: datetime | None


async def take_address(conn: Conn, address: str, route: str, message_id: UUID) -> UUID | None:
    """Claim `address` for a new message. Returns None when claimed, else the message that holds
    it (queued or in flight). A finished address is claimed again."""
    taken = await conn.fetchval(
        """
        INSERT INTO telecom.addresses AS a (address, route, message_id, state)
        VALUES ($1, $2, $3, 'queued')
        ON CONFLICT (address) DO UPDATE
            SET route = excluded.route, message_id = excluded.message_id, state = 'queued',
                error = NULL, created_at = now(), finished_at = NULL
            WHERE a.state <> 'queued'
        RETURNING true
        """,
        address,
        route,
        message_id,
    )
    if taken:
        return None
    holder: UUID = await conn.fetchval(
        "SELECT message_id FROM telecom.addresses WHERE address = $1", address
    )
    return holder


async def address_state(conn: Conn, address: str) -> AddressState | None:
    row = await conn.fetchrow(
        "SELECT address, route, message_id, state, error, created_at, finished_at "
        "FROM telecom.addresses WHERE address = $1",
        address,
    )
    return AddressState(**dict(row)) if row is not None else None


async def requeue_addresses(conn: Conn, replayed: Sequence[tuple[str, UUID]]) -> None:
    """Failed messages are sent again (a dead-letter replay), each (address, message_id) as
    its replay carries it: that address, if that message holds it, is queued again. A message
    without an address of pkgq's (another publisher's copy under the job's message_id, whose
    marks pkgq never obeys) requeues nothing."""
    if replayed:
        await conn.execute(
            "UPDATE telecom.addresses a SET state = 'queued', error = NULL, finished_at = NULL "
            "FROM unnest($1::text[], $2::uuid[]) AS r(address, message_id) "
            "WHERE a.address = r.address AND a.message_id = r.message_id AND a.state = 'failed'",
            [address for address, _ in replayed],
            [message_id for _, message_id in replayed],
        )


async def mark_finished(conn: Conn, finished: Sequence[tuple[str, UUID, bool, str | None]]) -> None:
    """(address, message_id, ok, error) each: the address, if that message still holds it,
    becomes done (ok) or failed with the error. A done address stays done."""
    if not finished:
        return
    await conn.execute(
        """
        UPDATE telecom.addresses a
        SET state = CASE WHEN x.ok THEN 'done' ELSE 'failed' END, error = x.error,
            finished_at = now()
        FROM unnest($1::text[], $2::uuid[], $3::bool[], $4::text[]) AS x(address, m, ok, error)
        WHERE a.address = x.address AND a.message_id = x.m AND a.state <> 'done'
        """,
        [f[0] for f in finished],
        [f[1] for f in finished],
        [f[2] for f in finished],
        [f[3] for f in finished],
    )
