"""`pkgq catalog`: the packages on sale. Items keep the terms they were bought with, so an edit
or a retirement changes later purchases only."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from consumers.cli.support import load_settings, text
from consumers.cli.units import parse_duration, parse_size
from domain.model import Package
from infra.postgres import catalog
from infra.postgres.pool import database

catalog_app = typer.Typer(help="The package catalog.")
console = Console()
UNLIMITED = "unlimited"

Traffic = Annotated[
    str, typer.Option(help="Traffic limit: bytes, 500MiB, 2GB, ..., or 'unlimited' (time only).")
]
Duration = Annotated[
    str | None,
    typer.Option(help="Lifetime once active: 90s, 15m, 12h, 30d; omit or 'unlimited': none."),
]


def _terms(traffic: str, duration: str | None) -> tuple[int | None, timedelta | None]:
    try:
        limit = None if traffic.strip().lower() == UNLIMITED else parse_size(traffic)
        lifetime = (
            None
            if duration is None or duration.strip().lower() == UNLIMITED
            else parse_duration(duration)
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if limit is None and lifetime is None:
        raise typer.BadParameter("a package needs a traffic limit, a duration or both")
    return limit, lifetime


@catalog_app.command("add")
def catalog_add(name: str, traffic: Traffic, duration: Duration = None) -> None:
    """Add a package to the catalog and print its id."""
    settings = load_settings()
    limit, lifetime = _terms(traffic, duration)

    async def go() -> int:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return (await catalog.add_package(conn, name, limit, lifetime)).id

    print(asyncio.run(go()))


@catalog_app.command("edit")
def catalog_edit(package_id: int, name: str, traffic: Traffic, duration: Duration = None) -> None:
    """Give PACKAGE_ID new terms for later purchases; items bought before keep theirs."""
    settings = load_settings()
    limit, lifetime = _terms(traffic, duration)

    async def go() -> Package | None:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await catalog.edit_package(conn, package_id, name, limit, lifetime)

    if asyncio.run(go()) is None:
        console.print(f"[red]no package {package_id}[/red]")
        raise typer.Exit(1)


@catalog_app.command("retire")
def catalog_retire(package_id: int) -> None:
    """Stop selling PACKAGE_ID: later purchases of it are dead-lettered (domain_rule); items
    bought before keep their terms and run their course."""
    settings = load_settings()

    async def go() -> Package | None:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await catalog.retire_package(conn, package_id)

    if asyncio.run(go()) is None:
        console.print(f"[red]no package {package_id}[/red]")
        raise typer.Exit(1)


@catalog_app.command("list")
def catalog_list() -> None:
    """List the catalog."""
    settings = load_settings()

    async def go() -> list[Any]:
        async with database(settings.postgres_dsn, settings.postgres_session()) as conn:
            return await catalog.list_packages(conn)

    table = Table("id", "name", "traffic_limit", "duration", "retired_at")
    for p in asyncio.run(go()):
        table.add_row(
            str(p.id),
            text(p.name),
            UNLIMITED if p.traffic_limit is None else str(p.traffic_limit),
            str(p.duration) if p.duration is not None else UNLIMITED,
            str(p.retired_at or "-"),
        )
    console.print(table)
