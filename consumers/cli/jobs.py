"""Job-queue commands: `pkgq publish` with options, `pkgq wait`, `pkgq group …`, `pkgq grant`."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar
from uuid import UUID

import structlog
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from consumers.cli.support import clean, load_settings, operator, route_argument, text
from consumers.cli.units import parse_duration
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE, Route
from infra.jobs import DuplicateAddress, JobOptions, Jobs, PublishResult, UnknownAddressError
from infra.jobs import end_message as make_end_message
from infra.postgres.pool import create_pool
from infra.settings import Settings

group_app = typer.Typer(help="Groups of messages: their progress, and cancelling them.")
console = Console()
log = structlog.get_logger(__name__)
T = TypeVar("T")


def seconds(text: str | None) -> float | None:
    """A duration option: `90`, `90s`, `15m`, `12h`, `3d`."""
    if text is None:
        return None
    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def job_options(
    priority: int, delay: str | None, ttl: str | None, address: str | None, unique_for: str | None
) -> JobOptions | None:
    """The options of `pkgq publish`, or None when none is given (a direct publish)."""
    if not (priority or delay or ttl or address or unique_for):
        return None
    try:
        return JobOptions(priority, seconds(delay), seconds(ttl), address, seconds(unique_for))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def with_jobs(settings: Settings, work: Callable[[Jobs], Awaitable[T]]) -> T:
    """Run `work` with a small pool on the pkgq database (one CLI command's worth)."""

    async def go() -> T:
        pool = await create_pool(
            settings.postgres_dsn, min_size=1, max_size=2, session=settings.postgres_session()
        )
        try:
            return await work(Jobs(pool))
        finally:
            await pool.close()

    return asyncio.run(go())


def put(settings: Settings, route: Route, text: str, options: JobOptions) -> PublishResult:
    """`pkgq publish` with job options: one outbox row (the relay publishes it)."""

    def work(jobs: Jobs) -> Awaitable[PublishResult]:
        return jobs.publish(
            route,
            text,
            priority=options.priority,
            delay=options.delay,
            ttl=options.ttl,
            address=options.address,
            unique_for=options.unique_for,
        )

    try:
        return with_jobs(settings, work)
    except DuplicateAddress as exc:
        typer.echo(f"duplicate address: {exc}")
        raise typer.Exit(3) from None


def report(result: PublishResult) -> None:
    if not result.queued:
        typer.echo(
            f"dropped: the same route and arguments were published within the unique window "
            f"as {result.duplicate_of}"
        )
        raise typer.Exit(4)
    extra = []
    if result.available_at is not None:
        extra.append(f"available_at={result.available_at.isoformat()}")
    if result.expires_at is not None:
        extra.append(f"expires_at={result.expires_at.isoformat()}")
    print(result.message_id, *extra)


def register(app: typer.Typer) -> None:
    app.add_typer(group_app, name="group")
    app.command("wait")(wait_cmd)
    app.command("grant")(grant_cmd)


def wait_cmd(
    address: Annotated[str, typer.Argument(help="The address given to `publish --address`.")],
    timeout: Annotated[str, typer.Option(help="Give up after this long (90s, 5m).")] = "60s",
    as_json: Annotated[bool, typer.Option("--json", help="Print the state as JSON.")] = False,
) -> None:
    """Wait until the addressed message is processed. Exit 0 done, 1 failed (dead-lettered or
    expired, with its error), 2 still queued at the timeout, 3 no such address."""
    settings = load_settings()
    limit = seconds(timeout)

    try:
        state = with_jobs(settings, lambda jobs: jobs.wait(address, limit))
    except TimeoutError as exc:
        typer.echo(str(exc))
        raise typer.Exit(2) from None
    except UnknownAddressError as exc:
        typer.echo(str(exc.args[0]))
        raise typer.Exit(3) from None
    if as_json:
        print(
            json.dumps(
                {
                    "address": state.address,
                    "route": state.route,
                    "message_id": str(state.message_id),
                    "state": state.state,
                    "error": state.error,
                    "finished_at": state.finished_at.isoformat() if state.finished_at else None,
                }
            )
        )
    elif state.state == "done":
        typer.echo(f"done: {state.address} ({state.message_id})")
    else:
        typer.echo(clean(f"failed: {state.address}: {state.error}"))
    raise typer.Exit(0 if state.state == "done" else 1)


def _group_id(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise typer.BadParameter(f"not a group id: {text!r}") from None


@group_app.command("show")
def group_show(
    group_id: Annotated[str, typer.Argument(help="The group's id.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A group's state and counters."""
    settings = load_settings()
    gid = _group_id(group_id)

    summary = with_jobs(settings, lambda jobs: jobs.group(gid))
    if summary is None:
        console.print(f"[red]no group {gid}[/red]")
        raise typer.Exit(3)
    if as_json:
        print(json.dumps(summary, default=str))
        return
    table = Table("field", "value")
    for key, value in summary.items():
        table.add_row(key, text(value))
    console.print(table)


@group_app.command("list")
def group_list(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The most recent groups."""
    settings = load_settings()

    groups = with_jobs(settings, lambda jobs: jobs.groups(limit))
    if as_json:
        print(json.dumps(groups, default=str))
        return
    table = Table("id", "name", "state", "total", "done", "failed", "cancelled", "created")
    for g in groups:
        table.add_row(
            str(g["id"]),
            text(g["name"]),
            text(g["state"]),
            *(str(g[k]) for k in ("total", "done", "failed", "cancelled")),
            g["created_at"].isoformat(timespec="seconds"),
        )
    console.print(table)


@group_app.command("cancel")
def group_cancel(group_id: Annotated[str, typer.Argument(help="The group's id.")]) -> None:
    """Cancel an open group: members not yet published are deleted, members on the broker
    become no-ops when delivered, and the group's abort message (if any) is published."""
    settings = load_settings()
    gid = _group_id(group_id)

    result = with_jobs(settings, lambda jobs: jobs.cancel_group(gid, operator()))
    if result is None:
        console.print(f"[red]no group {gid}[/red]")
        raise typer.Exit(3)
    if not result.cancelled:
        typer.echo(f"group {gid} is {result.state}: nothing to cancel")
        raise typer.Exit(1)
    typer.echo(
        f"cancelled {gid}: {result.withdrawn} unpublished member(s) deleted, "
        f"{result.disarmed} on the broker will be no-ops, abort message "
        f"{result.abort_message_id or 'none'}"
    )


def _read_users(path: str) -> list[UUID]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    users: list[UUID] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            users.append(UUID(line))
        except ValueError:
            raise typer.BadParameter(f"{path}:{number}: not a user id: {line!r}") from None
    if not users:
        raise typer.BadParameter(f"{path}: no user ids")
    return users


def grant_cmd(
    package: Annotated[int, typer.Option("--package", help="Catalog package id to grant.")],
    users: Annotated[str, typer.Option("--users", help="File of user ids, one a line (- stdin).")],
    name: Annotated[str | None, typer.Option(help="The group's name.")] = None,
    on_complete: Annotated[
        str | None, typer.Option(help="End message when all are done: ROUTE=JSON.")
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the group and report it.")] = True,
    timeout: Annotated[str, typer.Option(help="How long to wait (e.g. 10m).")] = "10m",
) -> None:
    """Admin bulk grant: publish one purchase of PACKAGE per user as one group, then follow it
    to completion (a progress bar on a terminal, log lines otherwise)."""
    settings = load_settings()
    user_ids = _read_users(users)
    end = None
    if on_complete is not None:
        route_name, _, body = on_complete.partition("=")
        try:
            end = make_end_message(route_argument(route_name), body)
        except ValueError as exc:
            raise typer.BadParameter(f"--on-complete: {exc}") from None
    bodies = [PurchasePackage(user_id=u, package_id=package) for u in user_ids]
    group_name = name or f"grant:package={package}:users={len(user_ids)}"
    limit = seconds(timeout) or 600.0

    async def work(jobs: Jobs) -> dict[str, Any]:
        result = await jobs.publish_group(
            PACKAGE_PURCHASE, bodies, name=group_name, on_complete=end
        )
        typer.echo(f"group {result.group_id}: {len(result.message_ids)} purchase(s) queued")
        if not wait:
            return {"id": result.group_id, "state": "open"}
        return await _follow(jobs, result.group_id, len(bodies), limit)

    summary = with_jobs(settings, work)
    if not wait:
        return
    typer.echo(
        f"group {summary['id']} {summary['state']}: {summary.get('done', 0)} done, "
        f"{summary.get('failed', 0)} failed, {summary.get('cancelled', 0)} cancelled"
    )
    if summary["state"] == "open":
        raise typer.Exit(2)
    if summary.get("failed") or summary["state"] != "completed":
        raise typer.Exit(1)


async def _follow(jobs: Jobs, group_id: UUID, total: int, limit: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    tty = console.is_terminal
    columns = (TextColumn("granting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not tty) as progress:
        task = progress.add_task("grant", total=total)
        last_logged = -1
        while True:
            summary = await jobs.group(group_id) or {"id": group_id, "state": "missing"}
            finished = int(summary.get("done", 0)) + int(summary.get("failed", 0))
            progress.update(task, completed=finished)
            if not tty and finished != last_logged:
                log.info("grant_progress", group_id=str(group_id), finished=finished, total=total)
                last_logged = finished
            if summary["state"] != "open" or time.monotonic() >= deadline:
                return summary
            await asyncio.sleep(0.5)
