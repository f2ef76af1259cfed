"""The overview's trends endpoint in process against real Postgres: viewers only, the two
windows it offers and nothing else, and the live counters in the last bucket."""

from __future__ import annotations

import asyncpg

from events.routes import ROUTES
from infra.postgres import transitions, trends
from infra.settings import Settings
from tests.web.client import VIEWER_PASSWORD, client, sign_in


async def test_the_trends_endpoint_answers_a_signed_in_viewer_each_routes_buckets(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with pool.acquire() as conn:
        # Counted before any snapshot: when they happened is not known, they are charted nowhere.
        await transitions.count(conn, {("telecom.usage_record", "ack"): 100})
        assert await trends.snapshot(conn)
        await transitions.count(conn, {("telecom.usage_record", "ack"): 7})
    async with client(settings, pool) as http:
        anonymous = await http.get("/overview/trends")
        assert anonymous.status_code == 303
        assert anonymous.headers["location"].startswith("/login")
        assert (await sign_in(http, "vic", VIEWER_PASSWORD)).status_code == 303
        assert (await http.get("/overview/trends?window=1w")).status_code == 422
        hour = await http.get("/overview/trends")
        day = (await http.get("/overview/trends?window=1d")).json()
    assert hour.status_code == 200
    assert hour.headers["cache-control"] == "no-store"
    found = hour.json()
    assert (found["window"], found["step_s"], len(found["buckets"])) == ("1h", 60, 60)
    assert (day["window"], day["step_s"], len(day["buckets"])) == ("1d", 300, 288)
    assert [r["route"] for r in found["routes"]] == list(ROUTES)
    # The minute's snapshot, then 7 more: the minute's bucket (the last, or the one before it
    # if the minute turned meanwhile) runs from the snapshot to the live totals.
    usage = next(r for r in found["routes"] if r["short"] == "usage_record")
    assert sum(usage["processed"]) == 7
    assert usage["processed"][-2:] in ([0, 7], [7, 0])
    assert usage["parked"][:-2] == [None] * 58  # nobody snapshotted them: unknown, not 0
    assert usage["parked"][-1] == 0
