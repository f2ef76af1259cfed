"""`pkgq workers` (the running processes, their routes and last heartbeat) and `pkgq prune`
(retention, now)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from consumers.cli.support import load_settings, text
from infra.postgres import retention, workers
from infra.postgres.pool import database

console = Console()

_STATE_STYLE = {"alive": "green", "stale": "yellow", "stopped": "dim"}


def workers_cmd(
    include_stopped: Annotated[
        bool, typer.Option("--all", help="Also list stopped (and reaped) workers.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The registered pkgq processes: role, host, pid, routes, last heartbeat and state
    (alive, stale: no heartbeat for PKGQ_WORKER_STALE_AFTER s, or stopped, with the reason)."""
    settings = load_settings()

    async def go() -> list[dict[str, Any]]:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            found = await workers.list_workers(conn, include_stopped)
        return [w.as_dict(settings.worker_stale_after) for w in found]

    rows = asyncio.run(go())
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        console.print("no workers" + ("" if include_stopped else " running"))
        return
    table = Table("name", "role", "host", "pid", "routes", "started", "heartbeat", "state")
    for w in rows:
        state = w["state"]
        shown = text(state, style=_STATE_STYLE[state])
        if w["stop_reason"]:
            shown.append(text(f" ({w['stop_reason']})"))
        table.add_row(
            text(w["name"]),
            text(w["role"]),
            text(w["host"]),
            str(w["pid"]),
            text(", ".join(r.removeprefix("telecom.") for r in w["routes"]) or "-"),
            w["started_at"][:19].replace("T", " "),
            f"{w['heartbeat_age_s']:.1f} s ago",
            shown,
        )
    console.print(table)


def prune_cmd(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be pruned; delete nothing.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Prune what is past retention (PKGQ_RETENTION s) now, in batches of
    PKGQ_PRUNE_BATCH_SIZE: processed-message records, published outbox rows, finished addresses
    and groups, expired unique keys, old TTR strikes, long-stopped workers. Dead letters are
    kept (see `pkgq dlq purge`)."""
    settings = load_settings()

    async def go() -> dict[str, int]:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await retention.prune(
                conn, settings.retention, settings.prune_batch_size, dry_run=dry_run
            )

    counts = asyncio.run(go())
    if as_json:
        print(json.dumps({"dry_run": dry_run, "retention_s": settings.retention, **counts}))
        return
    table = Table("table", "would be pruned" if dry_run else "pruned")
    for key, n in counts.items():
        if key != retention.BATCHES:
            table.add_row(key, str(n))
    console.print(table)
    if not dry_run:
        console.print(
            f"{counts[retention.BATCHES]} batch(es) of at most {settings.prune_batch_size}"
        )


def register(app: typer.Typer) -> None:
    """Add the commands of this module to the `pkgq` app."""
    app.command("workers")(workers_cmd)
    app.command("prune")(prune_cmd)
