"""`pkgq dlq …`: see, group, replay, discard and purge dead letters.

Replays go through the outbox, in the transaction that marks the dead letter `replayed`, so a
bulk replay interrupted half-way and run again sends each message once. Long operations show a
progress bar on a terminal and log one structured line per batch otherwise. Everything taken
from a message (type, route, error text, traceback, headers, body) is printed as literal text
through `cli_support.text`: never as rich markup, never with terminal control characters.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

import structlog
import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from consumers import operations
from consumers.cli_support import load_settings, operator, text
from infra.postgres import dead_letters, holds, replay
from infra.postgres.pool import database
from infra.settings import Settings

dlq_app = typer.Typer(
    help="Dead letters: list, show, group, replay (dig/plow), discard, purge; and holds."
)
console = Console()
log = structlog.get_logger(__name__)
BATCH = operations.BATCH  # dead letters per transaction in bulk commands
T = TypeVar("T")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """`90s`, `15m`, `2h`, `7d`, `1w`."""
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 30m, 2h or 7d")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def parse_since(text: str | None) -> datetime | None:
    """An ISO-8601 time, or a duration meaning that long ago."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return datetime.now(UTC) - parse_duration(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _query(settings: Settings, call: Callable[[Any], Awaitable[T]]) -> T:
    """Run one read or write on a short-lived connection of its own."""

    async def go() -> T:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await call(conn)

    return asyncio.run(go())


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=str, indent=2))


RouteOpt = Annotated[str | None, typer.Option("--route", help="Only this route.")]
ErrorOpt = Annotated[
    str | None, typer.Option("--error", help="Reason, error type or message contains TEXT.")
]
GroupOpt = Annotated[str | None, typer.Option("--group", help="A group key from `dlq groups`.")]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="Failed since: ISO time, or a duration ago (2h).")
]
LimitOpt = Annotated[int | None, typer.Option("--limit", min=1, help="At most N.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
ByOpt = Annotated[str | None, typer.Option("--by", help="Who does it (default: user@host).")]


def _short(value: str | None, width: int) -> Text:
    """One table cell of message data: one line, at most `width` characters, literal."""
    line = (value or "").replace("\n", " ")
    return text(line if len(line) <= width else line[: width - 1] + "…")


@dlq_app.command("list")
def list_cmd(
    route: RouteOpt = None,
    error: ErrorOpt = None,
    group: GroupOpt = None,
    since: SinceOpt = None,
    status: Annotated[
        str | None, typer.Option("--status", help="buried, replayed or discarded.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Dead letters, oldest first, with how many parked messages each one holds back."""
    if status is not None and status not in dead_letters.STATUSES:
        raise typer.BadParameter(f"status must be one of {', '.join(dead_letters.STATUSES)}")
    settings = load_settings()
    which = dead_letters.Filter(
        route=route,
        error=error,
        group=group,
        since=parse_since(since),
        status=status,
        limit=limit,
    )

    rows = _query(settings, lambda conn: dead_letters.find(conn, which))
    if as_json:
        _print_json(rows)
        return
    table = Table("id", "status", "route", "reason", "error", "tries", "first failed", "holds")
    for r in rows:
        table.add_row(
            str(r["id"]),
            text(r["status"]),
            text(r["route"]),
            text(r["reason"]),
            _short(f"{r['error_type']}: {r['error_message']}", 60),
            str(r["attempts"]),
            r["first_failed_at"].strftime("%Y-%m-%d %H:%M:%S"),
            str(r["held_back"] or ""),
        )
    console.print(table)
    console.print(f"{len(rows)} shown (limit {limit})")


@dlq_app.command("show")
def show_cmd(dead_letter_id: int, as_json: JsonOpt = False) -> None:
    """One dead letter: its body, headers, error and traceback."""
    settings = load_settings()

    row = _query(settings, lambda conn: dead_letters.get(conn, dead_letter_id))
    if row is None:
        console.print(f"[red]no dead letter {dead_letter_id}[/red]")
        raise typer.Exit(1)
    body = bytes(row.pop("body"))
    row["headers"] = dead_letters.as_dict(row["headers"])
    try:
        row["body"] = json.loads(body)
    except ValueError:
        row["body"] = body.decode("utf-8", "replace")
    if as_json:
        _print_json(row)
        return
    for key in (
        "id",
        "status",
        "source",
        "route",
        "consumer",
        "message_id",
        "message_type",
        "user_id",
        "reason",
        "error_type",
        "error_message",
        "error_location",
        "group_key",
        "attempts",
        "first_failed_at",
        "last_failed_at",
        "repeats",
        "body_size",
        "body_sha256",
        "replay_count",
        "replayed_at",
        "replayed_by",
        "discarded_at",
        "discarded_by",
        "held_back",
    ):
        console.print(Text.assemble((f"{key:>15}", "bold"), "  ", text(row.get(key))))
    # JSON escapes every control character (ESC as \u001b); printed as text, not markup.
    console.print("[bold]headers[/bold]")
    console.print(text(json.dumps(row["headers"], indent=2, default=str)))
    console.print("[bold]body[/bold]")
    console.print(text(json.dumps(row["body"], indent=2, default=str)))
    if row.get("traceback"):
        console.print("[bold]traceback[/bold]")
        console.print(text(row["traceback"]))


@dlq_app.command("holds")
def holds_cmd(
    limit: Annotated[int, typer.Option("--limit", min=1)] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Users held back on a consumer: by a message waiting for its retry, or a buried one."""
    settings = load_settings()

    rows = _query(settings, lambda conn: holds.overview(conn, limit))
    if as_json:
        _print_json(rows)
        return
    table = Table("consumer", "user", "state", "blocker", "tries", "parked", "since", "last error")
    for r in rows:
        table.add_row(
            text(r["consumer"]),
            str(r["user_id"]),
            text(r["state"]),
            str(r["blocker"] or ""),
            str(r["attempts"]),
            str(r["parked"]),
            r["since"].strftime("%Y-%m-%d %H:%M:%S"),
            _short(r["last_error"], 50),
        )
    console.print(table)


@dlq_app.command("groups")
def groups_cmd(
    status: Annotated[
        str, typer.Option("--status", help="buried, replayed, discarded or all.")
    ] = "buried",
    as_json: JsonOpt = False,
) -> None:
    """Failures grouped by reason, error type and the code that raised them."""
    settings = load_settings()

    rows = _query(
        settings, lambda conn: dead_letters.groups(conn, None if status == "all" else status)
    )
    if as_json:
        _print_json(rows)
        return
    table = Table("group", "count", "reason", "error type", "raised at", "routes", "first", "last")
    for r in rows:
        table.add_row(
            text(r["group_key"]),
            str(r["count"]),
            text(r["reason"]),
            text(r["error_type"]),
            _short(r["error_location"], 40),
            text(", ".join(r["routes"])),
            r["first_seen"].strftime("%m-%d %H:%M:%S"),
            r["last_seen"].strftime("%m-%d %H:%M:%S"),
        )
    console.print(table)
    console.print("replay a group with `pkgq dlq replay --group GROUP`")


async def _in_batches(
    settings: Settings,
    ids: Sequence[int],
    step: Callable[[Any, list[int]], Awaitable[T]],
    label: str,
) -> list[T]:
    """Run `step` over `ids` in transactions of BATCH, with a progress bar on a terminal.
    Returns each committed batch's result; a batch hit by a deadlock or a blip is run again."""
    results: list[T] = []
    done: list[int] = []
    batches = -(-len(ids) // BATCH)
    progress = Progress(console=console, transient=True) if sys.stdout.isatty() else None
    task = progress.add_task(label, total=len(ids)) if progress else None
    if progress:
        progress.start()
    try:

        def advance(size: int) -> None:
            done.append(size)
            if progress is not None and task is not None:
                progress.advance(task, size)
            else:
                log.info(label, batch=size, done=len(done), batches=batches)

        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            results = await operations.in_batches(conn, ids, step, advance)
    finally:
        if progress:
            progress.stop()
    return results


async def _select(settings: Settings, which: dead_letters.Filter) -> list[dict[str, Any]]:
    async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
        return await dead_letters.find(conn, which)


def _replay(
    settings: Settings,
    which: dead_letters.Filter,
    *,
    by: str | None,
    force: bool = False,
    dry_run: bool = False,
    as_json: bool = False,
    transition: str = "dig",
) -> None:
    rows = asyncio.run(_select(settings, which))
    if dry_run:
        if as_json:
            _print_json([{"id": r["id"], "route": r["route"], "would_replay": True} for r in rows])
        else:
            console.print(f"would replay {len(rows)} dead letter(s): {[r['id'] for r in rows]}")
        return
    who = by or operator()

    async def step(conn: Any, batch: list[int]) -> list[replay.ReplayResult]:
        return await operations.replay_batch(conn, batch, who, force=force, transition=transition)

    batches = asyncio.run(_in_batches(settings, [r["id"] for r in rows], step, "replaying"))
    results = [r for batch in batches for r in batch]
    replayed = sum(r.replayed for r in results)
    skipped = [r for r in results if not r.replayed]
    if as_json:
        _print_json({"replayed": replayed, "skipped": [r.__dict__ for r in skipped]})
    else:
        console.print(f"replayed {replayed} dead letter(s) through the outbox")
        for r in skipped:
            console.print(text(f"not replayed {r.id}: {r.detail}", style="yellow"))
    if skipped:
        raise typer.Exit(1)


@dlq_app.command("dig")
def dig_cmd(
    dead_letter_id: int,
    force: Annotated[
        bool, typer.Option("--force", help="Replay even if it was replayed or discarded.")
    ] = False,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay one dead letter (seed 004's dig)."""
    settings = load_settings()
    status = None if force else "buried"
    rows = asyncio.run(_select(settings, dead_letters.Filter(ids=[dead_letter_id])))
    if not rows:
        console.print(f"[red]no dead letter {dead_letter_id}[/red]")
        raise typer.Exit(1)
    if status and rows[0]["status"] != status:
        r = rows[0]
        console.print(
            text(
                f"dead letter {dead_letter_id} is {r['status']} "
                f"({r['replayed_by'] or r['discarded_by']} at "
                f"{r['replayed_at'] or r['discarded_at']}); use --force to replay it again "
                "(the inbox still drops it if it was applied)",
                style="yellow",
            )
        )
        raise typer.Exit(1)
    _replay(
        settings, dead_letters.Filter(ids=[dead_letter_id]), by=by, force=force, as_json=as_json
    )


@dlq_app.command("plow")
def plow_cmd(count: int, by: ByOpt = None, as_json: JsonOpt = False) -> None:
    """Replay the COUNT oldest buried dead letters (seed 004's plow)."""
    settings = load_settings()
    _replay(
        settings,
        dead_letters.Filter(status="buried", limit=count),
        by=by,
        as_json=as_json,
        transition="plow",
    )


@dlq_app.command("replay")
def replay_cmd(
    route: RouteOpt = None,
    error: ErrorOpt = None,
    group: GroupOpt = None,
    since: SinceOpt = None,
    ids: Annotated[list[int] | None, typer.Option("--id", help="These ids (repeatable).")] = None,
    limit: LimitOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only say what would go.")] = False,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay every buried dead letter that matches, oldest first, once each."""
    settings = load_settings()
    which = dead_letters.Filter(
        ids=ids or (),
        route=route,
        error=error,
        group=group,
        since=parse_since(since),
        status="buried",
        limit=limit,
    )
    _replay(settings, which, by=by, dry_run=dry_run, as_json=as_json)


@dlq_app.command("discard")
def discard_cmd(
    ids: Annotated[list[int] | None, typer.Argument(help="Dead letter ids.")] = None,
    route: RouteOpt = None,
    error: ErrorOpt = None,
    group: GroupOpt = None,
    since: SinceOpt = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every buried one (required without a filter).")
    ] = False,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give up on buried dead letters; the messages they held back are released in order."""
    if not (ids or route or error or group or since or every):
        raise typer.BadParameter("name ids or a filter, or pass --all")
    settings = load_settings()
    which = dead_letters.Filter(
        ids=ids or (),
        route=route,
        error=error,
        group=group,
        since=parse_since(since),
        status="buried",
    )
    rows = asyncio.run(_select(settings, which))
    who = by or operator()

    async def step(conn: Any, batch: list[int]) -> int:
        return await operations.discard_batch(conn, batch, who)

    discarded = sum(asyncio.run(_in_batches(settings, [r["id"] for r in rows], step, "discarding")))
    if as_json:
        _print_json({"discarded": discarded})
    else:
        console.print(f"discarded {discarded} dead letter(s)")


@dlq_app.command("purge")
def purge_cmd(
    older_than: Annotated[str, typer.Option("--older-than", help="A duration: 30d, 12h, …")],
    as_json: JsonOpt = False,
) -> None:
    """Delete replayed and discarded dead letters older than a duration (never buried ones)."""
    age = parse_duration(older_than)
    settings = load_settings()

    purged = _query(settings, lambda conn: dead_letters.purge(conn, age))
    if as_json:
        _print_json({"purged": purged})
    else:
        console.print(f"purged {purged} dead letter(s) older than {older_than}")


@dlq_app.command("ingest")
def ingest_cmd() -> None:
    """Run only the dead-letter ingester (`pkgq run` with no routes runs it too)."""
    from consumers.runner import run_consumers
    from consumers.runtime import services, stop_on_signals

    settings = load_settings(logs_to_stdout=True)

    async def go() -> int:
        stop = stop_on_signals()
        async with services(settings, "dlq-ingest") as svc:
            return await run_consumers(settings, svc, [], stop, ingest=True)

    raise typer.Exit(asyncio.run(go()))
