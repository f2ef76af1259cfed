"""The `pkgq` app: every command and command group named in one place, and `--version`.

One module per command group: services (migrate, run, relay), inspect (routes, stats,
definitions, asyncapi), publish (publish, wait), groups (group, grant), workers (workers,
prune), tail, doctor, history (find, user history), user, catalog, dlq (+ dlq_changes),
partitions, queues, routes (route), web. What they share: running (settings, the event loop,
connections), output (tables or JSON, literal text), options (routes, durations,
--json/--yes/--dry-run), confirm, exit_codes, durations, sizes. The app imports none of them:
COMMANDS and GROUPS say where each is defined, and lazy.py imports a command's module when the
command is named. The developer tools (bench, demo) live in the `devtools` package; their
commands come in through the `pkgq.commands` entry points when it is installed.
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated

import typer

from consumers.cli.lazy import LazyGroup, Source

COMMANDS: dict[str, Source] = {
    **dict.fromkeys(("migrate", "run", "relay"), Source("consumers.cli.services")),
    **dict.fromkeys(
        ("routes", "stats", "definitions", "asyncapi"), Source("consumers.cli.inspect")
    ),
    **dict.fromkeys(("publish", "wait"), Source("consumers.cli.publish")),
    "grant": Source("consumers.cli.groups"),
    **dict.fromkeys(("workers", "prune"), Source("consumers.cli.workers")),
    "tail": Source("consumers.cli.tail"),
    "doctor": Source("consumers.cli.doctor"),
    "find": Source("consumers.cli.history"),
}
"""The top-level commands, as `pkgq --help` lists them, and where each is defined: a module's
`register(app)` adds them (tests/unit/test_cli_lazy.py checks this against every module)."""

GROUPS: dict[str, Source] = {
    "group": Source("consumers.cli.groups"),
    "user": Source("consumers.cli.user", "user_app"),
    "catalog": Source("consumers.cli.catalog", "catalog_app"),
    "dlq": Source("consumers.cli.dlq", "dlq_app"),
    "partitions": Source("consumers.cli.partitions", "partitions_app"),
    "queues": Source("consumers.cli.queues", "queues_app"),
    "route": Source("consumers.cli.routes", "route_app"),
    "web": Source("consumers.cli.web", "web_app"),
}
"""The command groups, listed after the commands: a module's `register(app)` or its Typer."""

PLUGINS = "pkgq.commands"
"""The entry-point group through which other packages add commands (pyproject: devtools adds
`pkgq bench`, `pkgq demo` and `pkgq web bench`), so that the command line never imports them
itself; each is a `register(app)` function, loaded only when a command may be one of its."""


class _Root(LazyGroup):
    """`pkgq`'s group: the commands of COMMANDS, GROUPS and the plugins, built when named."""

    command_sources = COMMANDS
    group_sources = GROUPS
    plugins = PLUGINS

    def typer_app(self) -> typer.Typer:
        return app


app = typer.Typer(
    cls=_Root,  # commands imported when named (lazy.py); help texts as sentences (help_text.py)
    help="pkgq: the telecom package queue on RabbitMQ and PostgreSQL.",
    pretty_exceptions_enable=False,  # plain tracebacks: readable in journald and log shippers
)


def version() -> str:
    """The installed pkgq's version."""
    return metadata.version("pkgq")


def _print_version(wanted: bool) -> None:
    if wanted:
        print(f"pkgq {version()}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print pkgq's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """pkgq: the telecom package queue on RabbitMQ and PostgreSQL."""
