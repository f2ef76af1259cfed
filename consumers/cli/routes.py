"""`pkgq route pause|resume|status`: stop one route's consumption and start it again.

A pause lives in Postgres (telecom.consumer_pauses): every `pkgq run` replica reads it every
PKGQ_PAUSE_POLL seconds, cancels its subscriptions to the route's queues and gives back what
it held, so the route's messages wait on the broker in order; `resume` lets them drain, in
order. It survives restarts, and both are audited (`pkgq`'s operator actions, the console's
audit page). Not the same as `pkgq partitions pause`, which holds the relay's publishing back.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from consumers.cli import exit_codes
from consumers.cli.options import ByOpt, JsonOpt, operator, route_argument
from consumers.cli.output import Column, say, show, show_table
from consumers.cli.running import connected, load_routing_settings, load_settings, run
from events.routes import ROUTES
from infra.postgres import consumer_pauses
from infra.rabbit.management import queue_depths
from infra.settings import Settings

route_app = typer.Typer(
    help="Pause and resume a route's consumption on every replica; see which routes are paused."
)
RouteArg = Annotated[str, typer.Argument(help="The route, e.g. usage_record.")]
ReasonOpt = Annotated[
    str | None, typer.Option("--reason", help="Why: kept in the audit and shown on the overview.")
]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        help="Seconds to wait until no replica consumes the route's queues (0: do not wait).",
    ),
]

_COLUMNS: list[Column] = [
    ("route", lambda r: r["route"].removeprefix("telecom.")),
    ("state", lambda r: "paused" if r["paused"] else "consuming"),
    ("since", lambda r: (r["paused"] or {}).get("paused_at", "")[:16].replace("T", " ")),
    ("by", lambda r: (r["paused"] or {}).get("paused_by", "")),
    ("reason", lambda r: (r["paused"] or {}).get("reason") or ""),
    ("ready", lambda r: _total(r["queues"], "ready")),
    ("consumers", lambda r: _total(r["queues"], "consumers")),
]


def _total(queues: list[dict[str, Any]], key: str) -> str:
    known = [q[key] for q in queues if q[key] is not None]
    return str(sum(known)) if known else "?"


async def _status(settings: Settings, names: list[str]) -> list[dict[str, Any]]:
    paused = await connected(settings, consumer_pauses.paused)
    found = []
    for name in names:
        try:
            queues = await queue_depths(settings, name)
        except Exception:  # noqa: BLE001  (the broker is down: the pauses are still known)
            queues = []
        pause = paused.get(name)
        found.append(
            {"route": name, "paused": pause.as_dict() if pause else None, "queues": queues}
        )
    return found


async def _consumers_gone(
    settings: Settings, name: str, wait: float
) -> tuple[int | None, list[str]]:
    """Wait up to `wait` s until no consumer is subscribed to the route's queues: the consumers
    left (None: the broker could not be asked, or a queue is missing), and the route's queues
    the broker does not have (a queue that does not exist tells nothing: it is not waited for,
    nor counted as one that nobody consumes)."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        try:
            queues = await queue_depths(settings, name)
        except Exception:  # noqa: BLE001
            return None, []
        missing = [q["queue"] for q in queues if q["consumers"] is None]
        if missing:
            return None, missing
        left = sum(q["consumers"] for q in queues)
        if left == 0 or asyncio.get_running_loop().time() >= deadline:
            return left, []
        await asyncio.sleep(0.5)


@route_app.command("status")
def status_cmd(
    route: Annotated[str | None, typer.Argument(help="One route (default: every route).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Which routes are paused (since when, by whom, why), and each route's queued messages
    and subscribed consumers (0 consumers: every replica obeys the pause)."""
    settings = load_routing_settings()
    names = [route_argument(route).name] if route else list(ROUTES)
    show_table(run(_status(settings, names)), as_json, _COLUMNS)


@route_app.command("pause")
def pause_cmd(
    route: RouteArg,
    reason: ReasonOpt = None,
    by: ByOpt = None,
    wait: WaitOpt = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Stop the route's consumption on every replica (its messages wait on the broker, in
    order), then wait until no replica consumes it. Exit 5 if one still does after --wait, 6 if
    the broker has no queue of the route (the pause is recorded all the same)."""
    settings = load_routing_settings()
    name = route_argument(route).name
    who = by or operator()
    changed = run(connected(settings, lambda c: consumer_pauses.pause(c, name, who, reason)))
    left, missing = run(_consumers_gone(settings, name, wait)) if wait > 0 else (None, [])
    data = {
        "route": name,
        "changed": changed,
        "paused": True,
        "consumers_left": left,
        "missing_queues": missing,
    }

    def render(_: object) -> None:
        say(f"{name}: {'paused' if changed else 'was paused already'}")
        if missing:
            say(f"not confirmed: the broker has no queue {', '.join(missing)}")
        elif wait > 0 and left is None:
            say("could not ask the broker whether every replica obeyed")
        elif left:
            say(
                f"{left} consumer(s) still subscribed after {wait:g} s: a replica that is "
                "busy, cut off from Postgres, or of a release before 0.3.0 (which knows no pauses)"
            )
        elif wait > 0:
            say("no replica consumes it now")

    show(data, as_json, render)
    if missing:
        exit_codes.fail(
            exit_codes.MISMATCH,
            f"{name}: the broker has no queue {', '.join(missing)}, so whether every replica "
            "obeys the pause cannot be told (it is recorded: a replica that declares the queue "
            "starts paused). Is the topology provisioned on this broker, and are "
            "PKGQ_QUEUE_PREFIX and the route's partitions the replicas'?",
        )
    if left:
        raise typer.Exit(exit_codes.TIMEOUT)


@route_app.command("resume")
def resume_cmd(
    route: RouteArg, reason: ReasonOpt = None, by: ByOpt = None, as_json: JsonOpt = False
) -> None:
    """Let every replica consume the route again (its waiting messages drain in order)."""
    settings = load_settings()
    name = route_argument(route).name
    who = by or operator()
    changed = run(connected(settings, lambda c: consumer_pauses.resume(c, name, who, reason)))
    data = {"route": name, "changed": changed, "paused": False}
    show(data, as_json, lambda _: say(f"{name}: {'resumed' if changed else 'was not paused'}"))
