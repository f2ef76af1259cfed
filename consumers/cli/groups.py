"""`pkgq group …` (a group's progress; cancelling it) and `pkgq grant` (an admin's bulk grant:
one purchase per user as one group, followed to completion)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

import structlog
import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from consumers.cli import exit_codes
from consumers.cli.confirm import confirm
from consumers.cli.options import (
    DryRunOpt,
    JsonOpt,
    YesOpt,
    operator,
    route_argument,
    seconds,
)
from consumers.cli.output import Column, console, field, say, show, show_table, text
from consumers.cli.running import load_settings, with_jobs
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE
from infra.jobs import Jobs
from infra.jobs import end_message as make_end_message

group_app = typer.Typer(help="Groups of messages: their progress, and cancelling them.")
log = structlog.get_logger(__name__)
GroupId = Annotated[str, typer.Argument(help="The group's id.")]


def _group_id(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise typer.BadParameter(f"not a group id: {value!r}") from None


def _summary(jobs_summary: dict[str, Any] | None, gid: UUID) -> dict[str, Any]:
    if jobs_summary is None:
        exit_codes.fail(exit_codes.NOT_FOUND, f"no group {gid}")
    return jobs_summary


@group_app.command("show")
def group_show(group_id: GroupId, as_json: JsonOpt = False) -> None:
    """A group's state and counters."""
    settings = load_settings()
    gid = _group_id(group_id)
    summary = _summary(with_jobs(settings, lambda jobs: jobs.group(gid)), gid)
    columns: list[Column] = [("field", lambda kv: kv[0]), ("value", lambda kv: text(kv[1]))]
    show(summary, as_json, lambda s: show_table(list(s.items()), False, columns))


@group_app.command("list")
def group_list(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """The most recent groups."""
    settings = load_settings()
    columns: list[Column] = [
        ("id", lambda g: str(g["id"])),
        ("name", field("name")),
        ("state", field("state")),
        *((k, lambda g, k=k: str(g[k])) for k in ("total", "done", "failed", "cancelled")),
        ("created", lambda g: g["created_at"].isoformat(timespec="seconds")),
    ]
    show_table(with_jobs(settings, lambda jobs: jobs.groups(limit)), as_json, columns)


@group_app.command("cancel")
def group_cancel(
    group_id: GroupId, yes: YesOpt = False, dry_run: DryRunOpt = False, as_json: JsonOpt = False
) -> None:
    """Cancel an open group: members not yet published are deleted, members already on the
    broker do nothing when delivered, and the group's abort message (if any) is published.
    Asks first."""
    settings = load_settings()
    gid = _group_id(group_id)
    summary = _summary(with_jobs(settings, lambda jobs: jobs.group(gid)), gid)
    if dry_run:
        show(summary, as_json, lambda s: say(f"would cancel group {gid}: {s}"))
        return
    if summary["state"] == "open":
        confirm(f"Cancel group {gid} ({summary['total']} member(s))?", yes=yes)
    result = with_jobs(settings, lambda jobs: jobs.cancel_group(gid, operator()))
    if result is None:
        exit_codes.fail(exit_codes.NOT_FOUND, f"no group {gid}")

    def render(_: object) -> None:
        if not result.cancelled:
            say(f"group {gid} is {result.state}: nothing to cancel")
            return
        say(
            f"cancelled {gid}: {result.withdrawn} unpublished member(s) deleted, "
            f"{result.disarmed} on the broker will be no-ops, abort message "
            f"{result.abort_message_id or 'none'}"
        )

    show(result, as_json, render, data=dataclasses.asdict(result))
    if not result.cancelled:
        raise typer.Exit(exit_codes.FAILED)


def _read_users(path: str) -> list[UUID]:
    listing = sys.stdin.read() if path == "-" else Path(path).read_text()
    users: list[UUID] = []
    for number, line in enumerate(listing.splitlines(), 1):
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
        str | None, typer.Option(help="Message to publish when all are done: ROUTE=JSON.")
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the group and report it.")] = True,
    timeout: Annotated[str, typer.Option(help="How long to wait (e.g. 10m).")] = "10m",
    as_json: JsonOpt = False,
) -> None:
    """Admin bulk grant: publish one purchase of PACKAGE per user as one group, then follow it
    to completion (a progress bar on a terminal, log lines otherwise). Exit 1 if a purchase
    failed, 5 if the group was still open at the timeout."""
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
        if not as_json:
            say(f"group {result.group_id}: {len(result.message_ids)} purchase(s) queued")
        if not wait:
            return {"id": result.group_id, "state": "open", "total": len(bodies)}
        return await _follow(jobs, result.group_id, len(bodies), limit)

    summary = with_jobs(settings, work)
    show(
        summary,
        as_json,
        lambda s: say(
            f"group {s['id']} {s['state']}: {s.get('done', 0)} done, "
            f"{s.get('failed', 0)} failed, {s.get('cancelled', 0)} cancelled"
        ),
    )
    if not wait:
        return
    if summary["state"] == "open":
        raise typer.Exit(exit_codes.TIMEOUT)
    if summary.get("failed") or summary["state"] != "completed":
        raise typer.Exit(exit_codes.FAILED)


async def _follow(jobs: Jobs, group_id: UUID, total: int, limit: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    tty = console().is_terminal
    columns = (TextColumn("granting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console(), disable=not tty) as progress:
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


def register(app: typer.Typer) -> None:
    """Add `group …` and `grant` to the `pkgq` app."""
    app.add_typer(group_app, name="group")
    app.command("grant")(grant_cmd)
