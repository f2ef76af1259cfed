"""`pkgq user`: one user's queue as node management would see it now, and the operator's
commands on its items (published like any other command, with a reason and who sent it)."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.table import Table

from consumers import publishing
from consumers.cli.support import load_settings, operator, text
from domain.model import QueueItem
from domain.queue import UserQueue
from events.models import AdjustQuota, CancelPackage, WireModel
from events.routes import PACKAGE_CANCEL, QUOTA_ADJUST, Route
from infra.postgres import access, queue_repo
from infra.postgres.pool import clock, database
from infra.rabbit.connection import connect
from infra.settings import Settings

user_app = typer.Typer(help="Inspect and administer one user's package queue.")
console = Console()

Reason = Annotated[
    str | None, typer.Option(help="Why (stored in the item's audit trail, 500 characters at most).")
]


def item_row(item: QueueItem, now: datetime) -> dict[str, Any]:
    """One item as `user show` reports it: its status as the clock sees it (an active item past
    its expire_at is consumed, even while its timer is on its way), and its own terms."""
    status = item.status_at(now)
    return {
        "id": item.id,
        "package": item.terms.package_name,
        "package_id": item.package_id,
        "status": status.value,
        "expired_by_time_pending_timer": status is not item.status,
        "by_order": str(item.by_order) if item.by_order else None,
        "created_at": item.created_at.isoformat(),
        "activated_at": item.activated_at.isoformat() if item.activated_at else None,
        "expire_at": item.expire_at.isoformat() if item.expire_at else None,
        "traffic_limit": item.terms.traffic_limit,
        "duration_s": (
            int(item.terms.duration.total_seconds()) if item.terms.duration is not None else None
        ),
        "upload": item.upload,
        "download": item.download,
        "adjust_quota": item.adjust_quota,
        "quota": item.quota,
        "remaining": item.remaining if status.value in ("active", "in_queue") else 0,
    }


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


async def _item_owner(settings: Settings, item_id: int) -> UUID:
    async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
        owner = await queue_repo.item_owner(conn, item_id)
    if owner is None:
        console.print(f"[red]no queue item {item_id}[/red]")
        raise typer.Exit(1)
    return owner


async def _publish(settings: Settings, route: Route, body: WireModel) -> UUID:
    conn = await connect(settings.amqp_url, "pkgq-cli")
    try:
        return await publishing.publish(settings, conn, route, body)
    finally:
        await conn.close()


@user_app.command("cancel")
def user_cancel(item_id: int, reason: Reason = None) -> None:
    """Cancel queue item ITEM_ID (published to telecom.package_cancel, with the reason and
    you as the operator; announced as telecom.package_cancelled once applied)."""
    settings = load_settings()

    async def go() -> UUID:
        owner = await _item_owner(settings, item_id)
        body = CancelPackage(user_id=owner, item_id=item_id, reason=reason, operator=operator())
        return await _publish(settings, PACKAGE_CANCEL, body)

    print(asyncio.run(go()))


@user_app.command("adjust-quota")
def user_adjust_quota(
    item_id: int,
    delta: Annotated[int, typer.Argument(help="Bytes, may be < 0.")],
    reason: Reason = None,
) -> None:
    """Add DELTA bytes to ITEM_ID's adjust_quota (published to telecom.quota_adjust, with the
    reason and you as the operator). Refused for an item with unlimited traffic."""
    settings = load_settings()

    async def go() -> UUID:
        owner = await _item_owner(settings, item_id)
        body = AdjustQuota(
            user_id=owner, item_id=item_id, delta=delta, reason=reason, operator=operator()
        )
        return await _publish(settings, QUOTA_ADJUST, body)

    print(asyncio.run(go()))
