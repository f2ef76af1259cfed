"""The console's replay runs: a bulk replay at a set rate runs in the background of the console's
process (consumers/replay_runner.py, as `pkgq dlq replay --rate` runs it), and its page, which
refreshes while it runs, reads the run's record from Postgres: sent, failed again, left, the
rate achieved, the estimated end, and why it stopped. The CLI's runs are shown too. A running
run can be cancelled, a stopped one resumed (from where it stopped, its frozen set as it was).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import structlog
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from consumers import replay_runner
from consumers.web import auth
from consumers.web.dependencies import Operator, Viewer, pool_of, render
from domain.replay_pace import Limits, Progress
from infra.postgres import replay_runs
from infra.postgres.pool import Conn
from infra.settings import Settings

log = structlog.get_logger(__name__)
router = APIRouter(include_in_schema=False)
REFRESH_S = 2


def read_rate(text: str | None) -> float | None:
    """The form's rate (messages a second; empty: unlimited). A bad one is a 422."""
    if not text or not text.strip():
        return None
    try:
        rate = float(text)
    except ValueError:
        raise HTTPException(422, "the rate is a number of messages a second") from None
    if not rate > 0 or rate == float("inf"):
        raise HTTPException(422, "the rate is a number of messages a second, above 0")
    return rate


def _launch(request: Request, run_id: int, who: str) -> None:
    """Drive the run in the console's process, each step on a connection of its pool."""
    pool = pool_of(request)
    settings: Settings = request.app.state.settings

    @asynccontextmanager
    async def connect() -> AsyncIterator[Conn]:
        async with pool.acquire() as conn:
            yield conn

    async def go() -> None:
        try:
            await replay_runner.drive(
                connect, run_id, replay_runner.RunOptions(who, settings.amqp_user)
            )
        except Exception as exc:  # the run stays `running`: stale, then resumable
            log.exception("replay_run_failed", run_id=run_id, error=repr(exc))

    tasks: set[asyncio.Task[None]] = request.app.state.__dict__.setdefault("replay_tasks", set())
    task = asyncio.get_running_loop().create_task(go(), name=f"replay-run-{run_id}")
    tasks.add(task)  # kept until done (a task nothing refers to may be collected)
    task.add_done_callback(tasks.discard)


async def start(request: Request, ids: Sequence[int], who: str, rate: float | None) -> str:
    """Start a run over these ids in the background; the URL of its page."""
    async with pool_of(request).acquire() as conn:
        run_id = await replay_runner.start(
            conn, ids, who, description=f"console: {len(ids)} chosen", rate=rate, limits=Limits()
        )
    _launch(request, run_id, who)
    return f"/dead-letters/replays/{run_id}"


def _view(row: dict[str, Any]) -> dict[str, Any]:
    """A run's record with its progress as the CLI reports it."""
    progress = Progress(
        run_id=row["id"],
        state=row["state"],
        total=row["total"],
        sent=row["sent"],
        skipped=row["skipped"],
        failed_again=row["failed_again"],
        applied=row["applied"],
        leg_sent=row["leg_sent"],
        leg_seconds=row["leg_seconds"] or 0.0,
        reason=row["reason"],
    )
    eta = progress.eta_seconds
    running = row["state"] == "running"
    ends: datetime | None = None
    if running and eta is not None:
        ends = datetime.now(row["started_at"].tzinfo) + timedelta(seconds=eta)
    stale = running and row["silent_seconds"] > replay_runs.STALE_AFTER_S
    return {
        **row,
        "left": progress.left,
        "rate_achieved": progress.rate,
        "ends": ends,
        "stale": stale,
        "resumable": row["state"] in replay_runs.RESUMABLE or stale,
    }


@router.get("/dead-letters/replays", response_class=HTMLResponse)
async def run_list(request: Request, who: Viewer) -> Response:
    async with pool_of(request).acquire() as conn:
        rows = await replay_runs.recent(conn, 50)
    return render(request, "replay_runs.html", {"runs": [_view(r) for r in rows]})


@router.get("/dead-letters/replays/{run_id:int}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: int, who: Viewer) -> Response:
    async with pool_of(request).acquire() as conn:
        row = await replay_runs.get(conn, run_id)
    if row is None:
        raise HTTPException(404, f"no replay run {run_id}")
    return render(
        request,
        "replay_run.html",
        {"r": _view(row), "refresh": REFRESH_S, "flash": request.query_params.get("done")},
    )


@router.post("/dead-letters/replays/{run_id:int}/cancel")
async def cancel(request: Request, run_id: int, who: Operator) -> Response:
    await auth.checked_form(request)
    async with pool_of(request).acquire() as conn:
        done = await replay_runs.cancel(conn, run_id, who.actor)
    said = "cancelled: it stops before its next batch" if done else "it was not running"
    return RedirectResponse(f"/dead-letters/replays/{run_id}?done={said}", status_code=303)


@router.post("/dead-letters/replays/{run_id:int}/resume")
async def resume(request: Request, run_id: int, who: Operator) -> Response:
    form = await auth.checked_form(request)
    rate = read_rate(form.get("rate"))
    async with pool_of(request).acquire() as conn:
        try:
            await replay_runner.resume(conn, run_id, who.actor, rate)
        except LookupError as exc:
            raise HTTPException(409, str(exc)) from None
    _launch(request, run_id, who.actor)
    return RedirectResponse(f"/dead-letters/replays/{run_id}", status_code=303)
