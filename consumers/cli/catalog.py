"""`pkgq catalog`: the packages on sale. Items keep the terms they were bought with, so an edit
or a retirement changes later purchases only."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Annotated

import typer

from consumers.cli import exit_codes
from consumers.cli.durations import parse_duration
from consumers.cli.options import JsonOpt, as_parameter
from consumers.cli.output import Column, field, show, show_table
from consumers.cli.running import load_settings, on_database
from consumers.cli.sizes import parse_size
from domain.model import Package
from infra.postgres import catalog

catalog_app = typer.Typer(help="The package catalog: the packages on sale and their terms.")
UNLIMITED = "unlimited"

Traffic = Annotated[
    str, typer.Option(help="Traffic limit: bytes, 500MiB, 2GB, ..., or 'unlimited' (time only).")
]
Duration = Annotated[
    str | None,
    typer.Option(help="Lifetime once active: 90s, 15m, 12h, 30d, 1w; omit or 'unlimited': none."),
]


def _terms(traffic: str, duration: str | None) -> tuple[int | None, timedelta | None]:
    limit = None if traffic.strip().lower() == UNLIMITED else as_parameter(parse_size, traffic)
    lifetime = (
        None
        if duration is None or duration.strip().lower() == UNLIMITED
        else as_parameter(parse_duration, duration)
    )
    if limit is None and lifetime is None:
        raise typer.BadParameter("a package needs a traffic limit, a duration or both")
    return limit, lifetime


def _as_json(package: Package) -> dict[str, object]:
    row = dataclasses.asdict(package)
    row["duration_s"] = None if package.duration is None else package.duration.total_seconds()
    row.pop("duration")
    return row


def _show_package(package: Package | None, package_id: int | None, as_json: bool) -> None:
    """A changed package: its id as text, or the whole package as JSON; exit 3 if missing."""
    if package is None:
        exit_codes.fail(exit_codes.NOT_FOUND, f"no package {package_id}")
    show(package, as_json, lambda p: print(p.id), data=_as_json(package))


@catalog_app.command("add")
def catalog_add(
    name: str, traffic: Traffic, duration: Duration = None, as_json: JsonOpt = False
) -> None:
    """Add a package to the catalog and print its id."""
    settings = load_settings()
    limit, lifetime = _terms(traffic, duration)
    added = on_database(settings, lambda conn: catalog.add_package(conn, name, limit, lifetime))
    _show_package(added, None, as_json)


@catalog_app.command("edit")
def catalog_edit(
    package_id: int,
    name: str,
    traffic: Traffic,
    duration: Duration = None,
    as_json: JsonOpt = False,
) -> None:
    """Give PACKAGE_ID new terms for later purchases; items bought before keep theirs."""
    settings = load_settings()
    limit, lifetime = _terms(traffic, duration)
    changed = on_database(
        settings, lambda conn: catalog.edit_package(conn, package_id, name, limit, lifetime)
    )
    _show_package(changed, package_id, as_json)


@catalog_app.command("retire")
def catalog_retire(package_id: int, as_json: JsonOpt = False) -> None:
    """Stop selling PACKAGE_ID: later purchases of it are dead-lettered (domain_rule); items
    bought before keep their terms and run their course."""
    settings = load_settings()
    retired = on_database(settings, lambda conn: catalog.retire_package(conn, package_id))
    _show_package(retired, package_id, as_json)


@catalog_app.command("list")
def catalog_list(as_json: JsonOpt = False) -> None:
    """List the catalog."""
    settings = load_settings()
    columns: list[Column] = [
        ("id", lambda p: str(p["id"])),
        ("name", field("name")),
        ("traffic_limit", lambda p: _or_unlimited(p["traffic_limit"])),
        ("duration", lambda p: _duration(p["duration_s"])),
        ("retired_at", lambda p: str(p["retired_at"] or "-")),
    ]
    packages = on_database(settings, catalog.list_packages)
    show_table([_as_json(p) for p in packages], as_json, columns)


def _or_unlimited(limit: int | None) -> str:
    return UNLIMITED if limit is None else str(limit)


def _duration(duration_s: float | None) -> str:
    return UNLIMITED if duration_s is None else str(timedelta(seconds=duration_s))
