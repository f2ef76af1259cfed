"""`pkgq dlq replay`, `pkgq dlq plow` and `pkgq dlq runs`: replays of many dead letters as runs
(consumers/replay_runner.py). A run is paced (`--rate`), reports its progress (a live display
on a terminal, otherwise a structured log line every few seconds), stops by itself when its
messages fail again or a route's circuit breaker trips, and is resumed with `--resume RUN_ID`
from where it stopped: never sending again what it sent, never taking in a letter filed after
it started.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Annotated, Any

import structlog
import typer
from rich.progress import BarColumn, TextColumn
from rich.progress import Progress as Display

from consumers import replay_runner
from consumers.cli import exit_codes
from consumers.cli.dlq_changes import (
    ErrorOpt,
    GroupOpt,
    RouteOpt,
    SinceOpt,
    matching,
)
from consumers.cli.options import ByOpt, DryRunOpt, JsonOpt, operator
from consumers.cli.output import Column, console, field, moment, say, show, show_table, text
from consumers.cli.running import load_routing_settings, load_settings, on_database, run
from domain.replay_pace import Limits, Progress
from infra.postgres import dead_letters, replay_runs
from infra.postgres.pool import Conn, database
from infra.settings import Settings

log = structlog.get_logger(__name__)

RateOpt = Annotated[
    float | None,
    typer.Option(
        "--rate", min=0.01, help="At most N messages a second, paced evenly (default: unlimited)."
    ),
]
CheckFirstOpt = Annotated[
    int,
    typer.Option(
        "--check-first",
        min=1,
        help="Judge the run by its first N replayed messages: it waits for them to be decided "
        "before sending more (see --verdict-wait).",
    ),
]
MaxFailedOpt = Annotated[
    float,
    typer.Option(
        "--max-failed",
        min=0,
        max=100,
        help="Stop when more than this percentage of those first messages that are decided "
        "(applied or dead-lettered again) failed again.",
    ),
]
MinDecidedOpt = Annotated[
    int,
    typer.Option("--min-decided", min=1, help="Judge only once this many of them are decided."),
]
VerdictWaitOpt = Annotated[
    float,
    typer.Option(
        "--verdict-wait",
        min=0,
        help="Seconds to hold back for the first messages' verdict; then go on, still watching.",
    ),
]
ProgressEveryOpt = Annotated[
    float,
    typer.Option(
        "--progress-every", min=0.1, help="Seconds between progress log lines (no terminal)."
    ),
]
_DEFAULT = Limits()


class Reporter:
    """A run's progress: a live display on a terminal, otherwise a `replay_progress` log line
    every `every` seconds (and the last one), with the same fields."""

    def __init__(self, every: float, *, tty: bool | None = None) -> None:
        self._every = every
        self._tty = sys.stdout.isatty() if tty is None else tty
        self._display: Display | None = None
        self._task: Any = None
        self._logged = 0.0
        self.last: Progress | None = None

    def __enter__(self) -> Reporter:
        if self._tty:
            self._display = Display(
                TextColumn("[bold]replay run {task.fields[run_id]}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} sent"),
                TextColumn("{task.fields[failed_again]} failed again"),
                TextColumn("{task.fields[left]} left"),
                TextColumn("{task.fields[rate]}/s"),
                TextColumn("ends in {task.fields[eta]}"),
                console=console(),
            )
            self._display.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._display is not None:
            self._display.__exit__(kind, exc, tb)

    def __call__(self, progress: Progress) -> None:
        self.last = progress
        fields = progress.fields()
        if self._display is not None:
            eta = progress.eta_seconds
            shown: dict[str, Any] = {
                **{k: v for k, v in fields.items() if k != "total"},
                "eta": "?" if eta is None else f"{eta:.0f} s",
            }
            if self._task is None:
                self._task = self._display.add_task("replay", total=progress.total, **shown)
            self._display.update(self._task, completed=progress.sent + progress.skipped, **shown)
            return
        now = time.monotonic()
        if progress.state != "running" or now - self._logged >= self._every:
            self._logged = now
            log.info("replay_progress", **fields)


def _limits(check_first: int, max_failed: float, min_decided: int) -> Limits:
    try:
        return Limits(check_first, max_failed / 100, min_decided)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _go(
    settings: Settings,
    start: Any,
    options: replay_runner.RunOptions,
    every: float,
) -> tuple[replay_runner.Outcome, int]:
    """Start (or resume) a run with `start(conn) -> run_id`, and drive it to its end."""

    async def go() -> tuple[replay_runner.Outcome, int]:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            run_id: int = await start(conn)

            @asynccontextmanager
            async def connect() -> AsyncIterator[Conn]:
                yield conn

            with Reporter(every) as reporter:
                outcome = await replay_runner.drive(connect, run_id, options, reporter)
        return outcome, run_id

    return run(go())


def _report(outcome: replay_runner.Outcome, as_json: bool) -> None:
    p = outcome.progress
    skipped = outcome.skipped
    data = {
        "replayed": p.leg_sent,
        "skipped": [dataclasses.asdict(r) for r in skipped],
        "run_id": p.run_id,
        "state": p.state,
        "reason": p.reason,
        "progress": p.fields(),
    }

    def render(_: object) -> None:
        say(f"replayed {p.leg_sent} dead letter(s) through the outbox (replay run {p.run_id})")
        for r in skipped:
            console().print(text(f"not replayed {r.id}: {r.detail}", style="yellow"))
        if p.state != "done":
            console().print(text(f"replay run {p.run_id} {p.state}: {p.reason}", style="red"))
            console().print(
                text(f"{p.left} left; resume with `pkgq dlq replay --resume {p.run_id}`")
            )

    show(data, as_json, render)
    if skipped or p.state != "done":
        raise typer.Exit(exit_codes.FAILED)


def _start_new(
    settings: Settings,
    ids: list[int],
    who: str,
    *,
    description: str,
    transition: str,
    rate: float | None,
    limits: Limits,
    verdict_wait: float,
    every: float,
    as_json: bool,
) -> None:
    async def start(conn: Conn) -> int:
        return await replay_runner.start(
            conn,
            ids,
            who,
            description=description,
            transition=transition,
            rate=rate,
            limits=limits,
        )

    options = replay_runner.RunOptions(who, settings.amqp_user, verdict_wait_s=verdict_wait)
    outcome, _ = _go(settings, start, options, every)
    _report(outcome, as_json)


def _described(**given: object) -> str:
    return " ".join(f"{k}={v}" for k, v in given.items() if v) or "every buried dead letter"


def replay_cmd(
    route: RouteOpt = None,
    error: ErrorOpt = None,
    group: GroupOpt = None,
    since: SinceOpt = None,
    ids: Annotated[list[int] | None, typer.Option("--id", help="These ids (repeatable).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most N.")] = None,
    rate: RateOpt = None,
    resume: Annotated[
        int | None,
        typer.Option(
            "--resume",
            help="Resume this stopped run: what it has not sent yet, nothing filed since it "
            "started (no filter with it).",
        ),
    ] = None,
    check_first: CheckFirstOpt = _DEFAULT.check_first,
    max_failed: MaxFailedOpt = _DEFAULT.max_failed * 100,
    min_decided: MinDecidedOpt = _DEFAULT.min_decided,
    verdict_wait: VerdictWaitOpt = 120.0,
    progress_every: ProgressEveryOpt = 5.0,
    dry_run: DryRunOpt = False,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay every buried dead letter that matches, oldest first, once each, as a run: paced
    by --rate, stopped when its messages fail again or a route's circuit breaker trips, and
    resumed with --resume RUN_ID."""
    limits = _limits(check_first, max_failed, min_decided)
    if resume is not None:
        if route or error or group or since or ids or limit or dry_run:
            raise typer.BadParameter("--resume takes no filter: a run keeps the set it started on")
        _resume(resume, rate, by, verdict_wait, progress_every, as_json)
        return
    settings = load_routing_settings()
    which = matching(route, error, group, since, ids=ids, limit=limit)
    rows = on_database(settings, lambda conn: dead_letters.find(conn, which))
    if dry_run:
        show(
            [{"id": r["id"], "route": r["route"], "would_replay": True} for r in rows],
            as_json,
            lambda found: say(
                f"would replay {len(found)} dead letter(s): {[r['id'] for r in found]}"
            ),
        )
        return
    _start_new(
        settings,
        [r["id"] for r in rows],
        by or operator(),
        description=_described(
            route=route, error=error, group=group, since=since, ids=ids, limit=limit
        ),
        transition="dig",
        rate=rate,
        limits=limits,
        verdict_wait=verdict_wait,
        every=progress_every,
        as_json=as_json,
    )


def _resume(
    run_id: int,
    rate: float | None,
    by: str | None,
    verdict_wait: float,
    every: float,
    as_json: bool,
) -> None:
    settings = load_routing_settings()
    who = by or operator()

    async def start(conn: Conn) -> int:
        try:
            await replay_runner.resume(conn, run_id, who, rate)
        except LookupError as exc:
            exit_codes.fail(exit_codes.NOT_FOUND, exc)
        return run_id

    options = replay_runner.RunOptions(who, settings.amqp_user, verdict_wait_s=verdict_wait)
    outcome, _ = _go(settings, start, options, every)
    _report(outcome, as_json)


def plow_cmd(
    count: int,
    rate: RateOpt = None,
    check_first: CheckFirstOpt = _DEFAULT.check_first,
    max_failed: MaxFailedOpt = _DEFAULT.max_failed * 100,
    min_decided: MinDecidedOpt = _DEFAULT.min_decided,
    verdict_wait: VerdictWaitOpt = 120.0,
    progress_every: ProgressEveryOpt = 5.0,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay the COUNT oldest buried dead letters through the outbox, as a run (see `replay`;
    resumed with `pkgq dlq replay --resume RUN_ID`)."""
    limits = _limits(check_first, max_failed, min_decided)
    settings = load_routing_settings()
    which = dead_letters.Filter(status="buried", limit=count)
    rows = on_database(settings, lambda conn: dead_letters.find(conn, which))
    _start_new(
        settings,
        [r["id"] for r in rows],
        by or operator(),
        description=f"plow {count}",
        transition="plow",
        rate=rate,
        limits=limits,
        verdict_wait=verdict_wait,
        every=progress_every,
        as_json=as_json,
    )


def runs_cmd(
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Replay runs, newest first: their state, progress and why they stopped."""
    settings = load_settings()
    rows = on_database(settings, lambda conn: replay_runs.recent(conn, limit))
    columns: list[Column] = [
        ("run", lambda r: str(r["id"])),
        ("state", field("state")),
        ("started", moment("started_at")),
        ("by", field("started_by", 20)),
        ("what", field("description", 30)),
        ("rate", lambda r: "-" if r["rate"] is None else f"{r['rate']:g}/s"),
        ("sent", lambda r: f"{r['sent']}/{r['total']}"),
        ("failed again", lambda r: str(r["failed_again"])),
        ("reason", field("reason", 60)),
    ]
    show_table(rows, as_json, columns)


def register(app: typer.Typer) -> None:
    app.command("plow")(plow_cmd)
    app.command("replay")(replay_cmd)
    app.command("runs")(runs_cmd)
