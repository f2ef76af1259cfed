"""`pkgq user history USER_ID`: the user's timeline (as the console's /users/{id}/timeline),
newest first, a page at a time; `pkgq find MESSAGE_ID`: every place a message is recorded.
Both print the rows of consumers/timeline_view.py with `--json` (documented in
docs/explanation/cli.md)."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

import typer

from consumers import timeline_view
from consumers.cli import exit_codes
from consumers.cli.options import JsonOpt
from consumers.cli.output import Column, console, field, say, short, show
from consumers.cli.output import table as table_of
from consumers.cli.running import load_settings, on_database
from infra.postgres import message_search, timeline
from infra.postgres.pool import Conn

HISTORY_MAX = 1000

_ENTRY_COLUMNS: list[Column] = [
    ("at", lambda r: r["at"][:23].replace("T", " ")),
    ("what", lambda r: f"{r['source']} {r['kind']}"),
    ("summary", field("summary", 90)),
    ("message", lambda r: (r["message_id"] or "")[:8]),
    ("body", lambda r: short(r["body"], 50)),
]
_PLACE_COLUMNS: list[Column] = [
    ("at", lambda r: (r["at"] or "")[:23].replace("T", " ")),
    ("where", field("place")),
    ("state", field("state", 60)),
    ("route", field("route")),
    ("user", field("user_id")),
    ("dead letter", lambda r: str(r["dead_letter_id"] or "")),
]


def history_cmd(
    user_id: UUID,
    limit: Annotated[
        int, typer.Option(min=1, max=HISTORY_MAX, help="Entries on the page (newest first).")
    ] = 50,
    after: Annotated[
        str | None, typer.Option(help="The `next` cursor of the previous page: older entries.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """USER_ID's timeline, newest first: messages received and put in the outbox, item
    transitions, usage billed, retries, holds, parked messages, dead letters, replays and
    operator actions. JSON: {"user_id", "entries": [...], "next": cursor or null}."""
    try:
        start = timeline.position_of(after) if after is not None else None
    except ValueError as exc:
        exit_codes.fail(exit_codes.USAGE, f"--after: {exc}")

    async def read(conn: Conn) -> timeline.Page:
        return await timeline.page(conn, user_id, start, limit)

    found = on_database(load_settings(), read)
    entries = timeline_view.rows(found.entries)
    data: dict[str, Any] = {
        "user_id": str(user_id),
        "entries": entries,
        "next": entries[-1]["cursor"] if found.more and entries else None,
    }

    def render(shown: dict[str, Any]) -> None:
        console().print(table_of(shown["entries"], _ENTRY_COLUMNS))
        if shown["next"]:
            say("older: --after ", shown["next"])

    show(data, as_json, render)


def find_cmd(message_id: UUID, as_json: JsonOpt = False) -> None:
    """Every place MESSAGE_ID is recorded (inbox, outbox, parked, holds, attempts, dead
    letters, item audit, operator actions, billed usage), oldest first; exit status 3 when it
    is nowhere."""

    async def read(conn: Conn) -> list[message_search.Place]:
        return await message_search.find(conn, message_id)

    found = timeline_view.places(on_database(load_settings(), read))
    show(found, as_json, lambda rows: console().print(table_of(rows, _PLACE_COLUMNS)))
    if not found:
        exit_codes.fail(exit_codes.NOT_FOUND, f"message {message_id} is recorded nowhere")


def register(app: typer.Typer) -> None:
    """Add `find` to the `pkgq` app (`user history` is added by user.py, with the user group)."""
    app.command("find")(find_cmd)
