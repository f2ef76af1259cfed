"""The overview's charts: per route, processed, failed, dead-lettered, parked and the outbox's
lag over the last hour (by the minute) or the last day (by 5 minutes), as JSON for the page's
chart script (static/trends.js, drawn with the vendored uPlot), which polls it as the overview
refreshes its figures. The figures come from the relays' per-minute snapshots
(infra/postgres/trends.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from consumers.web.dependencies import Viewer, pool_of
from infra.postgres import trends

router = APIRouter(include_in_schema=False)


def as_json(found: trends.Trends) -> dict[str, Any]:
    """The chart script's input: bucket starts in unix seconds, then per route one list per
    series, a value per bucket (None: a gauge nobody snapshotted)."""
    return {
        "window": found.window.name,
        "step_s": int(found.window.step.total_seconds()),
        "buckets": [int(b.timestamp()) for b in found.buckets],
        "routes": [
            {
                "route": route,
                "short": route.removeprefix("telecom."),
                **{name: getattr(trend, name) for name in (*trends.COUNTS, *trends.GAUGES)},
            }
            for route, trend in found.routes.items()
        ],
    }


@router.get("/overview/trends")
async def overview_trends(request: Request, who: Viewer, window: str = "1h") -> JSONResponse:
    chosen = trends.WINDOWS.get(window)
    if chosen is None:
        raise HTTPException(422, f"window must be one of {', '.join(trends.WINDOWS)}")
    async with pool_of(request).acquire() as conn:
        found = await trends.read(conn, chosen)
    # Never cached: the last bucket moves while the page is open.
    return JSONResponse(as_json(found), headers={"Cache-Control": "no-store"})
