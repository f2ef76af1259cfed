"""Routes whose consumption is paused (migration 0017): the one row per paused route that
every replica's pause watch (consumers/route_pauses.py) reads, and the audited pause and
resume that write it (`pkgq route`, the console)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from infra.postgres import operator_actions
from infra.postgres.pool import Conn


@dataclass(frozen=True, slots=True)
class Pause:
    route: str
    paused_at: datetime
    paused_by: str
    reason: str | None
    automatic: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "route": self.route,
            "paused_at": self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "reason": self.reason,
            "automatic": self.automatic,
        }


async def paused(conn: Conn) -> dict[str, Pause]:
    """Every paused route (a handful of rows at most: the watch reads them every few s)."""
    rows = await conn.fetch(
        "SELECT route, paused_at, paused_by, reason, automatic FROM telecom.consumer_pauses"
    )
    return {r["route"]: Pause(**dict(r)) for r in rows}


async def pause(
    conn: Conn, route: str, who: str, reason: str | None = None, *, automatic: bool = False
) -> bool:
    """Pause the route's consumption, audited in the same transaction. False: it was paused
    already (nothing is written)."""
    async with conn.transaction():
        done = await conn.fetchval(
            """
            INSERT INTO telecom.consumer_pauses (route, paused_by, reason, automatic)
            VALUES ($1, $2, $3, $4)
            ON CONFLICT (route) DO NOTHING
            RETURNING true
            """,
            route,
            who,
            reason,
            automatic,
        )
        if not done:
            return False
        detail = {"route": route, "reason": reason, "automatic": automatic}
        await operator_actions.record(
            conn, operator_actions.Entry(actor=who, action="pause_route", detail=detail)
        )
    return True


async def resume(conn: Conn, route: str, who: str, reason: str | None = None) -> bool:
    """Resume the route's consumption, audited in the same transaction. False: it was not
    paused."""
    return await _resume(conn, route, who, reason, None)


async def resume_breaker(conn: Conn, route: str, after_s: float) -> bool:
    """End the route's pause if the circuit breaker made it over `after_s` seconds ago (an
    operator's pause is left alone). False: nothing to end."""
    reason = f"the circuit breaker's pause ended after {after_s:g} s"
    return await _resume(conn, route, "breaker", reason, after_s)


async def _resume(
    conn: Conn, route: str, who: str, reason: str | None, automatic_after_s: float | None
) -> bool:
    async with conn.transaction():
        was = await conn.fetchrow(
            """
            DELETE FROM telecom.consumer_pauses
            WHERE route = $1
              AND ($2::float8 IS NULL
                   OR (automatic AND paused_at < now() - make_interval(secs => $2::float8)))
            RETURNING paused_at, paused_by, automatic
            """,
            route,
            automatic_after_s,
        )
        if was is None:
            return False
        detail = {
            "route": route,
            "reason": reason,
            "paused_at": was["paused_at"].isoformat(),
            "paused_by": was["paused_by"],
            "automatic": was["automatic"],
        }
        await operator_actions.record(
            conn, operator_actions.Entry(actor=who, action="resume_route", detail=detail)
        )
    return True
