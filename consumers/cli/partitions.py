"""`pkgq partitions …`: see a route's partition queues, and pause its relaying to change them.

Changing a route's partition count moves users between queues. To do it without reordering or
losing anything in flight (README, "Changing a route's partition count"):
pause the route, let its queues drain, stop its consumers, change PKGQ_PARTITIONS everywhere,
start them again, resume.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from consumers.cli.support import load_settings, operator, route_argument
from infra.postgres import outbox
from infra.postgres.pool import database
from infra.rabbit.management import queue_depths

partitions_app = typer.Typer(help="A route's partition queues; pause/resume its relaying.")
console = Console()


@partitions_app.command("status")
def status_cmd(
    route: str, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False
) -> None:
    """The route's partition count here, its queues' depth, whether its relaying is paused."""
    settings = load_settings()
    name = route_argument(route).name

    async def go() -> dict[str, Any]:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            state = await outbox.route_status(conn, name)
        state["queues"] = await queue_depths(settings, name)
        state["partitions"] = settings.partitions_for(name)
        state["route"] = name
        return state

    state = asyncio.run(go())
    if as_json:
        print(json.dumps(state, default=str, indent=2))
        return
    paused = (
        f"paused since {state['paused_at']} by {state['paused_by']}"
        if state["paused_at"]
        else "relaying"
    )
    console.print(
        f"{name}: {state['partitions']} partition(s), {paused}, "
        f"{state['pending']} pending in the outbox"
    )
    table = Table("queue", "binding key", "ready", "consumers")
    for q in state["queues"]:
        table.add_row(q["queue"], q["binding"], str(q["ready"]), str(q["consumers"]))
    console.print(table)


@partitions_app.command("pause")
def pause_cmd(route: str, by: Annotated[str | None, typer.Option("--by")] = None) -> None:
    """Hold the route's outbox rows back from every relay (they wait, in order)."""
    settings = load_settings()
    name = route_argument(route).name

    async def go() -> bool:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await outbox.pause_route(conn, name, by or operator())

    console.print(f"{name}: {'paused' if asyncio.run(go()) else 'was paused already'}")


@partitions_app.command("resume")
def resume_cmd(route: str) -> None:
    """Let the relays publish the route's rows again."""
    settings = load_settings()
    name = route_argument(route).name

    async def go() -> bool:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await outbox.resume_route(conn, name)

    console.print(f"{name}: {'resumed' if asyncio.run(go()) else 'was not paused'}")
