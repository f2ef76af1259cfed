"""What pkgq is and holds: `pkgq routes`, `pkgq stats`, and the documents generated from the
code (`pkgq definitions` for RabbitMQ, `pkgq asyncapi`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from consumers.cli.options import JsonOpt
from consumers.cli.output import Column, console, show, show_table, table
from consumers.cli.running import load_routing_settings, on_database
from events.routes import ALL_ROUTES, ROUTES
from infra.settings import Settings

_STATES = ["ready", "taken", "waiting", "buried", "zombie", "done", "expired"]
_MOVES = ["put", "take", "ack", "release", "bury", "dig", "plow", "ttl", "ttr", "delete"]


def _cell(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: str(row[key])


def routes_cmd(as_json: JsonOpt = False) -> None:
    """List the routes: short name, message type, queue, and who may publish on it."""
    settings = Settings.load()
    rows = [
        {
            "route": route.name,
            "short_name": route.short_name,
            "type": route.message_type,
            "queue": settings.queue_name(route.name),
            "publishers": "outside and pkgq" if route.inbound else "pkgq only",
            "consumed": route.name in ROUTES,
        }
        for route in ALL_ROUTES.values()
    ]
    headings = {"route": "route", "short_name": "short name", "type": "type", "queue": "queue"}
    columns: list[Column] = [(heading, _cell(key)) for key, heading in headings.items()]
    columns.append(("published by", _cell("publishers")))
    show_table(rows, as_json, columns)


def definitions_cmd(
    vhost: Annotated[str, typer.Option(help="The vhost to provision.")] = "/",
    users: Annotated[
        bool,
        typer.Option(
            help="Include the roles' users and permissions (no passwords). Re-importing a "
            "user clears its password: use --no-users to re-provision the topology alone."
        ),
    ] = True,
    queue_type: Annotated[
        str | None,
        typer.Option(
            help="classic or quorum: the queue type of every queue (default: PKGQ_QUEUE_TYPE "
            "and the route file). quorum is the replicated profile."
        ),
    ] = None,
) -> None:
    """Print the broker topology and the roles' users and permissions as RabbitMQ definitions
    JSON (for rabbitmqctl import_definitions). deploy/rabbitmq/definitions.json is this, with
    default settings."""
    from infra.rabbit.roles import DEFAULT_USERS
    from infra.rabbit.topology import definitions

    settings = Settings.load()
    if queue_type is not None:
        if queue_type not in ("classic", "quorum"):
            raise typer.BadParameter("classic or quorum", param_hint="--queue-type")
        settings = settings.with_queue_type(queue_type)
    document = definitions(settings, vhost, DEFAULT_USERS if users else None)
    print(json.dumps(document, indent=2))


def asyncapi_cmd() -> None:
    """Print the AsyncAPI 3.0 document of every route (docs/asyncapi.json is this)."""
    from events.asyncapi import document

    print(json.dumps(document(), indent=2, sort_keys=True))


def _shown(row: dict[str, Any], key: str, value: Any) -> str:
    """A figure as shown: `?` unknown, `~N` an estimate (past the exact count's cap)."""
    if value is None:
        return "?"
    return f"~{value}" if key in row.get("estimated", ()) else str(value)


def _print_stats(stats: dict[str, dict[str, Any]]) -> None:
    columns: list[Column] = [
        ("route", lambda kv: kv[0].removeprefix("telecom.")),
        *(
            (head, lambda kv, s=s: _shown(kv[1], s, kv[1][s]))
            for head, s in zip(("R", "T", "W", "B", "Z", "D", "exp"), _STATES, strict=True)
        ),
        *((m, lambda kv, m=m: str(kv[1]["transitions"][m])) for m in _MOVES),
        *(
            (head, lambda kv, d=d: _shown(kv[1], d, kv[1]["detail"][d]))
            for head, d in (("/min", "processed_1m"), ("fail/min", "failed_1m"))
        ),
    ]
    console().print(table(stats.items(), columns))


def stats_cmd(as_json: JsonOpt = False) -> None:
    """Per route, how many messages are in each state: R ready to deliver, T taken (delivered,
    not yet acknowledged), W waiting (scheduled for later, or held back behind an earlier
    message of its user), B buried (dead letters), Z processed and still remembered to drop
    duplicates (until retention), D done, and expired; and how many moved between them (put,
    take, ack, release, bury, dig, plow, ttl, ttr, delete), with how many were processed (/min) and
    dead-lettered (fail/min) in the last minute. Taken counts come from the
    RabbitMQ management API ('?' when it cannot be reached). Nothing is counted row by row: a
    figure past 1,000 is estimated from Postgres' statistics and shown as ~N
    (docs/explanation/job-queue.md, Stats)."""
    from consumers.job_stats import route_stats

    settings = load_routing_settings()
    show(on_database(settings, lambda conn: route_stats(settings, conn)), as_json, _print_stats)


def register(app: typer.Typer) -> None:
    """Add `routes`, `stats`, `definitions` and `asyncapi` to the `pkgq` app."""
    app.command("routes")(routes_cmd)
    app.command("stats")(stats_cmd)
    app.command("definitions")(definitions_cmd)
    app.command("asyncapi")(asyncapi_cmd)
