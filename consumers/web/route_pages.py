"""The console's pause and resume of a route's consumption (`pkgq route pause|resume`): a
confirmation page with the route's state and a reason field, then the audited change
(operators only, CSRF-checked). Every replica obeys within PKGQ_PAUSE_POLL seconds; the
overview shows the route as paused until it is resumed."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from consumers.web import auth
from consumers.web.dependencies import Operator, pool_of, render
from events.routes import ROUTES, Route
from infra.postgres import consumer_pauses
from infra.settings import Settings

router = APIRouter(include_in_schema=False)
ACTIONS = ("pause", "resume")


def _route(short: str) -> Route:
    found = ROUTES.get(short if short.startswith("telecom.") else f"telecom.{short}")
    if found is None:
        raise HTTPException(404, f"no route {short!r}")
    return found


def _action(action: str) -> str:
    if action not in ACTIONS:
        raise HTTPException(404, "no such action")
    return action


@router.get("/routes/{short}/{action}", response_class=HTMLResponse)
async def route_confirm(request: Request, short: str, action: str, who: Operator) -> Response:
    route, action = _route(short), _action(action)
    async with pool_of(request).acquire() as conn:
        pause = (await consumer_pauses.paused(conn)).get(route.name)
    settings: Settings = request.app.state.settings
    context = {
        "route": route.name,
        "short": route.short_name,
        "action": action,
        "pause": pause,
        "poll": settings.pause_poll,
    }
    return render(request, "route_confirm.html", context)


@router.post("/routes/{short}/{action}")
async def route_action(request: Request, short: str, action: str, who: Operator) -> Response:
    form = await auth.checked_form(request)
    route, action = _route(short), _action(action)
    reason = (form.get("reason") or "").strip()[:500] or None
    async with pool_of(request).acquire() as conn:
        if action == "pause":
            changed = await consumer_pauses.pause(conn, route.name, who.actor, reason)
            done = "paused: every replica stops consuming it within seconds"
            same = "was paused already"
        else:
            changed = await consumer_pauses.resume(conn, route.name, who.actor, reason)
            done = "resumed: its waiting messages drain in order"
            same = "was not paused"
    flash = f"{route.short_name} {done if changed else same}"
    return RedirectResponse(f"/?done={quote(flash)}", status_code=303)
