"""The long-running processes, `pkgq run` and `pkgq relay`, and `pkgq migrate`. They stop
gracefully on SIGTERM or SIGINT; `run` exits 1 if a route's consumer stops on its own."""

from __future__ import annotations

from typing import Annotated

import typer

from consumers.cli.options import JsonOpt, operator, route_argument
from consumers.cli.output import say, show
from consumers.cli.running import load_settings, run
from consumers.runtime import (
    services,
    start_status_server,
    stop_on_signals,
    with_partition_map,
)
from events.routes import ROUTES
from infra.gc_tuning import tune_for_throughput
from infra.postgres.migrate import ensure_database, migrate
from infra.postgres.pool import database
from infra.settings import Settings


def migrate_cmd(
    create_db: Annotated[bool, typer.Option(help="Create the database if missing.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Create the database if needed and apply pending schema migrations, as the schema's owner
    (PKGQ_MIGRATE_DSN); grant the runtime role (PKGQ_RUNTIME_ROLE) what it needs."""
    settings = load_settings()

    async def go() -> list[int]:
        if create_db:
            await ensure_database(settings.owner_dsn())
        async with database(
            settings.owner_dsn(), settings.postgres_session(), "PKGQ_MIGRATE_DSN"
        ) as conn:
            return await migrate(
                conn,
                runtime_role=settings.grantee(),
                partitions=settings.partitions_to_record,
                recorded_by=f"pkgq migrate ({operator()})",
            )

    applied = run(go())
    show(
        applied,
        as_json,
        lambda a: say(f"migrations applied: {a or 'none (up to date)'}"),
        data={"applied": applied},
    )


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
    rebalance: Annotated[
        bool,
        typer.Option(
            "--rebalance/--no-rebalance",
            help="Share each partitioned route's partitions with its other live `pkgq run` "
            "replicas, moving them as replicas join and leave (not with --replica: that pins "
            "them). --no-rebalance: subscribe to every partition, the first subscriber of each "
            "consuming it.",
        ),
    ] = True,
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
        routed = await with_partition_map(settings)
        async with services(routed, "run") as svc:
            tune_for_throughput()  # started (infra/gc_tuning.py)
            return await run_consumers(
                routed, svc, selected, stop, ingest=with_ingester, rebalance=rebalance
            )

    raise typer.Exit(run(go()))


def relay_cmd() -> None:
    """Run the outbox relay (with the expiry sweep and retention) until SIGTERM/SIGINT."""
    from infra.outbox.relay import Relay

    settings = load_settings(logs_to_stdout=True)

    async def go() -> None:
        stop = stop_on_signals()
        routed = await with_partition_map(settings)
        async with services(routed, "relay") as svc:
            tune_for_throughput()  # started (infra/gc_tuning.py)
            relay = Relay(routed, svc.pool, svc.amqp, svc.worker_id)

            def ready() -> bool:
                return not stop.is_set() and relay.ready()  # not ready once draining

            status = await start_status_server(routed, ready, svc)
            try:
                await relay.run(stop)
            finally:
                if status is not None:
                    status.draining = True
                    await status.stop()

    run(go())


def register(app: typer.Typer) -> None:
    """Add `migrate`, `run` and `relay` to the `pkgq` app."""
    app.command("migrate")(migrate_cmd)
    app.command("run")(run_cmd)
    app.command("relay")(relay_cmd)
