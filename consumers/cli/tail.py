"""`pkgq tail`: a live view of the messages crossing the exchange and the dead-letter exchange.

It binds a temporary queue of its own (`pkgq.tail.<random>`, exclusive, deleted when it
disconnects) to each exchange with `#`, so it sees every message without taking any from
pkgq's queues, and prints one line per message: time, route, type, user, message_id and, for a
dead letter, why it died. Every value comes from whoever published the message, so text lines
are made printable (infra/terminal.py) and JSON lines escape control characters as JSON does.
It stops cleanly on SIGINT (Ctrl-C) or SIGTERM.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

import structlog
import typer

from consumers.cli.options import route_argument
from consumers.cli.running import load_settings, run
from consumers.runtime import stop_on_signals
from events.envelope import H_DEAD_REASON, H_USER_ID
from events.partitioning import route_of_key
from events.routes import ALL_ROUTES
from infra.rabbit.connection import open_amqp
from infra.rabbit.tap import Tap, Tapped
from infra.settings import Settings
from infra.terminal import printable

log = structlog.get_logger(__name__)


def tail_queues(settings: Settings) -> str:
    """What `pkgq tail`'s queues are named after (`pkgq.tail.<random>`): the operator role may
    declare, bind and consume those (infra/rabbit/roles.py), and no other of pkgq's queues."""
    return f"{settings.queue_prefix}.tail"


def dead_reason(tapped: Tapped) -> str:
    """Why a message reached the dead-letter exchange: pkgq's own reason (a last-resort copy)
    or the broker's (`x-death`: rejected, expired, maxlen, delivery_limit)."""
    reason = tapped.headers.get(H_DEAD_REASON)
    if reason is None:
        deaths = tapped.headers.get("x-death")
        first = deaths[0] if isinstance(deaths, list) and deaths else None
        reason = first.get("reason") if isinstance(first, dict) else None
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    return "unknown" if reason is None else str(reason)


def _user(tapped: Tapped) -> str | None:
    user = tapped.headers.get(H_USER_ID)
    if user is None:
        try:
            body = tapped.json()
        except ValueError:
            return None
        user = body.get("user_id") if isinstance(body, dict) else None
    return None if user is None else str(user)


def describe(tapped: Tapped, settings: Settings, at: datetime) -> dict[str, Any]:
    """One message as `pkgq tail` shows it (the JSON line; the text line is made from it)."""
    dead = tapped.exchange == settings.dlx
    line: dict[str, Any] = {
        "time": at.isoformat(timespec="milliseconds"),
        "exchange": tapped.exchange,
        "route": route_of_key(tapped.routing_key),
        "type": tapped.message_type,
        "user_id": _user(tapped),
        "message_id": tapped.message_id,
        "outcome": "dead_lettered" if dead else "published",
    }
    if dead:
        line["reason"] = dead_reason(tapped)
    return line


def text_line(line: dict[str, Any]) -> str:
    """A JSON line as one line of printable text."""
    outcome = line["outcome"] + (f" reason={line['reason']}" if "reason" in line else "")
    fields = (line["route"], line["type"], line["user_id"], line["message_id"], outcome)
    return printable(
        line["time"][11:23] + " " + " ".join("-" if f is None else str(f) for f in fields)
    ).replace("\n", "\\n")


def _wanted(
    route: str | None, user: UUID | None, dead_only: bool, settings: Settings
) -> Callable[[dict[str, Any]], bool]:
    def wanted(line: dict[str, Any]) -> bool:
        return (
            (route is None or line["route"] == route)
            and (user is None or line["user_id"] == str(user))
            and (not dead_only or line["exchange"] == settings.dlx)
        )

    return wanted


async def _tail(
    settings: Settings, wanted: Callable[[dict[str, Any]], bool], as_json: bool
) -> None:
    stop = stop_on_signals()

    def received(tapped: Tapped) -> None:
        line = describe(tapped, settings, datetime.now(UTC))
        if not wanted(line):
            return
        try:
            print(json.dumps(line) if as_json else text_line(line), flush=True)
        except BrokenPipeError:  # the reader went away (`pkgq tail | head`): stop quietly
            stop.set()

    amqp = await open_amqp(settings, "pkgq-tail")
    tap = Tap(received, keep=False)
    try:
        await tap.attach(amqp, settings.exchange, settings.dlx, prefix=tail_queues(settings))
        log.info("tail_started", exchanges=[settings.exchange, settings.dlx])
        await stop.wait()
    finally:
        await tap.close()
        await amqp.close()


def tail_cmd(
    route: Annotated[
        str | None, typer.Option("--route", help="Only this route (e.g. usage_record).")
    ] = None,
    user: Annotated[UUID | None, typer.Option("--user", help="Only this user's messages.")] = None,
    dead_letters: Annotated[
        bool, typer.Option("--dead-letters", help="Only dead letters (the DLX).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object a line.")] = False,
) -> None:
    """Watch the messages crossing the exchange and the dead-letter exchange, live, one line
    each: time, route, type, user, message_id, and why a dead letter died. Ctrl-C stops it."""
    name = None if route is None else route_argument(route, among=ALL_ROUTES).name
    settings = load_settings()
    run(_tail(settings, _wanted(name, user, dead_letters, settings), as_json))


def register(app: typer.Typer) -> None:
    """Add `tail` to the `pkgq` app."""
    app.command("tail")(tail_cmd)
