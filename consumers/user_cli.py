"""`pkgq user`: one user's queue as node management would see it now, and the operator's
commands on its items (published like any other command, with a reason and who sent it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.table import Table

from consumers import operations
from consumers.cli_support import load_settings, operator, text
from consumers.queue_view import item_row
from domain.model import QueueItem
from domain.queue import UserQueue
from infra.postgres import access, queue_repo
from infra.postgres.pool import Conn, clock, database
from infra.settings import Settings

user_app = typer.Typer(help="Inspect and administer one user's package queue.")
console = Console()

Reason = Annotated[
    str | None, typer.Option(help="Why (stored in the item's audit trail, 500 characters at most).")
]


@user_app.command("show")
def user_show(
    user_id: UUID,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Current package, access, and all packages of USER_ID (quota and remaining: null or
    'unlimited' for unlimited traffic)."""
    settings = load_settings()

    async def go() -> tuple[list[QueueItem], Any, Any, datetime]:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            items = await queue_repo.load_user_items(conn, user_id)
            grant = await access.get_access(conn, user_id)
            user = await queue_repo.user_row(conn, user_id)
            now = await clock(conn)  # the clock pkgq expires by
            return items, grant, user, now

    items, grant, user, now = asyncio.run(go())
    current = UserQueue(user_id, items=items).current_at(now)
    rows = [item_row(i, now) for i in items]
    summary = {
        "user_id": str(user_id),
        "as_of": now.isoformat(),
        "current": next((r for r in rows if current and r["id"] == current.id), None),
        "access": dict(grant) if grant else None,
        "unbilled": (
            {"upload": user["unbilled_upload"], "download": user["unbilled_download"]}
            if user
            else None
        ),
        "packages": rows,
    }
    if as_json:
        print(json.dumps(summary, default=str, indent=2))
        return
    console.print(f"user [bold]{user_id}[/bold]")
    console.print(f"current: {current.id if current else 'none'}")
    console.print(f"access: {'granted' if grant and grant['granted'] else 'revoked/none'}")
    if user:
        console.print(f"unbilled: up={user['unbilled_upload']} down={user['unbilled_download']}")
    table = Table("id", "package", "status", "activated_at", "expire_at", "used", "quota", "left")
    for i, row in zip(items, rows, strict=True):
        table.add_row(
            str(i.id),
            text(i.terms.package_name),
            row["status"] + (" (timer pending)" if row["expired_by_time_pending_timer"] else ""),
            str(i.activated_at or ""),
            str(i.expire_at or ""),
            str(i.used),
            "unlimited" if i.quota is None else str(i.quota),
            "unlimited" if row["remaining"] is None else str(row["remaining"]),
        )
    console.print(table)


async def _item_command(settings: Settings, command: Callable[[Conn], Awaitable[UUID]]) -> UUID:
    """Run one of consumers/operations.py's item commands (the console runs the same)."""
    async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
        try:
            async with conn.transaction():
                return await command(conn)
        except operations.UnknownItemError as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(1) from None


@user_app.command("cancel")
def user_cancel(item_id: int, reason: Reason = None) -> None:
    """Cancel queue item ITEM_ID (put in the outbox for telecom.package_cancel, with the reason
    and you as the operator; announced as telecom.package_cancelled once applied)."""
    settings = load_settings()
    who = operator()
    print(
        asyncio.run(
            _item_command(settings, lambda c: operations.cancel_item(c, item_id, who, reason))
        )
    )


@user_app.command("adjust-quota")
def user_adjust_quota(
    item_id: int,
    delta: Annotated[int, typer.Argument(help="Bytes, may be < 0.")],
    reason: Reason = None,
) -> None:
    """Add DELTA bytes to ITEM_ID's adjust_quota (put in the outbox for telecom.quota_adjust,
    with the reason and you as the operator). Refused for an item with unlimited traffic."""
    settings = load_settings()
    who = operator()
    print(
        asyncio.run(
            _item_command(
                settings, lambda c: operations.adjust_quota(c, item_id, delta, who, reason)
            )
        )
    )
