"""`pkgq workers` (the running processes, their routes and last heartbeat) and `pkgq prune`
(retention, now)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from consumers.cli.options import DryRunOpt, JsonOpt
from consumers.cli.output import Column, console, say, show, table, text
from consumers.cli.running import load_settings, on_database
from infra.postgres import partition_owners, retention, workers
from infra.postgres.pool import Conn
from infra.settings import Settings

_STATE_STYLE = {"alive": "green", "stale": "yellow", "stopped": "dim"}


def _state(w: dict[str, Any]) -> Any:
    shown = text(w["state"], style=_STATE_STYLE[w["state"]])
    if w["stop_reason"]:
        shown.append(text(f" ({w['stop_reason']})"))
    return shown


_COLUMNS: list[Column] = [
    ("name", lambda w: text(w["name"])),
    ("role", lambda w: text(w["role"])),
    ("host", lambda w: text(w["host"])),
    ("pid", lambda w: str(w["pid"])),
    ("routes", lambda w: text(", ".join(r.removeprefix("telecom.") for r in w["routes"]) or "-")),
    ("started", lambda w: w["started_at"][:19].replace("T", " ")),
    ("heartbeat", lambda w: f"{w['heartbeat_age_s']:.1f} s ago"),
    ("state", _state),
]


_OWNER_COLUMNS: list[Column] = [
    ("route", lambda o: text(o["route"].removeprefix("telecom."))),
    ("partition", lambda o: str(o["partition"])),
    ("owner", lambda o: text(o["worker"], style="" if o["owner_alive"] else "dim")),
    ("since", lambda o: o["since"][:19].replace("T", " ")),
]


def workers_cmd(
    include_stopped: Annotated[
        bool, typer.Option("--all", help="Also list stopped (and reaped) workers.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The registered pkgq processes: role, host, pid, routes, last heartbeat and state
    (alive; stale: no heartbeat for PKGQ_WORKER_STALE_AFTER s; or stopped, with the reason).
    Then which replica owns which partition of a partitioned route, and since when (in JSON:
    each worker's `partitions`)."""
    settings = load_settings()
    owned: list[dict[str, Any]] = []

    async def find(conn: Conn) -> list[dict[str, Any]]:
        found = await workers.list_workers(conn, include_stopped)
        owned.extend(o.as_dict() for o in await partition_owners.owners(conn))
        rows = [w.as_dict(settings.worker_stale_after) for w in found]
        for row in rows:
            row["partitions"] = [
                {"route": o["route"], "partition": o["partition"], "since": o["since"]}
                for o in owned
                if o["worker_id"] == row["id"]
            ]
        return rows

    def render(rows: list[dict[str, Any]]) -> None:
        if rows:
            console().print(table(rows, _COLUMNS))
        else:
            say("no workers" + ("" if include_stopped else " running"))
        if owned:
            console().print(table(owned, _OWNER_COLUMNS))

    show(on_database(settings, find), as_json, render)


def _print_pruned(counts: dict[str, int], settings: Settings, dry_run: bool) -> None:
    shown = [(k, n) for k, n in counts.items() if k != retention.BATCHES]
    heading = "would be pruned" if dry_run else "pruned"
    console().print(table(shown, [("table", lambda kv: kv[0]), (heading, lambda kv: str(kv[1]))]))
    if not dry_run:
        say(f"{counts[retention.BATCHES]} batch(es) of at most {settings.prune_batch_size}")


def prune_cmd(dry_run: DryRunOpt = False, as_json: JsonOpt = False) -> None:
    """Delete now what is past retention (PKGQ_RETENTION s), as the relay does every
    PKGQ_HOUSEKEEPING_INTERVAL s, in batches of PKGQ_PRUNE_BATCH_SIZE: processed-message
    records, published outbox rows, finished addresses and groups, expired unique keys, old
    TTR strikes, long-stopped workers, expired console sessions. Dead letters are kept (see
    `pkgq dlq purge`)."""
    settings = load_settings()
    counts = on_database(
        settings,
        lambda conn: retention.prune(
            conn, settings.retention, settings.prune_batch_size, dry_run=dry_run
        ),
    )
    data = {"dry_run": dry_run, "retention_s": settings.retention, **counts}
    show(counts, as_json, lambda c: _print_pruned(c, settings, dry_run), data=data)


def register(app: typer.Typer) -> None:
    """Add `workers` and `prune` to the `pkgq` app."""
    app.command("workers")(workers_cmd)
    app.command("prune")(prune_cmd)
