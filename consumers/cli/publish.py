"""`pkgq publish` (straight to the exchange, or through the outbox with job options) and
`pkgq wait` (until an addressed message is processed)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Any
from uuid import UUID

import typer
from pydantic import ValidationError

from consumers import publishing
from consumers.cli import exit_codes
from consumers.cli.options import JsonOpt, route_argument, seconds
from consumers.cli.output import clean, say, show
from consumers.cli.running import (
    load_routing_settings,
    load_settings,
    publish,
    run,
    with_jobs,
)
from events.routes import Route
from infra.jobs import DuplicateAddress, JobOptions, Jobs, PublishResult, UnknownAddressError
from infra.postgres.addresses import AddressState
from infra.settings import Settings


def job_options(
    priority: int, delay: str | None, ttl: str | None, address: str | None, unique_for: str | None
) -> JobOptions | None:
    """The options of `pkgq publish`, or None when none is given (a direct publish)."""
    if not (priority or delay or ttl or address or unique_for):
        return None
    try:
        return JobOptions(priority, seconds(delay), seconds(ttl), address, seconds(unique_for))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _put(settings: Settings, route: Route, body: str, options: JobOptions) -> PublishResult:
    """One outbox row (the relay publishes it); a duplicate address ends the command (4)."""

    async def work(jobs: Jobs) -> PublishResult:
        return await jobs.publish(
            route,
            body,
            priority=options.priority,
            delay=options.delay,
            ttl=options.ttl,
            address=options.address,
            unique_for=options.unique_for,
        )

    try:
        return with_jobs(settings, work)
    except DuplicateAddress as exc:
        say(f"duplicate address: {exc}")
        raise typer.Exit(exit_codes.DROPPED) from None


def _report(result: PublishResult, as_json: bool) -> None:
    def render(r: PublishResult) -> None:
        if not r.queued:
            say(
                "dropped: the same route and arguments were published within the unique "
                f"window as {r.duplicate_of}"
            )
            return
        extra = [
            f"{key}={value.isoformat()}"
            for key, value in (("available_at", r.available_at), ("expires_at", r.expires_at))
            if value is not None
        ]
        print(r.message_id, *extra)

    show(result, as_json, render, data=dataclasses.asdict(result))
    if not result.queued:
        raise typer.Exit(exit_codes.DROPPED)


def _read_body(arg: str) -> str:
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        return Path(arg[1:]).read_text()
    return arg


def publish_cmd(
    route: Annotated[str, typer.Argument(help="Route, e.g. package_purchase.")],
    body: Annotated[str, typer.Argument(help="JSON, @file, or - for stdin.")],
    message_id: Annotated[UUID | None, typer.Option(help="Idempotency key (default: new).")] = None,
    priority: Annotated[
        int, typer.Option(min=0, max=2, help="0-2, higher is more urgent (FIFO within one).")
    ] = 0,
    delay: Annotated[str | None, typer.Option(help="Not delivered before: 90s, 15m, 1w.")] = None,
    ttl: Annotated[str | None, typer.Option(help="Not delivered after (from now): 1h.")] = None,
    address: Annotated[
        str | None, typer.Option(help="Refused while this address is queued or in flight.")
    ] = None,
    unique_for: Annotated[
        str | None, typer.Option(help="Dropped if the same body was published within this.")
    ] = None,
    schema_version: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="The body's schema version (default: the route's current one). "
            "usage_record takes 2 (usage_id?, recorded_at?) or 1; the others take 1.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check BODY against ROUTE's message format and publish it; print its message_id.

    Without options it is published straight to the exchange, confirmed by the broker. With
    any of --priority, --delay, --ttl, --address or --unique-for it is stored in the outbox
    (safe at once; the relay publishes it when due). --schema-version sends a body of the
    route's previous version, as an older publisher does (direct publishes only). Exit 4: the
    address is in use, or a repeat within its unique window was dropped."""
    settings = load_routing_settings()
    target = route_argument(route)
    text = _read_body(body)
    try:
        model = publishing.parse_body(target, text, schema_version)
    except ValidationError as exc:
        version = schema_version or target.schema_version
        exit_codes.fail(
            exit_codes.USAGE, f"invalid {target.message_type} (schema version {version}): {exc}"
        )
    except ValueError as exc:
        exit_codes.fail(exit_codes.USAGE, str(exc))
    options = job_options(priority, delay, ttl, address, unique_for)
    if options is not None:
        if message_id is not None:
            raise typer.BadParameter("--message-id is for direct publishes (no job options)")
        if schema_version not in (None, target.schema_version):
            raise typer.BadParameter(
                "--schema-version is for direct publishes: the outbox writes the current one"
            )
        _report(_put(settings, target, model.model_dump_json(), options), as_json)
        return
    sent = run(
        publish(settings, target, model, message_id=message_id, schema_version=schema_version)
    )
    show(sent, as_json, print, data={"message_id": str(sent)})


def _state(state: AddressState) -> dict[str, Any]:
    return {
        "address": state.address,
        "route": state.route,
        "message_id": str(state.message_id),
        "state": state.state,
        "error": state.error,
        "finished_at": state.finished_at.isoformat() if state.finished_at else None,
    }


def _print_state(state: AddressState) -> None:
    if state.state == "done":
        typer.echo(f"done: {clean(state.address)} ({state.message_id})")
    else:
        typer.echo(clean(f"failed: {state.address}: {state.error}"))


def wait_cmd(
    address: Annotated[str, typer.Argument(help="The address given to `publish --address`.")],
    timeout: Annotated[str, typer.Option(help="Give up after this long (90s, 5m).")] = "60s",
    as_json: JsonOpt = False,
) -> None:
    """Wait until the addressed message is processed. Exit 0 done, 1 failed (dead-lettered or
    expired, with its error), 5 still queued at the timeout, 3 no such address."""
    settings = load_settings()
    limit = seconds(timeout)
    try:
        state = with_jobs(settings, lambda jobs: jobs.wait(address, limit))
    except TimeoutError as exc:
        exit_codes.fail(exit_codes.TIMEOUT, exc)
    except UnknownAddressError as exc:
        exit_codes.fail(exit_codes.NOT_FOUND, exc.args[0])
    show(state, as_json, _print_state, data=_state(state))
    raise typer.Exit(exit_codes.OK if state.state == "done" else exit_codes.FAILED)


def register(app: typer.Typer) -> None:
    """Add `publish` and `wait` to the `pkgq` app."""
    app.command("publish")(publish_cmd)
    app.command("wait")(wait_cmd)
