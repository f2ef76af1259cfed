"""`pkgq doctor`: check the invariants pkgq's guarantees rest on (infra/postgres/invariants.py),
one SQL statement each, and name every row that breaks one.

The results are stored as the checks' last (telecom.invariant_checks), as the relay's periodic
run stores them: the console's overview shows them. Exit status 0 when every invariant holds,
8 (violations) when any does not.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from consumers.cli import exit_codes
from consumers.cli.options import JsonOpt
from consumers.cli.output import Column, console, say, show, table, text
from consumers.cli.running import load_settings, on_database
from infra.postgres import invariants
from infra.postgres.check_base import EVER
from infra.postgres.invariants import HOLD_WITHOUT_WAY_OUT, Result

NEXT_STEP = {
    HOLD_WITHOUT_WAY_OUT.name: "once you know why its blocker was lost, release a hold with "
    "`pkgq dlq release-hold --consumer CONSUMER --user USER_ID` (or from the console's holds "
    "page): what is parked behind it is applied in order",
}
"""What to do about a check's violations, where pkgq has a command for it."""


def _as_data(results: list[Result]) -> list[dict[str, Any]]:
    return [
        {
            "check": r.check,
            "ok": r.ok,
            "violations": r.violations,
            "about": invariants.BY_NAME[r.check].about,
            "sample": r.sample,
        }
        for r in results
    ]


def _value(value: object) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)


def _named(row: dict[str, Any]) -> str:
    """One violating row on one line, every column named (`consumer=… user_id=… blocker=…`):
    never cut to a terminal's width, so a script or a person can take the ids from it."""
    return " ".join(f"{key}={_value(value)}" for key, value in row.items())


def _render(results: list[Result]) -> None:
    columns: list[Column] = [
        ("check", lambda r: text(r.check)),
        (
            "violations",
            lambda r: Text(str(r.violations), style="bold red" if r.violations else "green"),
        ),
        ("what a violation means", lambda r: text(invariants.BY_NAME[r.check].about)),
    ]
    console().print(table(results, columns))
    for result in results:
        if result.ok:
            continue
        shown = len(result.sample)
        console().print(Text(f"\n{result.check}: {result.violations} violation(s)", style="bold"))
        for row in result.sample:
            say("  ", _named(row))
        if shown < result.violations:
            say(f"{result.violations - shown} more not shown")
        if result.check in NEXT_STEP:
            say(NEXT_STEP[result.check])
    broken = sum(not r.ok for r in results)
    say(
        "every invariant holds"
        if not broken
        else f"{broken} of {len(results)} invariant(s) do not hold"
    )


def doctor_cmd(as_json: JsonOpt = False) -> None:
    """Check pkgq's invariants (every hold has a way out, every parked message a hold, every
    failed message is accounted for, one active item per user, traffic conserved, activations
    dated in order), one SQL statement each; name the rows that break them. Exit 8 if any does
    not hold."""
    settings = load_settings()
    graces = invariants.Graces(attempts_bound=settings.attempts_bound(), activations_s=EVER)
    results = on_database(settings, lambda conn: invariants.check_and_store(conn, graces=graces))
    show(results, as_json, _render, data=_as_data(results))
    if any(not r.ok for r in results):
        raise typer.Exit(exit_codes.VIOLATIONS)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
