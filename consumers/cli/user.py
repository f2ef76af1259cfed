"""`pkgq user`: one user's queue as node management would see it now, and the operator's
commands on its items (published like any other command, with a reason and who sent it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Annotated, Any
from uuid import UUID

import typer

from consumers import operations
from consumers.cli import exit_codes
from consumers.cli.history import history_cmd
from consumers.cli.options import JsonOpt, operator
from consumers.cli.output import Column, console, say, show, table, text
from consumers.cli.running import connected, load_settings, run
from consumers.queue_view import item_row
from domain.queue import UserQueue
from infra.postgres import read_api
from infra.postgres.pool import Conn
from infra.settings import Settings

user_app = typer.Typer(help="Inspect and administer one user's package queue.")

Reason = Annotated[
    str | None, typer.Option(help="Why (stored in the item's audit trail, 500 characters at most).")
]


async def summary(conn: Conn, user_id: UUID) -> dict[str, Any]:
    """The user's state in one statement (the read API's user_state), on the clock pkgq
    expires by."""
    state = await read_api.user_state(conn, user_id)
    now, items = state.now, state.items
    current = UserQueue(user_id, items=items).current_at(now)
    rows = [item_row(i, now) for i in items]
    return {
        "user_id": str(user_id),
        "as_of": now.isoformat(),
        "current": next((r for r in rows if current and r["id"] == current.id), None),
        # the access row's columns, as `SELECT *` gave them
        "access": {"user_id": user_id, **asdict(state.access)} if state.access else None,
        "unbilled": (
            {"upload": state.unbilled[0], "download": state.unbilled[1]} if state.unbilled else None
        ),
        "packages": rows,
    }


def _unlimited(key: str) -> Column:
    return (key, lambda r: "unlimited" if r[key] is None else str(r[key]))


_ITEM_COLUMNS: list[Column] = [
    ("id", lambda r: str(r["id"])),
    ("package", lambda r: text(r["package"])),
    ("status", lambda r: r["status"] + (" (timer pending)" * r["expired_by_time_pending_timer"])),
    ("activated_at", lambda r: r["activated_at"] or ""),
    ("expire_at", lambda r: r["expire_at"] or ""),
    ("used", lambda r: str(r["used"])),
    _unlimited("quota"),
    ("left", lambda r: "unlimited" if r["remaining"] is None else str(r["remaining"])),
]


def _print_summary(summary: dict[str, Any]) -> None:
    current = summary["current"]
    grant, unbilled = summary["access"], summary["unbilled"]
    say("user ", text(summary["user_id"], style="bold"))
    say(f"current: {current['id'] if current else 'none'}")
    say(f"access: {'granted' if grant and grant['granted'] else 'revoked/none'}")
    if unbilled:
        say(f"unbilled: up={unbilled['upload']} down={unbilled['download']}")
    console().print(table(summary["packages"], _ITEM_COLUMNS))


@user_app.command("show")
def user_show(user_id: UUID, as_json: JsonOpt = False) -> None:
    """Current package, access, and all packages of USER_ID (quota and remaining: null or
    'unlimited' for unlimited traffic)."""
    settings = load_settings()
    shown = run(connected(settings, lambda conn: summary(conn, user_id)))
    show(shown, as_json, _print_summary)


async def _item_command(settings: Settings, command: Callable[[Conn], Awaitable[UUID]]) -> UUID:
    """Run one of consumers/operations.py's item commands in a transaction (the console runs
    the same); an unknown item is exit status 3."""

    async def in_transaction(conn: Conn) -> UUID:
        async with conn.transaction():
            return await command(conn)

    try:
        return await connected(settings, in_transaction)
    except operations.UnknownItemError as exc:
        exit_codes.fail(exit_codes.NOT_FOUND, exc)


def _published(message_id: UUID, as_json: bool) -> None:
    show(message_id, as_json, print, data={"message_id": str(message_id)})


@user_app.command("cancel")
def user_cancel(item_id: int, reason: Reason = None, as_json: JsonOpt = False) -> None:
    """Cancel queue item ITEM_ID (put in the outbox for telecom.package_cancel, with the reason
    and you as the operator; announced as telecom.package_cancelled once applied)."""
    settings = load_settings()
    who = operator()
    command = _item_command(settings, lambda c: operations.cancel_item(c, item_id, who, reason))
    _published(run(command), as_json)


@user_app.command("adjust-quota")
def user_adjust_quota(
    item_id: int,
    delta: Annotated[int, typer.Argument(help="Bytes, may be < 0.")],
    reason: Reason = None,
    as_json: JsonOpt = False,
) -> None:
    """Add DELTA bytes to ITEM_ID's quota adjustment (put in the outbox for
    telecom.quota_adjust, with the reason and you as the operator). Refused for an item with
    unlimited traffic."""
    settings = load_settings()
    who = operator()
    command = _item_command(
        settings, lambda c: operations.adjust_quota(c, item_id, delta, who, reason)
    )
    _published(run(command), as_json)


# Last, as it always was: its code is with `pkgq find` (history.py), as both read the timeline.
user_app.command("history")(history_cmd)
