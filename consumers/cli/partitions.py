"""`pkgq partitions …`: see a route's partition queues and its recorded count, pause its
relaying, and change the count.

The deployment's partition map is recorded in Postgres (infra/postgres/route_partitions.py).
Changing a route's count moves users between queues. To do it without reordering or losing
anything in flight (docs/how-to/partitions.md): pause the route (or stop its publishers), let
its queues drain, stop its consumers, `set` the new count, start every pkgq process again,
resume.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from consumers.cli import exit_codes
from consumers.cli.options import ByOpt, JsonOpt, operator, route_argument
from consumers.cli.output import Column, console, say, show, table
from consumers.cli.running import (
    connected,
    load_routing_settings,
    load_settings,
    on_database,
    run,
)
from events.routes import ROUTES, Route
from infra.postgres import outbox, route_partitions
from infra.rabbit.management import queue_depths
from infra.settings import Settings

partitions_app = typer.Typer(
    help="A route's partition queues and recorded count; pause and resume its relaying, and "
    "set the count."
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
    rows = await connected(settings, route_partitions.recorded_rows)
    row = rows.get(name)
    state["recorded_at"] = row["recorded_at"] if row else None
    state["recorded_by"] = row["recorded_by"] if row else None
    return state


def _print_status(state: dict[str, Any]) -> None:
    paused = (
        f"paused since {state['paused_at']} by {state['paused_by']}"
        if state["paused_at"]
        else "relaying"
    )
    recorded = (
        f"recorded {state['recorded_at']} by {state['recorded_by']}"
        if state["recorded_at"]
        else "not recorded: as configured here"
    )
    say(
        f"{state['route']}: {state['partitions']} partition(s) ({recorded}), {paused}, "
        f"{state['pending']} pending in the outbox"
    )
    console().print(table(state["queues"], _QUEUE_COLUMNS))


@partitions_app.command("status")
def status_cmd(route: RouteArg, as_json: JsonOpt = False) -> None:
    """The route's partition count (the deployment's recorded one), its queues' depth, whether
    its relaying is paused."""
    settings = load_routing_settings()
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


def _not_ready(route: Route, state: dict[str, Any]) -> list[str]:
    """Why the route's count cannot change now (nothing: it can)."""
    problems = []
    # Every route's relaying: an inbound route's retries, replays and delayed publishes go
    # through the outbox too, and a relay routes them by the map it read at start-up.
    if not state["paused_at"]:
        problems.append(f"its relaying is not paused (`pkgq partitions pause {route.name}`)")
    for queue in state["queues"]:
        if queue["ready"]:
            problems.append(f"{queue['queue']} holds {queue['ready']} message(s)")
        if queue["consumers"]:
            problems.append(f"{queue['queue']} has {queue['consumers']} consumer(s)")
    return problems


def _as_recorded(settings: Settings, recorded: dict[str, int]) -> Settings:
    """`settings` with the recorded map, whatever map they configure: `set` may be what
    corrects a recorded count that the processes' PKGQ_PARTITIONS disagrees with."""
    routes = {
        name: own.model_copy(update={"partitions": None})
        for name, own in settings.route_settings.items()
    }
    return Settings.model_validate(
        {
            **settings.model_dump(),
            "partitions": {**settings.partition_map(), **recorded},
            "route_settings": routes,
        }
    )


async def _set(settings: Settings, route: Route, partitions: int, by: str) -> dict[str, Any]:
    recorded = await connected(settings, route_partitions.recorded)
    settings = _as_recorded(settings, {n: p for n, p in recorded.items() if n in ROUTES})
    state = await _status(settings, route.name)
    data = {"route": route.name, "partitions": partitions, "before": state["partitions"]}
    if state["partitions"] == partitions and state["recorded_at"]:
        return {**data, "changed": False}
    problems = _not_ready(route, state)
    if problems:
        exit_codes.fail(
            exit_codes.MISMATCH,
            f"{route.name}: not changed, "
            + "; ".join(problems)
            + ". Pause its relaying (or stop its publishers), let its queues drain and stop "
            "its consumers first (docs/how-to/partitions.md)",
        )
    await connected(
        settings, lambda conn: route_partitions.change(conn, route.name, partitions, by)
    )
    return {**data, "changed": True}


def _print_set(data: dict[str, Any]) -> None:
    if not data["changed"]:
        say(f"{data['route']}: {data['partitions']} partition(s) already")
        return
    say(
        f"{data['route']}: {data['before']} -> {data['partitions']} partition(s) recorded. "
        f"Start every pkgq process again (relays, consoles too: they read the map at start-up, "
        f"and PKGQ_PARTITIONS, where set, must say {data['partitions']}), then `pkgq "
        f"partitions resume {data['route']}` if it was paused"
    )


@partitions_app.command("set")
def set_cmd(
    route: RouteArg,
    partitions: Annotated[int, typer.Argument(min=1, max=256, help="The new count, 1..256.")],
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record PARTITIONS as the route's count for the whole deployment. Refused (exit 6) unless
    its queues are empty and have no consumers, and its relaying is paused (an inbound route's
    retries and replays go through the outbox too): the procedure of docs/how-to/partitions.md.
    The queues checked are those of the recorded count, whatever PKGQ_PARTITIONS says here."""
    settings = load_settings()
    target = route_argument(route)
    show(run(_set(settings, target, partitions, by or operator())), as_json, _print_set)
