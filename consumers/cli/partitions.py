"""`pkgq partitions …`: see a route's partition queues, and pause its relaying to change them.

Changing a route's partition count moves users between queues. To do it without reordering or
losing anything in flight (docs/how-to/partitions.md):
pause the route, let its queues drain, stop its consumers, change PKGQ_PARTITIONS everywhere,
start them again, resume.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from consumers.cli.options import ByOpt, JsonOpt, operator, route_argument
from consumers.cli.output import Column, console, say, show, table
from consumers.cli.running import connected, load_settings, on_database, run
from infra.postgres import outbox
from infra.rabbit.management import queue_depths
from infra.settings import Settings

partitions_app = typer.Typer(
    help="A route's partition queues; pause and resume its relaying to change their number."
)
RouteArg = Annotated[str, typer.Argument(help="The route, e.g. usage_record.")]

_QUEUE_COLUMNS: list[Column] = [
    ("queue", lambda q: q["queue"]),
    ("binding key", lambda q: q["binding"]),
    ("ready", lambda q: str(q["ready"])),
    ("consumers", lambda q: str(q["consumers"])),
]


async def _status(settings: Settings, name: str) -> dict[str, Any]:
    state = await connected(settings, lambda conn: outbox.route_status(conn, name))
    state["queues"] = await queue_depths(settings, name)
    state["partitions"] = settings.partitions_for(name)
    state["route"] = name
    return state


def _print_status(state: dict[str, Any]) -> None:
    paused = (
        f"paused since {state['paused_at']} by {state['paused_by']}"
        if state["paused_at"]
        else "relaying"
    )
    say(
        f"{state['route']}: {state['partitions']} partition(s), {paused}, "
        f"{state['pending']} pending in the outbox"
    )
    console().print(table(state["queues"], _QUEUE_COLUMNS))


@partitions_app.command("status")
def status_cmd(route: RouteArg, as_json: JsonOpt = False) -> None:
    """The route's partition count here, its queues' depth, whether its relaying is paused."""
    settings = load_settings()
    show(run(_status(settings, route_argument(route).name)), as_json, _print_status)


def _changed(name: str, changed: bool, done: str, already: str, as_json: bool) -> None:
    state = done if changed else already
    data = {"route": name, "changed": changed, "state": state}
    show(data, as_json, lambda _: say(f"{name}: {state}"))


@partitions_app.command("pause")
def pause_cmd(route: RouteArg, by: ByOpt = None, as_json: JsonOpt = False) -> None:
    """Hold the route's outbox rows back from every relay (they wait, in order); returns once
    relay rounds under way have finished."""
    settings = load_settings()
    name = route_argument(route).name
    paused = on_database(settings, lambda conn: outbox.pause_route(conn, name, by or operator()))
    _changed(name, paused, "paused", "was paused already", as_json)


@partitions_app.command("resume")
def resume_cmd(route: RouteArg, as_json: JsonOpt = False) -> None:
    """Let the relays publish the route's rows again."""
    settings = load_settings()
    name = route_argument(route).name
    resumed = on_database(settings, lambda conn: outbox.resume_route(conn, name))
    _changed(name, resumed, "resumed", "was not paused", as_json)
