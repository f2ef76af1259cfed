"""The console's dead letters: failure groups, a filtered list, one message's detail, replay
and discard (one, a group or a filter, each behind a confirmation step) and edit-and-replay.

Everything runs through consumers/operations.py and infra/postgres (dead_letters, replay): the
functions `pkgq dlq` uses. Bulk actions confirm the exact ids the operator was shown."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError

from consumers import dead_letter_filter, operations
from consumers.web import auth, replay_pages
from consumers.web.dependencies import Operator, Viewer, pool_of, render
from events.identity import claimed_user
from events.routes import ROUTES
from infra.postgres import console, dead_letters, operator_actions
from infra.settings import Settings

router = APIRouter(include_in_schema=False)
LIST_LIMIT = 200
BULK_LIMIT = 1000
_FILTER_KEYS = ("route", "reason", "user_id", "group", "since", "until", "status")


def _filter(
    params: dict[str, str], *, limit: int, buried_only: bool = False
) -> dead_letters.Filter:
    """The list's filters (query string or a confirmation form) as the store's Filter, read as
    `pkgq dlq` reads its options (consumers/dead_letter_filter.py); a bad one is a 422."""
    try:
        return dead_letter_filter.parse(
            route_name=params.get("route"),
            error=params.get("reason"),
            group=params.get("group"),
            user_id=params.get("user_id"),
            since=params.get("since"),
            until=params.get("until"),
            status_name="buried" if buried_only else params.get("status") or "buried",
            limit=limit,
        )
    except dead_letter_filter.FilterError as exc:
        raise HTTPException(422, str(exc)) from None


def _params(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items() if k in _FILTER_KEYS and v}


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letter_list(request: Request, who: Viewer) -> Response:
    params = _params(request)
    which = _filter(params, limit=LIST_LIMIT)
    async with pool_of(request).acquire() as conn:
        rows = await dead_letters.find(conn, which)
        groups = await dead_letters.groups(conn, "buried")
    return render(
        request,
        "dead_letters.html",
        {
            "rows": rows,
            "groups": groups,
            "params": params,
            "status": params.get("status", "buried"),
            "routes": sorted(ROUTES),
            "query": urlencode(params),
            "limit": LIST_LIMIT,
            "flash": request.query_params.get("done"),
        },
    )


@router.get("/dead-letters/{dead_letter_id:int}", response_class=HTMLResponse)
async def dead_letter_detail(request: Request, dead_letter_id: int, who: Viewer) -> Response:
    async with pool_of(request).acquire() as conn:
        row = await dead_letters.get(conn, dead_letter_id)
        audit = await operator_actions.recent(conn, dead_letter_id=dead_letter_id, limit=20)
    if row is None:
        raise HTTPException(404, f"no dead letter {dead_letter_id}")
    headers = dead_letters.as_dict(row["headers"])
    row["headers_text"] = json.dumps(headers, indent=2, default=str)
    row["claimed_user"] = claimed_user(headers, row["user_id"])
    row["body_text"] = console.body_text(row.pop("body"))
    return render(
        request,
        "dead_letter.html",
        {"d": row, "audit": audit, "flash": request.query_params.get("done")},
    )


@router.get("/dead-letters/confirm", response_class=HTMLResponse)
async def confirm(request: Request, who: Operator, action: str, id: int | None = None) -> Response:
    """What a replay or discard would touch: one (id), or every buried one the filter matches."""
    if action not in ("replay", "discard"):
        raise HTTPException(422, "action must be replay or discard")
    params = _params(request)
    which = (
        dead_letters.Filter(ids=[id], status="buried", limit=1)
        if id is not None
        else _filter(params, limit=BULK_LIMIT, buried_only=True)
    )
    async with pool_of(request).acquire() as conn:
        rows = await dead_letters.find(conn, which)
    return render(
        request,
        "dlq_confirm.html",
        {
            "action": action,
            "rows": rows,
            "ids": ",".join(str(r["id"]) for r in rows),
            "params": params,
            "single": id,
            "limit": BULK_LIMIT,
        },
    )


@router.post("/dead-letters/act")
async def act(request: Request, who: Operator) -> Response:
    form = await auth.checked_form(request)
    action = form.get("action")
    try:
        ids = [int(x) for x in form.get("ids", "").split(",") if x]
    except ValueError:
        raise HTTPException(422, "ids must be numbers") from None
    if action not in ("replay", "discard"):
        raise HTTPException(422, "action must be replay or discard")
    rate = replay_pages.read_rate(form.get("rate")) if action == "replay" else None
    if rate is not None and ids:  # paced: a replay run in the background, and its page
        url = await replay_pages.start(request, ids, who.actor, rate)
        return RedirectResponse(url, status_code=303)
    async with pool_of(request).acquire() as conn:
        if action == "replay":
            result = await operations.replay_ids(
                conn, ids, who.actor, pkgq_user=_pkgq_user(request)
            )
            done = f"replayed {result.done} dead letter(s) through the outbox"
            if result.skipped:
                skipped = "; ".join(f"{r.id}: {r.detail}" for r in result.skipped)
                done += f"; not replayed: {skipped}"
        else:
            count = await operations.discard_ids(conn, ids, who.actor)
            done = f"discarded {count} dead letter(s)"
    back = f"/dead-letters/{ids[0]}" if len(ids) == 1 else "/dead-letters"
    return RedirectResponse(f"{back}?{urlencode({'done': done})}", status_code=303)


@router.get("/dead-letters/{dead_letter_id:int}/edit", response_class=HTMLResponse)
async def edit_form(request: Request, dead_letter_id: int, who: Operator) -> Response:
    row = await _buried(request, dead_letter_id)
    body = console.body_text(row["body"])
    return render(request, "dlq_edit.html", _edit_context(row, body, None, confirm=False))


@router.post("/dead-letters/{dead_letter_id:int}/edit", response_class=HTMLResponse)
async def edit_check(request: Request, dead_letter_id: int, who: Operator) -> Response:
    """Validate the edited body against the route's model; if it passes, ask to confirm."""
    form = await auth.checked_form(request)
    row = await _buried(request, dead_letter_id)
    text = form.get("body", "")
    try:
        model = operations.validate_edit(row["route"], text)
    except (ValidationError, operations.EditRefusedError) as exc:
        return render(request, "dlq_edit.html", _edit_context(row, text, exc, confirm=False), 422)
    pretty = json.dumps(json.loads(model.model_dump_json()), indent=2)
    return render(request, "dlq_edit.html", _edit_context(row, pretty, None, confirm=True))


@router.post("/dead-letters/{dead_letter_id:int}/edit-replay")
async def edit_replay(request: Request, dead_letter_id: int, who: Operator) -> Response:
    form = await auth.checked_form(request)
    text = form.get("body", "")
    try:
        async with pool_of(request).acquire() as conn, conn.transaction():
            await operations.edit_and_replay(
                conn, dead_letter_id, text, who.actor, pkgq_user=_pkgq_user(request)
            )
    except (ValidationError, operations.EditRefusedError) as exc:
        # The connection is back in the pool before the error page takes one of its own.
        row = await _buried(request, dead_letter_id)
        return render(request, "dlq_edit.html", _edit_context(row, text, exc, confirm=False), 422)
    done = "the edited message was replayed through the outbox; the original is kept for audit"
    return RedirectResponse(
        f"/dead-letters/{dead_letter_id}?{urlencode({'done': done})}", status_code=303
    )


def _pkgq_user(request: Request) -> str:
    """pkgq's AMQP user: on a route only pkgq publishes, only its messages are replayed."""
    settings: Settings = request.app.state.settings
    return settings.amqp_user


async def _buried(request: Request, dead_letter_id: int) -> dict[str, Any]:
    async with pool_of(request).acquire() as conn:
        row = await dead_letters.get(conn, dead_letter_id)
    if row is None:
        raise HTTPException(404, f"no dead letter {dead_letter_id}")
    if row["status"] != "buried":
        raise HTTPException(409, f"dead letter {dead_letter_id} is {row['status']}, not buried")
    return row


def _edit_context(
    row: dict[str, Any], body: str, error: Exception | None, *, confirm: bool
) -> dict[str, Any]:
    problems: list[str] = []
    if isinstance(error, ValidationError):
        problems = [
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in error.errors()
        ]
    elif error is not None:
        problems = [str(error)]
    route = ROUTES.get(row["route"])
    return {
        "d": row,
        "original": console.body_text(row["body"]),
        "body": body,
        "problems": problems,
        "confirm": confirm,
        "model": route.model.__name__ if route else None,
        "schema": json.dumps(route.model.model_json_schema(), indent=2) if route else "",
    }
