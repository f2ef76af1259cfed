"""The `pkgq` command line."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar
from uuid import UUID

import structlog
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from consumers import jobs_cli, publishing, workers_cli
from consumers.catalog_cli import catalog_app
from consumers.cli_support import load_settings, route_argument
from consumers.cli_support import text as literal
from consumers.dlq_cli import dlq_app
from consumers.partitions_cli import partitions_app
from consumers.runtime import services, start_status_server, stop_on_signals
from consumers.user_cli import user_app
from consumers.web.command import web_app
from events.models import WireModel
from events.routes import ROUTES, Route
from infra.postgres.migrate import RuntimeRoleMissingError, ensure_database, migrate
from infra.postgres.pool import database
from infra.rabbit.connection import connect
from infra.rabbit.topology import TopologyMismatchError
from infra.settings import Settings

app = typer.Typer(
    help="pkgq: the telecom package queue on RabbitMQ and PostgreSQL.",
    pretty_exceptions_enable=False,  # plain tracebacks: readable in journald and log shippers
)
app.add_typer(user_app, name="user")
app.add_typer(catalog_app, name="catalog")
app.add_typer(dlq_app, name="dlq")
app.add_typer(partitions_app, name="partitions")
app.add_typer(web_app, name="web")
workers_cli.register(app)
jobs_cli.register(app)
console = Console()
T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except TopologyMismatchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command("migrate")
def migrate_cmd(
    create_db: Annotated[bool, typer.Option(help="Create the database if missing.")] = True,
) -> None:
    """Create the database if needed and apply pending SQL migrations, as the schema's owner
    (PKGQ_MIGRATE_DSN); grant the runtime role (PKGQ_RUNTIME_ROLE) what it needs."""
    settings = load_settings()

    async def go() -> list[int]:
        if create_db:
            await ensure_database(settings.owner_dsn())
        async with database(settings.owner_dsn(), settings.postgres_session()) as conn:
            return await migrate(conn, runtime_role=settings.grantee())

    try:
        applied = _run(go())
    except RuntimeRoleMissingError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    console.print(f"migrations applied: {applied or 'none (up to date)'}")


@app.command("routes")
def routes_cmd() -> None:
    """List the routes, their message types and queues."""
    settings = Settings.load()
    table = Table("route", "type", "queue")
    for route in ROUTES.values():
        table.add_row(route.name, route.message_type, settings.queue_name(route.name))
    console.print(table)


@app.command("run")
def run_cmd(
    routes: Annotated[
        list[str] | None, typer.Argument(help="Routes to consume (default: all).")
    ] = None,
    ingest: Annotated[
        bool | None,
        typer.Option(
            "--ingest/--no-ingest",
            help="Also run the dead-letter ingester (default: only when no ROUTES are given).",
        ),
    ] = None,
    replica: Annotated[
        str | None,
        typer.Option(
            "--replica",
            help="I/N: consume partitions k with k % N == I first, stand by for the others "
            "(PKGQ_REPLICA).",
        ),
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Worker lanes per queue for routes the route file does not configure "
            "(PKGQ_CONCURRENCY; a user's messages always take the same lane).",
        ),
    ] = None,
) -> None:
    """Run consumers for ROUTES until SIGTERM/SIGINT, then drain gracefully."""
    from consumers.runner import run_consumers

    settings = load_settings(logs_to_stdout=True)
    if replica is not None:
        settings = Settings.model_validate({**settings.model_dump(), "replica": replica})
    if concurrency is not None:
        settings = settings.model_copy(update={"concurrency": concurrency})
    selected = [route_argument(r) for r in routes] if routes else list(ROUTES.values())
    with_ingester = ingest if ingest is not None else not routes

    async def go() -> int:
        stop = stop_on_signals()
        async with services(settings, "run") as svc:
            return await run_consumers(settings, svc, selected, stop, ingest=with_ingester)

    raise typer.Exit(_run(go()))


@app.command("definitions")
def definitions_cmd(
    vhost: Annotated[str, typer.Option(help="The vhost to provision.")] = "/",
    users: Annotated[
        bool,
        typer.Option(
            help="Include the roles' users and permissions (no passwords). Re-importing a "
            "user clears its password: use --no-users to re-provision the topology alone."
        ),
    ] = True,
) -> None:
    """Print the broker topology and the roles' users and permissions as RabbitMQ definitions
    JSON (for rabbitmqctl import_definitions). deploy/rabbitmq/definitions.json is this, with
    default settings."""
    from infra.rabbit.roles import DEFAULT_USERS
    from infra.rabbit.topology import definitions

    document = definitions(Settings.load(), vhost, DEFAULT_USERS if users else None)
    print(json.dumps(document, indent=2))


@app.command("asyncapi")
def asyncapi_cmd() -> None:
    """Print the AsyncAPI 3.0 document of every route (docs/asyncapi.json is this)."""
    from events.asyncapi import document

    print(json.dumps(document(), indent=2, sort_keys=True))


@app.command("stats")
def stats_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Per route, seed 004's states (R ready, T taken, W waiting, B buried, Z zombie, D done,
    and expired) and transition counts (put, take, ack, release, bury, dig, plow, ttl, ttr,
    delete). Taken counts come from the RabbitMQ management API ('?' when unreachable)."""
    from consumers.job_stats import route_stats

    settings = load_settings()

    async def go() -> dict[str, dict[str, Any]]:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await route_stats(settings, conn)

    table = _run(go())
    if as_json:
        print(json.dumps(table, indent=2))
        return
    states = ["ready", "taken", "waiting", "buried", "zombie", "done", "expired"]
    moves = ["put", "take", "ack", "release", "bury", "dig", "plow", "ttl", "ttr", "delete"]
    view = Table("route", "R", "T", "W", "B", "Z", "D", "exp", *moves, "/min")
    for route, row in table.items():
        cells = ["?" if row[c] is None else str(row[c]) for c in states]
        view.add_row(
            route.removeprefix("telecom."),
            *cells,
            *(str(row["transitions"][m]) for m in moves),
            str(row["detail"]["processed_1m"]),
        )
    console.print(view)


@app.command("relay")
def relay_cmd() -> None:
    """Run the outbox relay (with the expiry sweep and retention) until SIGTERM/SIGINT."""
    from infra.outbox.relay import Relay

    settings = load_settings(logs_to_stdout=True)

    async def go() -> None:
        stop = stop_on_signals()
        async with services(settings, "relay") as svc:
            relay = Relay(settings, svc.pool, svc.amqp, svc.worker_id)

            def ready() -> bool:
                return not stop.is_set() and relay.ready()  # not ready once draining

            status = await start_status_server(settings, ready, svc)
            try:
                await relay.run(stop)
            finally:
                if status is not None:
                    status.draining = True
                    await status.stop()

    _run(go())


@app.command("publish")
def publish_cmd(
    route: Annotated[str, typer.Argument(help="Route, e.g. package_purchase.")],
    body: Annotated[str, typer.Argument(help="JSON, @file, or - for stdin.")],
    message_id: Annotated[UUID | None, typer.Option(help="Idempotency key (default: new).")] = None,
    priority: Annotated[
        int, typer.Option(min=0, max=2, help="0-2, higher is more urgent (FIFO within one).")
    ] = 0,
    delay: Annotated[str | None, typer.Option(help="Not delivered before: 90s, 15m, 2d.")] = None,
    ttl: Annotated[str | None, typer.Option(help="Not delivered after (from now): 1h.")] = None,
    address: Annotated[
        str | None, typer.Option(help="Refused while this address is queued or in flight.")
    ] = None,
    unique_for: Annotated[
        str | None, typer.Option(help="Dropped if the same arguments were put within this.")
    ] = None,
) -> None:
    """Validate BODY against ROUTE's model and publish it; print its message_id.

    Without options it is published straight to the exchange with a confirm. With any of
    --priority, --delay, --ttl, --address or --unique-for it is written to the outbox (durable
    at once; the relay publishes it when due). Exit 3: duplicate address; 4: dropped as a
    repeat within its unique window."""
    settings = load_settings()
    target = route_argument(route)
    text = _read_body(body)
    try:
        model = publishing.parse_body(target, text)
    except ValidationError as exc:
        console.print(f"[red]invalid {target.message_type}:[/red]", literal(exc))
        raise typer.Exit(2) from None
    options = jobs_cli.job_options(priority, delay, ttl, address, unique_for)
    if options is not None:
        if message_id is not None:
            raise typer.BadParameter("--message-id is for direct publishes (no job options)")
        jobs_cli.report(jobs_cli.put(settings, target, model.model_dump_json(), options))
        return

    print(_run(_publish(settings, target, model, message_id=message_id)))


async def _publish(
    settings: Settings, route: Route, body: WireModel, *, message_id: UUID | None = None
) -> UUID:
    conn = await connect(settings.amqp_url, "pkgq-cli")
    try:
        return await publishing.publish(settings, conn, route, body, message_id=message_id)
    finally:
        await conn.close()


def _read_body(arg: str) -> str:
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        return Path(arg[1:]).read_text()
    return arg


def _bench_namespace(value: str) -> str:
    if not value.replace("_", "").isalnum() or not value.isascii() or not value[:1].isalpha():
        raise typer.BadParameter("letters, digits and _ only, starting with a letter")
    return value.lower()


@app.command("bench")
def bench_cmd(
    users: Annotated[int, typer.Option(min=1, help="Users in the scenario.")] = 400,
    packages: Annotated[int, typer.Option(min=1, help="Packages each user buys and uses up.")] = 5,
    small_rows: Annotated[
        int, typer.Option(min=0, help="Rows already in package_queue, first runs.")
    ] = 10_000,
    large_rows: Annotated[
        int, typer.Option(min=0, help="Rows already in package_queue, last run.")
    ] = 1_000_000,
    batch_size: Annotated[int, typer.Option(min=1, max=1000)] = 32,
    prefetch: Annotated[int, typer.Option(min=1)] = 64,
    raw_messages: Annotated[int, typer.Option(min=1, help="Messages in the raw baseline.")] = 5000,
    replicas: Annotated[
        int, typer.Option(min=1, max=16, help="pkgq run processes (routes split to match).")
    ] = 1,
    repeat: Annotated[
        int, typer.Option(min=1, max=10, help="Runs of each batched phase; the best counts.")
    ] = 2,
    backlog_users: Annotated[
        int, typer.Option(min=1, help="Users of the backlog phase, each with an active package.")
    ] = 1000,
    backlog_records: Annotated[
        int,
        typer.Option(
            min=1, help="Usage records queued before the simple consumer and pkgq drain them."
        ),
    ] = 20_000,
    namespace: Annotated[
        str,
        typer.Option(
            help="Its own names: database pkgq_NAME, exchange and queues NAME.*.",
            callback=_bench_namespace,
        ),
    ] = "bench",
) -> None:
    """Benchmark pkgq against the raw broker, its naive mode and a simple consumer; prints
    key=value lines last.

    Scale it with --users and --packages (events per run are about users x (3 x packages + 3)).
    It uses its own database (pkgq_bench) and broker names (bench.*) next to the configured ones.
    """
    from consumers.bench import PHASES, Scenario, run_bench

    settings = load_settings()
    scenario = Scenario(
        users=users,
        packages=packages,
        small_rows=small_rows,
        large_rows=large_rows,
        batch_size=batch_size,
        prefetch=prefetch,
        raw_messages=raw_messages,
        replicas=replicas,
        repeat=repeat,
        backlog_users=backlog_users,
        backlog_records=backlog_records,
        namespace=namespace,
    )
    err = Console(stderr=True)
    if sys.stderr.isatty():
        with Progress(console=err) as progress:
            task = progress.add_task("bench", total=PHASES)

            def say(text: str) -> None:
                if not text.startswith(" "):
                    progress.advance(task)
                progress.console.print(text, highlight=False)

            code = _run(run_bench(settings, scenario, say))
    else:
        bench_log = structlog.get_logger("pkgq.bench")
        code = _run(run_bench(settings, scenario, lambda text: bench_log.info(text.strip())))
    raise typer.Exit(code)


@app.command("demo")
def demo_cmd(
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 90.0,
) -> None:
    """Start the relay and all consumers, drive sample users through every route, show it."""
    from consumers.demo import run_demo

    settings = load_settings()
    raise typer.Exit(_run(run_demo(settings, timeout)))


def main() -> None:
    app()
