"""`pkgq dlq …` that reads: list, show, groups and holds (the changes are in dlq_changes.py,
the replay runs in dlq_replay.py), and `pkgq dlq ingest`.

Everything taken from a message (type, route, error text, traceback, headers, body) is printed
as literal text (output.text): never as rich markup, never with terminal control characters.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.text import Text

from consumers.cli import dlq_changes, dlq_replay, exit_codes
from consumers.cli.dlq_changes import ErrorOpt, GroupOpt, RouteOpt, SinceOpt
from consumers.cli.options import JsonOpt
from consumers.cli.output import Column, console, field, moment, short, show, show_table, text
from consumers.cli.running import load_settings, on_database, run
from events import bounded_json
from events.identity import claimed_user
from infra.gc_tuning import tune_for_throughput
from infra.postgres import dead_letters, holds
from infra.postgres.pool import Conn

dlq_app = typer.Typer(
    help="Dead letters (messages that could not be applied): list, show, group, replay, "
    "discard, purge; and the users they hold back."
)

_SHOWN = (
    *("id", "status", "source", "route", "consumer", "message_id", "message_type", "user_id"),
    *("claimed_user_id", "publisher"),
    *("reason", "error_type", "error_message", "error_location", "group_key", "attempts"),
    *("first_failed_at", "last_failed_at", "repeats", "body_size", "body_sha256"),
    *("replay_count", "replayed_at", "replayed_by", "discarded_at", "discarded_by", "held_back"),
)


@dlq_app.command("list")
def list_cmd(
    route: RouteOpt = None,
    error: ErrorOpt = None,
    group: GroupOpt = None,
    since: SinceOpt = None,
    status: Annotated[
        str | None,
        typer.Option("--status", help="buried, replayed, discarded or all (the default)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N.")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Dead letters, oldest first, with how many later messages of its user each holds back."""
    which = dlq_changes.matching(route, error, group, since, status=status, limit=limit)
    settings = load_settings()
    columns: list[Column] = [
        ("id", lambda r: str(r["id"])),
        ("status", field("status")),
        ("route", field("route")),
        ("reason", field("reason")),
        ("error", lambda r: short(f"{r['error_type']}: {r['error_message']}", 60)),
        ("tries", lambda r: str(r["attempts"])),
        ("first failed", moment("first_failed_at")),
        ("holds", lambda r: str(r["held_back"] or "")),
    ]
    rows = on_database(settings, lambda conn: dead_letters.find(conn, which))
    show_table(rows, as_json, columns, footer=f"{len(rows)} shown (limit {limit})")


def _print_dead_letter(row: dict[str, Any]) -> None:
    for key in _SHOWN:
        console().print(Text.assemble((f"{key:>15}", "bold"), "  ", text(row.get(key))))
    # JSON escapes every control character (ESC as \u001b); printed as text, not markup.
    for key in ("headers", "body"):
        console().print(Text(key, style="bold"))
        console().print(text(json.dumps(row[key], indent=2, default=str)))
    if row.get("traceback"):
        console().print(Text("traceback", style="bold"))
        console().print(text(row["traceback"]))


@dlq_app.command("show")
def show_cmd(dead_letter_id: int, as_json: JsonOpt = False) -> None:
    """One dead letter: its body, headers, error and traceback."""
    settings = load_settings()
    row = on_database(settings, lambda conn: dead_letters.get(conn, dead_letter_id))
    if row is None:
        exit_codes.fail(exit_codes.NOT_FOUND, f"no dead letter {dead_letter_id}")
    body = bytes(row.pop("body"))
    row["headers"] = dead_letters.as_dict(row["headers"])
    # what its x-user-id header says, when not the user it is filed under: a claim, not believed
    row["claimed_user_id"] = claimed_user(row["headers"], row["user_id"])
    row["body"] = bounded_json.parsed_or_text(body)  # as text when not JSON or too deep
    show(row, as_json, _print_dead_letter)


@dlq_app.command("holds")
def holds_cmd(
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Users whose later messages wait (parked) behind one of theirs: a message waiting for its
    retry, or a dead letter."""
    settings = load_settings()
    columns: list[Column] = [
        ("consumer", field("consumer")),
        ("user", lambda r: str(r["user_id"])),
        ("state", field("state")),
        ("blocker", lambda r: str(r["blocker"] or "")),
        ("tries", lambda r: str(r["attempts"])),
        ("parked", lambda r: str(r["parked"])),
        ("since", moment("since")),
        ("last error", field("last_error", 50)),
    ]
    show_table(on_database(settings, lambda conn: holds.overview(conn, limit)), as_json, columns)


@dlq_app.command("groups")
def groups_cmd(
    status: Annotated[
        str, typer.Option("--status", help="buried, replayed, discarded or all.")
    ] = "buried",
    as_json: JsonOpt = False,
) -> None:
    """Failures grouped by reason, error type and the line of code that raised them."""
    settings = load_settings()
    wanted = None if status == "all" else status

    async def find(conn: Conn) -> list[dict[str, Any]]:
        return await dead_letters.groups(conn, wanted)

    columns: list[Column] = [
        ("group", field("group_key")),
        ("count", lambda r: str(r["count"])),
        ("reason", field("reason")),
        ("error type", field("error_type")),
        ("raised at", field("error_location", 40)),
        ("routes", lambda r: text(", ".join(r["routes"]))),
        ("first", moment("first_seen", "%m-%d %H:%M:%S")),
        ("last", moment("last_seen", "%m-%d %H:%M:%S")),
    ]
    footer = "replay a group with `pkgq dlq replay --group GROUP`"
    show_table(on_database(settings, find), as_json, columns, footer=footer)


@dlq_app.command("ingest")
def ingest_cmd() -> None:
    """Run only the dead-letter ingester (`pkgq run` with no routes runs it too)."""
    from consumers.runner import run_consumers
    from consumers.runtime import services, stop_on_signals, with_partition_map

    settings = load_settings(logs_to_stdout=True)

    async def go() -> int:
        stop = stop_on_signals()
        routed = await with_partition_map(settings)
        async with services(routed, "dlq-ingest") as svc:
            tune_for_throughput()  # started (infra/gc_tuning.py)
            return await run_consumers(routed, svc, [], stop, ingest=True)

    raise typer.Exit(run(go()))


dlq_changes.register(dlq_app)
dlq_replay.register(dlq_app)
