"""A user's timeline and a message's whereabouts as plain rows, one shape for the console and
the CLI (`pkgq user history --json`, `pkgq find --json`): one line of summary per entry, its
body summarized (never raw), and the links the tables record.

Links, as recorded: a message's other places share its message_id (the outbox row that
published an event and the inbox row of the consumer that applied it; a dead letter and its
replay); a replay names its dead letter (the outbox row's dedup key); an operator action names
its item, dead letter and command. What a received message caused is not recorded as such:
`caused_by` lists the messages the user's consumers applied in the same transaction (the rows
share its now()), which is exact unless one batch applied several of the user's messages.
Only entries on the same page are linked."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from infra.postgres.console import body_summary
from infra.postgres.message_search import Place
from infra.postgres.timeline import Entry

SUMMARY_MAX = 300
"""Characters of a summary or a body shown on one line."""


def _cut(text: str, width: int = SUMMARY_MAX) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _short(message_id: object) -> str:
    return str(message_id)[:8] if message_id else "?"


def summary(e: Entry) -> str:
    """What happened, on one line."""
    d = e.detail
    if e.source == "inbox":
        return f"received and applied by {d.get('consumer')}"
    if e.source == "outbox":
        what = f"{d.get('message_type')} to {e.route}"
        if e.kind == "retry":
            return f"retry of {what} (attempt {d.get('attempt')}): {d.get('last_error') or ''}"
        if e.kind == "replay":
            return f"replay of dead letter #{e.dead_letter_id}: {what}"
        if e.kind == "scheduled":
            return f"{what} scheduled for {str(d.get('available_at'))[:19]}"
        return f"{what} put in the outbox" + (
            "" if d.get("published_at") else " (not published yet)"
        )
    if e.source == "item":
        order = f" (order {_short(d.get('by_order'))})" if d.get("by_order") else ""
        return f"item #{e.item_id} queued: {d.get('package')}{order}, now {d.get('status')}"
    if e.source == "activation":
        until = f", expires {str(d.get('expire_at'))[:19]}" if d.get("expire_at") else ""
        return f"item #{e.item_id} activated: {d.get('package')}{until}"
    if e.source == "usage":
        to = f"item #{e.item_id}" if e.item_id else "the user's unbilled usage"
        return (
            f"usage {d.get('usage_id')} billed to {to}: "
            f"{d.get('upload')} B up, {d.get('download')} B down"
        )
    if e.source == "audit":
        who = d.get("operator") or d.get("publisher") or "a publisher"
        reason = f": {d.get('reason')}" if d.get("reason") else ""
        if e.kind == "cancel":
            return f"item #{e.item_id} cancelled by {who}{reason}"
        return f"quota of item #{e.item_id} adjusted by {d.get('delta')} B by {who}{reason}"
    if e.source == "operator":
        target = f" item #{e.item_id}" if e.item_id else ""
        target += f" dead letter #{e.dead_letter_id}" if e.dead_letter_id else ""
        return f"operator {d.get('actor')}: {e.kind}{target}"
    if e.source == "dead_letter":
        if e.kind == "dead_lettered":
            return (
                f"dead-lettered from {e.route} (#{e.dead_letter_id}): {d.get('reason')}: "
                f"{d.get('error')}"
            )
        by = f" by {d.get('by')}" if d.get("by") else ""
        return f"dead letter #{e.dead_letter_id} {e.kind}{by}"
    if e.source == "hold":
        return (
            f"{d.get('consumer')} holds the user's later messages behind "
            f"{_short(e.message_id)} ({e.kind.removeprefix('held_')}, "
            f"{d.get('attempts')} attempt(s)): {d.get('last_error') or ''}"
        )
    if e.source == "parked":
        return f"{d.get('message_type')} parked in {d.get('consumer')} behind a hold"
    return f"{e.source} {e.kind}"


def _jsonable(key: str, value: Any) -> Any:
    """A detail's value as JSON; a body an operator action keeps (an edited replay's original
    and edited bodies) summarized like every other body."""
    if isinstance(value, UUID):
        return str(value)
    if key.endswith("_body") and value is not None:
        raw = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return _cut(body_summary(raw.encode()))
    return value


def rows(entries: list[Entry]) -> list[dict[str, Any]]:
    """The entries as the documented rows (docs/explanation/cli.md, "pkgq user history")."""
    received: dict[Any, list[str]] = {}
    for e in entries:
        if e.source == "inbox" and e.message_id is not None:
            received.setdefault(e.at, []).append(str(e.message_id))
    found = []
    for e in entries:
        mine = str(e.message_id) if e.message_id else None
        caused_by = [] if e.source == "inbox" else [m for m in received.get(e.at, []) if m != mine]
        found.append(
            {
                "at": e.at.isoformat(),
                "source": e.source,
                "kind": e.kind,
                "summary": _cut(summary(e)),
                "message_id": mine,
                "route": e.route,
                "item_id": e.item_id,
                "dead_letter_id": e.dead_letter_id,
                "body": _cut(body_summary(e.body)) if e.body is not None else None,
                "caused_by": caused_by,
                "detail": {k: _jsonable(k, v) for k, v in e.detail.items()},
                "cursor": e.position.cursor(),
            }
        )
    return found


def places(found: list[Place]) -> list[dict[str, Any]]:
    """Where a message is, as the documented rows (docs/explanation/cli.md, "pkgq find")."""
    return [
        {
            "place": p.place,
            "at": p.at.isoformat() if p.at else None,
            "user_id": str(p.user_id) if p.user_id else None,
            "route": p.route,
            "state": p.state,
            "dead_letter_id": p.dead_letter_id,
            "item_id": p.item_id,
            "detail": p.detail,
        }
        for p in found
    ]
