"""`pkgq user`: one user's queue as node management would see it now, and the operator's
commands on its items (published like any other command, with a reason and who sent it)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import typer

from consumers.cli import exit_codes
from consumers.cli.options import JsonOpt, operator
from consumers.cli.output import Column, console, say, show, table, text
from consumers.cli.running import connected, load_settings, publish, run
from domain.model import QueueItem
from domain.queue import UserQueue
from events.models import AdjustQuota, CancelPackage
from events.routes import PACKAGE_CANCEL, QUOTA_ADJUST
from infra.postgres import access, queue_repo
from infra.postgres.pool import Conn, clock
from infra.settings import Settings

user_app = typer.Typer(help="Inspect and administer one user's package queue.")

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
        "used": item.used,
        "adjust_quota": item.adjust_quota,
        "quota": item.quota,
        "remaining": item.remaining if status.value in ("active", "in_queue") else 0,
    }


async def _summary(conn: Conn, user_id: UUID) -> dict[str, Any]:
    items = await queue_repo.load_user_items(conn, user_id)
    grant = await access.get_access(conn, user_id)
    user = await queue_repo.user_row(conn, user_id)
    now = await clock(conn)  # the clock pkgq expires by
    current = UserQueue(user_id, items=items).current_at(now)
    rows = [item_row(i, now) for i in items]
    return {
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
    console.print(table(summary["packages"], _ITEM_COLUMNS))


@user_app.command("show")
def user_show(user_id: UUID, as_json: JsonOpt = False) -> None:
    """Current package, access, and all packages of USER_ID (quota and remaining: null or
    'unlimited' for unlimited traffic)."""
    settings = load_settings()
    summary = run(connected(settings, lambda conn: _summary(conn, user_id)))
    show(summary, as_json, _print_summary)


async def _owner(settings: Settings, item_id: int) -> UUID:
    owner = await connected(settings, lambda conn: queue_repo.item_owner(conn, item_id))
    if owner is None:
        exit_codes.fail(exit_codes.NOT_FOUND, f"no queue item {item_id}")
    return owner


def _published(message_id: UUID, as_json: bool) -> None:
    show(message_id, as_json, print, data={"message_id": str(message_id)})


@user_app.command("cancel")
def user_cancel(item_id: int, reason: Reason = None, as_json: JsonOpt = False) -> None:
    """Cancel queue item ITEM_ID (published to telecom.package_cancel, with the reason and
    you as the operator; announced as telecom.package_cancelled once applied)."""
    settings = load_settings()

    async def go() -> UUID:
        owner = await _owner(settings, item_id)
        body = CancelPackage(user_id=owner, item_id=item_id, reason=reason, operator=operator())
        return await publish(settings, PACKAGE_CANCEL, body)

    _published(run(go()), as_json)


@user_app.command("adjust-quota")
def user_adjust_quota(
    item_id: int,
    delta: Annotated[int, typer.Argument(help="Bytes, may be < 0.")],
    reason: Reason = None,
    as_json: JsonOpt = False,
) -> None:
    """Add DELTA bytes to ITEM_ID's quota adjustment (published to telecom.quota_adjust, with
    the reason and you as the operator). Refused for an item with unlimited traffic."""
    settings = load_settings()

    async def go() -> UUID:
        owner = await _owner(settings, item_id)
        body = AdjustQuota(
            user_id=owner, item_id=item_id, delta=delta, reason=reason, operator=operator()
        )
        return await publish(settings, QUOTA_ADJUST, body)

    _published(run(go()), as_json)
