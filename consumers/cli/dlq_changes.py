"""`pkgq dlq …` that changes dead letters: dig (one, through the outbox), discard and purge;
and release-hold, for a hold whose blocker has no way out. Bulk discards and purges ask first
(`--yes`, `--dry-run`). Replays of many (`replay`, `plow`) run as replay runs: dlq_replay.py.

A replay writes each message to the outbox in the transaction that marks its dead letter
`replayed`, in batches of BATCH, so a bulk replay interrupted half-way and run again sends each
message once. Long operations show a progress bar on a terminal and log one structured line per
batch otherwise.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, TypeVar
from uuid import UUID

import structlog
import typer
from rich.progress import Progress

from consumers import dead_letter_filter, operations
from consumers.cli import exit_codes
from consumers.cli.confirm import confirm
from consumers.cli.durations import parse_since
from consumers.cli.options import (
    ByOpt,
    DryRunOpt,
    JsonOpt,
    YesOpt,
    as_parameter,
    duration,
    operator,
)
from consumers.cli.output import console, say, show, text
from consumers.cli.running import load_settings, on_database, run
from infra.postgres import dead_letters, invariants, replay
from infra.postgres.pool import Conn, database
from infra.settings import Settings

log = structlog.get_logger(__name__)
BATCH = operations.BATCH  # dead letters per transaction in bulk commands
T = TypeVar("T")


def _route(name: str | None) -> str | None:
    """`--route`, full or short, as the full name (typer callback, so the error names it)."""
    return None if name is None else as_parameter(dead_letter_filter.route, name)


RouteOpt = Annotated[
    str | None,
    typer.Option("--route", help="Only this route (e.g. usage_record).", callback=_route),
]
ErrorOpt = Annotated[
    str | None, typer.Option("--error", help="Reason, error type or message contains TEXT.")
]
GroupOpt = Annotated[str | None, typer.Option("--group", help="A group key from `dlq groups`.")]
SinceOpt = Annotated[
    str | None,
    typer.Option("--since", help="Failed since: an ISO time, or a duration ago (2h, 1w)."),
]


def matching(
    route: str | None,
    error: str | None,
    group: str | None,
    since: str | None,
    *,
    ids: list[int] | None = None,
    status: str | None = "buried",
    limit: int | None = None,
) -> dead_letters.Filter:
    """The dead letters the filter options name (by default the buried ones; None: every
    status), read as the console reads its filters (consumers/dead_letter_filter.py), `--since`
    also as a duration ago. A value that cannot be read is a usage error."""
    try:
        return dead_letter_filter.parse(
            route_name=route,
            error=error,
            group=group,
            since=since,
            status_name=status,
            ids=ids,
            limit=limit,
            read_time=parse_since,
        )
    except dead_letter_filter.FilterError as exc:
        raise typer.BadParameter(str(exc)) from None


async def _in_batches(
    settings: Settings,
    ids: Sequence[int],
    step: Callable[[Conn, list[int]], Awaitable[T]],
    label: str,
) -> list[T]:
    """Run `step` over `ids` in transactions of BATCH (consumers/operations.py, as the console
    does), with a progress bar on a terminal. Returns each committed batch's result."""
    batches = -(-len(ids) // BATCH)
    with Progress(console=console(), transient=True, disable=not sys.stdout.isatty()) as progress:
        task = progress.add_task(label, total=len(ids))
        done = 0

        def advance(size: int) -> None:
            nonlocal done
            done += 1
            progress.advance(task, size)
            if progress.disable:
                log.info(label, batch=size, done=done, batches=batches)

        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await operations.in_batches(conn, ids, step, advance)


def _find(settings: Settings, which: dead_letters.Filter) -> list[dict[str, Any]]:
    return on_database(settings, lambda conn: dead_letters.find(conn, which))


def _replay(
    settings: Settings,
    rows: list[dict[str, Any]],
    *,
    by: str | None,
    force: bool = False,
    as_json: bool = False,
    transition: str = "dig",
) -> None:
    who = by or operator()

    async def step(conn: Conn, batch: list[int]) -> list[replay.ReplayResult]:
        return await operations.replay_batch(
            conn, batch, who, pkgq_user=settings.amqp_user, force=force, transition=transition
        )

    batches = run(_in_batches(settings, [r["id"] for r in rows], step, "replaying"))
    results = [r for batch in batches for r in batch]
    skipped = [r for r in results if not r.replayed]
    outcome = {"replayed": sum(r.replayed for r in results), "skipped": skipped}

    def render(_: object) -> None:
        say(f"replayed {outcome['replayed']} dead letter(s) through the outbox")
        for r in skipped:
            console().print(text(f"not replayed {r.id}: {r.detail}", style="yellow"))

    show(
        outcome,
        as_json,
        render,
        data={**outcome, "skipped": [dataclasses.asdict(r) for r in skipped]},
    )
    if skipped:
        raise typer.Exit(exit_codes.FAILED)


def dig_cmd(
    dead_letter_id: int,
    force: Annotated[
        bool, typer.Option("--force", help="Replay it even if it was replayed or discarded.")
    ] = False,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Replay one dead letter through the outbox (by default only a buried one)."""
    settings = load_settings()
    rows = _find(settings, dead_letters.Filter(ids=[dead_letter_id]))
    if not rows:
        exit_codes.fail(exit_codes.NOT_FOUND, f"no dead letter {dead_letter_id}")
    r = rows[0]
    if r["status"] == "superseded":
        said = f"dead letter {dead_letter_id} is {replay.SUPERSEDED}"
        console().print(text(said, style="yellow"))
        raise typer.Exit(exit_codes.FAILED)
    if not force and r["status"] != "buried":
        console().print(
            text(
                f"dead letter {dead_letter_id} is {r['status']} "
                f"({r['replayed_by'] or r['discarded_by']} at "
                f"{r['replayed_at'] or r['discarded_at']}); use --force to replay it again "
                "(once applied, a dead letter is superseded and never replayed)",
                style="yellow",
            )
        )
        raise typer.Exit(exit_codes.FAILED)
    _replay(settings, rows, by=by, force=force, as_json=as_json)


def discard_cmd(
    ids: Annotated[list[int] | None, typer.Argument(help="Dead letter ids.")] = None,
    route: RouteOpt = None,
    error: ErrorOpt = None,
    group: GroupOpt = None,
    since: SinceOpt = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every buried one (required without a filter).")
    ] = False,
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Give up on buried dead letters; the messages they held back are released in order.
    With a filter or --all it asks first."""
    if not (ids or route or error or group or since or every):
        raise typer.BadParameter("name ids or a filter, or pass --all")
    settings = load_settings()
    rows = _find(settings, matching(route, error, group, since, ids=ids))
    found = [r["id"] for r in rows]
    if dry_run:
        show(
            found,
            as_json,
            lambda f: say(f"would discard {len(f)} dead letter(s): {f}"),
            data={"would_discard": found},
        )
        return
    bulk = bool(route or error or group or since or every)
    if bulk and found:
        confirm(f"Discard {len(found)} buried dead letter(s) for good?", yes=yes)
    who = by or operator()

    async def step(conn: Conn, batch: list[int]) -> int:
        return await operations.discard_batch(conn, batch, who)

    discarded = sum(run(_in_batches(settings, found, step, "discarding")))
    show({"discarded": discarded}, as_json, lambda _: say(f"discarded {discarded} dead letter(s)"))


def purge_cmd(
    older_than: Annotated[str, typer.Option("--older-than", help="A duration: 30d, 12h, 1w, …")],
    yes: YesOpt = False,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete replayed, discarded and superseded dead letters older than a duration (never
    buried ones). Asks first."""
    age = duration(older_than)
    settings = load_settings()
    count = on_database(settings, lambda conn: dead_letters.count_purgeable(conn, age))
    if dry_run:
        show(
            {"would_purge": count},
            as_json,
            lambda _: say(f"would purge {count} dead letter(s) older than {older_than}"),
        )
        return
    if count:
        confirm(
            f"Delete {count} replayed, discarded or superseded dead letter(s) for good?", yes=yes
        )
    purged = on_database(settings, lambda conn: dead_letters.purge(conn, age))
    show(
        {"purged": purged},
        as_json,
        lambda _: say(f"purged {purged} dead letter(s) older than {older_than}"),
    )


def release_hold_cmd(
    consumer: Annotated[
        str, typer.Option("--consumer", help="The hold's consumer, as `pkgq dlq holds` shows it.")
    ],
    user: Annotated[str, typer.Option("--user", help="The held user's id.")],
    blocker: Annotated[
        str | None,
        typer.Option("--blocker", help="Only if the hold still waits on this message_id."),
    ] = None,
    by: ByOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release a hold: the user's messages parked behind it are applied in order. Audited.
    Meant for a hold with no way out (`pkgq doctor`'s hold_without_way_out), but never
    refused for one that has: then it says what was pending and what becomes of it."""
    user_id = as_parameter(UUID, user)
    expected = None if blocker is None else as_parameter(UUID, blocker)
    settings = load_settings()
    who = by or operator()

    async def release(conn: Conn) -> invariants.HoldWayOut:
        async with conn.transaction():
            found = await operations.release_hold(conn, consumer, user_id, who, blocker=expected)
        # The check's stored result follows at once (the console's overview reads it).
        await invariants.check_and_store(conn, names=[invariants.HOLD_WITHOUT_WAY_OUT.name])
        return found

    try:
        found = on_database(settings, release)
    except operations.UnknownHoldError as exc:
        exit_codes.fail(exit_codes.NOT_FOUND, exc)
    except operations.HoldReleaseRefusedError as exc:
        reason = str(exc)
        show(
            {"released": False, "reason": reason},
            as_json,
            lambda _: say(text(f"not released: {reason}", style="yellow")),
        )
        raise typer.Exit(exit_codes.FAILED) from None
    outcome = {
        "released": True,
        "consumer": consumer,
        "user_id": str(user_id),
        "blocker": str(found.blocker),
        "parked": found.parked,
        "warning": found.release_warning,
    }

    def render(_: object) -> None:
        say(
            f"released the hold on {consumer} for user {user_id} (blocker {found.blocker}); "
            f"{found.parked} parked message(s) will be applied in order"
        )
        if found.release_warning:
            say(text(f"warning: {found.release_warning}", style="yellow"))

    show(outcome, as_json, render)


def register(app: typer.Typer) -> None:
    """Add the commands that change dead letters to the `dlq` group."""
    app.command("dig")(dig_cmd)
    app.command("discard")(discard_cmd)
    app.command("purge")(purge_cmd)
    app.command("release-hold")(release_hold_cmd)
