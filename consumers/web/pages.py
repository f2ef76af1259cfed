"""The console's pages: sign-in, the overview (with the invariants' last results), one user's
queue a page at a time (cancel and quota adjustment), holds and parked messages (the release
of an orphaned hold is in hold_pages.py), workers, groups and addresses, and the audit trail."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode
from uuid import UUID, uuid4

import asyncpg
import structlog
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from consumers import operations
from consumers.job_stats import route_stats
from consumers.queue_view import PAGE_MAX, current_package, cursor_of, item_row, position_of
from consumers.web import auth, sessions
from consumers.web.dependencies import Operator, Viewer, page_size, pool_of, render
from consumers.web.throttle import LoginThrottle
from infra.observability import CRITICAL_BOUNDS
from infra.postgres import (
    console,
    consumer_pauses,
    groups,
    holds,
    invariants,
    operator_actions,
    partition_owners,
    queue_repo,
    read_api,
    stats,
    trends,
    workers,
)
from infra.postgres.pool import Conn
from infra.settings import Settings

router = APIRouter(include_in_schema=False)
log = structlog.get_logger(__name__)
WORKERS_SHOWN = 200
"""Workers on the workers page (running ones first, then stopped; the most recently started
first in each); the page says how many more."""
USER_PAGE_ITEMS = 50
"""Items on a page of a user's queue in the console unless `limit` says otherwise."""


def _safe_next(target: str | None) -> str:
    """Only a path on this site (never `//host` or a scheme): no open redirect."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, next: str | None = None) -> Response:
    context = {"next": _safe_next(next), "error": None, "flash": request.query_params.get("done")}
    return render(request, "login.html", context)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    form = await auth.checked_form(request)
    target = _safe_next(form.get("next"))
    web = request.app.state.web
    name = form.get("user", "")
    address = request.client.host if request.client else "unknown"
    # A name that is no user's is not logged: it may be a password typed in the wrong field.
    seen = {"user": name if name in web.users else None, "address": address}
    throttle: LoginThrottle = request.app.state.login_throttle
    wait = throttle.wait_for(name, address)
    if wait:  # refused before a password hash is spent on it
        log.warning("web_login_throttled", retry_after=wait, **seen)
        refused = render(
            request,
            "login.html",
            {"next": target, "error": f"too many failed sign-ins: try again in {wait} s"},
            status_code=429,
        )
        refused.headers["Retry-After"] = str(wait)
        return refused
    throttle.attempt(name, address)
    if await sessions.sign_in(request, web, name, form.get("password", "")):
        throttle.succeeded(name, address)
        return RedirectResponse(target, status_code=303)
    log.warning("web_login_failed", **seen)
    return render(
        request,
        "login.html",
        {"next": target, "error": "wrong user name or password"},
        status_code=401,
    )


@router.post("/logout")
async def logout(request: Request, who: Viewer) -> Response:
    """Sign out: the session ends on the server, so a copy of its cookie opens nothing."""
    await auth.checked_form(request)
    await sessions.sign_out(request)
    return RedirectResponse("/login", status_code=303)


@router.post("/logout/everywhere")
async def logout_everywhere(request: Request, who: Viewer) -> Response:
    """End every session of the signed-in user: other browsers, other devices, this one."""
    await auth.checked_form(request)
    ended = await sessions.sign_out_everywhere(request, who)
    done = f"{who.name} signed out everywhere ({ended} session(s) ended)"
    return RedirectResponse(f"/login?done={quote(done)}", status_code=303)


async def _overview(request: Request) -> dict[str, Any]:
    settings: Settings = request.app.state.settings
    async with pool_of(request).acquire() as conn:
        table = await route_stats(settings, conn)
        backlog = await stats.backlog(conn)
        held = await console.held_users(conn)
        running = await workers.list_workers(conn)
        # The checks' last stored results (the relay's, or `pkgq doctor`'s): never the checks
        # themselves, which are too heavy for a page that refreshes every few seconds.
        checked = await invariants.stored(conn)
        pauses = await consumer_pauses.paused(conn)
        critical = await trends.read_critical(conn, CRITICAL_BOUNDS, list(table))
    alive = [w for w in running if w.state(settings.worker_stale_after) == "alive"]
    return {
        "invariants": checked,
        "violated": [r for r in checked if not r.ok],
        "invariant_about": {c.name: c.about for c in invariants.CHECKS},
        "violations_total": sum(r.violations for r in checked),
        "checked_at": min((r.checked_at for r in checked if r.checked_at), default=None),
        "routes": [
            {
                "route": route,
                "short": route.removeprefix("telecom."),
                **row,
                "held": held.get(route.removeprefix("telecom."), 0),
                "pause": pauses.get(route),
                "critical": critical[route],
            }
            for route, row in table.items()
        ],
        "backlog": backlog,
        "workers_alive": len(alive),
        "workers_stale": len(running) - len(alive),
        "held_total": sum(held.values()),
        "pauses": sorted(pauses.values(), key=lambda p: p.paused_at),
        "critical_bounds": CRITICAL_BOUNDS,
    }


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, who: Viewer) -> Response:
    context = await _overview(request)
    return render(request, "overview.html", {**context, "flash": request.query_params.get("done")})


@router.get("/overview/live", response_class=HTMLResponse)
async def overview_live(request: Request, who: Viewer) -> Response:
    """The overview's figures alone: the page's script swaps them in every few seconds."""
    return render(request, "overview_live.html", await _overview(request))


@router.get("/users", response_class=HTMLResponse)
async def find_user(request: Request, who: Viewer, user_id: str | None = None) -> Response:
    if user_id:
        try:
            return RedirectResponse(f"/users/{UUID(user_id.strip())}", status_code=303)
        except ValueError:
            return render(request, "find_user.html", {"error": f"{user_id!r} is not a UUID"}, 422)
    return render(request, "find_user.html", {"error": None})


def _page_size(limit: str | None) -> int:
    """The `limit` of a page of a user's queue: USER_PAGE_ITEMS, or 1..PAGE_MAX (else 422)."""
    return page_size(limit, USER_PAGE_ITEMS, PAGE_MAX)


def _query(user_id: UUID, params: Mapping[str, str | int]) -> str:
    return f"/users/{user_id}" + (f"?{urlencode(params)}" if params else "")


@router.get("/users/{user_id}", response_class=HTMLResponse)
async def user_page(
    request: Request,
    user_id: UUID,
    who: Viewer,
    after: str | None = None,
    limit: str | None = None,
) -> Response:
    """A page of the user's items in queue order (keyset on it: `after` is the cursor of the
    page's predecessor, as the read API's `next`), with how many there are in all."""
    size = _page_size(limit)
    try:
        position = position_of(after) if after is not None else None
    except ValueError as exc:
        raise HTTPException(422, f"after: {exc}") from None
    async with pool_of(request).acquire() as conn:
        page = await read_api.packages_page(conn, user_id, position, size)
        facts = await read_api.current(conn, user_id)
        audit = await operator_actions.recent(conn, user_id=user_id, limit=20)
        parked = await console.parked(conn, user_id=user_id)
    if not page.known:
        raise HTTPException(404, f"pkgq has never seen a message for user {user_id}")
    sized = {"limit": size} if limit is not None else {}
    after_last = {"after": cursor_of(page.items[-1])} if page.more else None
    return render(
        request,
        "user.html",
        {
            "user_id": user_id,
            "now": page.now,
            "current": current_package(user_id, facts),
            "items": [item_row(i, page.now) for i in page.items],
            "total": page.total,
            "first_shown": page.before + 1,
            "next_url": _query(user_id, {**after_last, **sized}) if after_last else None,
            "first_url": _query(user_id, sized) if position is not None else None,
            "audit": audit,
            "parked": parked,
            "flash": request.query_params.get("done"),
        },
    )


@router.get("/items/{item_id}/{action}", response_class=HTMLResponse)
async def item_confirm(request: Request, item_id: int, action: str, who: Operator) -> Response:
    """The confirmation step before a cancel or a quota adjustment."""
    if action not in ("cancel", "adjust"):
        raise HTTPException(404, "no such action")
    async with pool_of(request).acquire() as conn:
        now, found = await read_api.item_by_id(conn, item_id)
    if found is None:
        raise HTTPException(404, f"no queue item {item_id}")
    item = item_row(found, now)
    # The command's message_id, fixed now: a form posted twice sends the command once.
    context = {"item": item, "action": action, "owner": found.user_id, "command_id": uuid4()}
    return render(request, "item_confirm.html", context)


@router.post("/items/{item_id}/{action}")
async def item_action(request: Request, item_id: int, action: str, who: Operator) -> Response:
    form = await auth.checked_form(request)
    reason = form.get("reason") or None
    async with pool_of(request).acquire() as conn:
        # The one read of the owner: a vanished item is a 404, and the owner is where the
        # redirect goes (also when the command was sent already and its transaction rolled
        # back). The operation is given it rather than reading it again.
        owner = await _owner(conn, item_id)
        try:
            command_id = UUID(str(form["command_id"])) if form.get("command_id") else None
            async with conn.transaction():
                if action == "cancel":
                    await operations.cancel_item(
                        conn, item_id, who.actor, reason, message_id=command_id, owner=owner
                    )
                    done = f"cancel of item {item_id} sent"
                elif action == "adjust":
                    delta = int(form.get("delta", ""))
                    await operations.adjust_quota(
                        conn, item_id, delta, who.actor, reason, message_id=command_id, owner=owner
                    )
                    done = f"quota adjustment of item {item_id} by {delta} bytes sent"
                else:
                    raise HTTPException(404, "no such action")
        except asyncpg.UniqueViolationError:  # this form was posted before: sent once already
            done = f"item {item_id}: that command was sent already"
        except (ValueError, ValidationError) as exc:
            raise HTTPException(422, f"refused: {exc}") from None
    return RedirectResponse(f"/users/{owner}?done={quote(done)}", status_code=303)


async def _owner(conn: Conn, item_id: int) -> UUID:
    owner = await queue_repo.item_owner(conn, item_id)
    if owner is None:
        raise HTTPException(404, f"no queue item {item_id}")
    return owner


@router.get("/holds", response_class=HTMLResponse)
async def holds_page(request: Request, who: Viewer) -> Response:
    async with pool_of(request).acquire() as conn:
        found = await holds.overview(conn, 500)
        parked = await console.parked(conn, limit=500)
        # Which of them have no way out, asked now (this page does not refresh by itself).
        orphans = await invariants.run(conn, invariants.HOLD_WITHOUT_WAY_OUT, limit=500)
    no_way_out = {(r["consumer"], r["user_id"]) for r in orphans.sample}
    for hold in found:
        hold["no_way_out"] = (hold["consumer"], str(hold["user_id"])) in no_way_out
    for row in parked:
        row["body_text"] = console.body_summary(row.pop("body"))
    context = {
        "holds": found,
        "parked": parked,
        "orphaned": orphans.violations,
        "flash": request.query_params.get("done"),
    }
    return render(request, "holds.html", context)


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(request: Request, who: Viewer) -> Response:
    settings: Settings = request.app.state.settings
    async with pool_of(request).acquire() as conn:
        found, total = await workers.first_workers(conn, WORKERS_SHOWN)
        owners = await partition_owners.owners(conn)
        found_groups = await groups.list_groups(conn, 100)
        addresses = await console.addresses(conn, limit=100)
    return render(
        request,
        "workers.html",
        {
            "workers": [w.as_dict(settings.worker_stale_after) for w in found],
            "workers_total": total,
            "owners": [o.as_dict() for o in owners],
            "groups": found_groups,
            "addresses": addresses,
        },
    )


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request, who: Viewer) -> Response:
    async with pool_of(request).acquire() as conn:
        rows = await operator_actions.recent(conn, limit=200)
    return render(request, "audit.html", {"rows": rows})
