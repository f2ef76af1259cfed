"""The console's story pages: a user's timeline (every message, transition, failure, replay
and operator action pkgq recorded for the user, newest first, a page at a time) and where a
message_id is (`/messages?message_id=…`, the search on the Users page)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from consumers import timeline_view
from consumers.web.dependencies import Viewer, page_size, pool_of, render
from infra.postgres import message_search, timeline

router = APIRouter(include_in_schema=False)
TIMELINE_PAGE = 50
"""Entries on a page of a user's timeline unless `limit` says otherwise."""
TIMELINE_MAX = 500


def _size(limit: str | None) -> int:
    return page_size(limit, TIMELINE_PAGE, TIMELINE_MAX)


@router.get("/users/{user_id}/timeline", response_class=HTMLResponse)
async def timeline_page(
    request: Request,
    user_id: UUID,
    who: Viewer,
    after: str | None = None,
    limit: str | None = None,
) -> Response:
    """Newest first: an operator opens it to see what just happened, and pages back in time
    (keyset: `after` is the last entry's cursor of the page before)."""
    size = _size(limit)
    try:
        start = timeline.position_of(after) if after is not None else None
    except ValueError as exc:
        raise HTTPException(422, f"after: {exc}") from None
    async with pool_of(request).acquire() as conn:
        found = await timeline.page(conn, user_id, start, size)
    entries = timeline_view.rows(found.entries)
    sized = {"limit": str(size)} if limit is not None else {}
    base = f"/users/{user_id}/timeline"
    next_url = (
        f"{base}?{urlencode({'after': entries[-1]['cursor'], **sized})}"
        if found.more and entries
        else None
    )
    return render(
        request,
        "timeline.html",
        {
            "user_id": user_id,
            "entries": entries,
            "next_url": next_url,
            "first_url": (base + (f"?{urlencode(sized)}" if sized else "")) if start else None,
        },
    )


@router.get("/messages", response_class=HTMLResponse)
async def find_message(request: Request, who: Viewer, message_id: str | None = None) -> Response:
    """Every place a message_id is recorded, with links to its users' timelines and to its
    dead letters."""
    if not message_id:
        return render(request, "find_message.html", {"message_id": None, "places": []})
    try:
        wanted = UUID(message_id.strip())
    except ValueError:
        refused: dict[str, Any] = {
            "message_id": message_id,
            "places": [],
            "error": f"{message_id!r} is not a UUID",
        }
        return render(request, "find_message.html", refused, 422)
    async with pool_of(request).acquire() as conn:
        found = await message_search.find(conn, wanted)
    context: dict[str, Any] = {
        "message_id": wanted,
        "places": timeline_view.places(found),
        "error": None,
    }
    return render(request, "find_message.html", context)
