"""The `pkgq` app: every command group registered in one place, and `--version`.

One module per command group: services (migrate, run, relay), inspect (routes, stats,
definitions, asyncapi), publish (publish, wait), groups (group, grant), workers (workers,
prune), tail, doctor, user, catalog, dlq (+ dlq_changes), partitions. What they share: running
(settings, the event loop, connections), output (tables or JSON, literal text), options (routes,
durations, --json/--yes/--dry-run), confirm, exit_codes, durations, sizes. The developer tools
(bench, demo) live in the `devtools` package; their commands come in through the
`pkgq.commands` entry points when it is installed.
"""

from __future__ import annotations

from importlib import metadata
from typing import Annotated

import typer

from consumers.cli import doctor, groups, history, inspect, publish, services, tail, workers
from consumers.cli.catalog import catalog_app
from consumers.cli.dlq import dlq_app
from consumers.cli.help_text import ReflowedGroup
from consumers.cli.partitions import partitions_app
from consumers.cli.queues import queues_app
from consumers.cli.routes import route_app
from consumers.cli.user import user_app
from consumers.cli.web import web_app

app = typer.Typer(
    cls=ReflowedGroup,  # help texts as sentences, wrapped by the terminal (help_text.py)
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


for module in (services, inspect, publish, groups, workers, tail, doctor, history):
    module.register(app)
app.add_typer(user_app, name="user")
app.add_typer(catalog_app, name="catalog")
app.add_typer(dlq_app, name="dlq")
app.add_typer(partitions_app, name="partitions")
app.add_typer(queues_app, name="queues")
app.add_typer(route_app, name="route")
app.add_typer(web_app, name="web")


PLUGINS = "pkgq.commands"
"""The entry-point group through which other packages add commands (pyproject: devtools adds
`pkgq bench` and `pkgq demo`), so that the command line never imports them itself."""


def _add_plugins(target: typer.Typer) -> None:
    """Commands from installed plugins: `pkgq bench` and `pkgq demo` where the devtools package
    is installed (a checkout; not the production image, which leaves devtools/ out)."""
    for entry in metadata.entry_points(group=PLUGINS):
        try:
            register = entry.load()
        except ModuleNotFoundError as missing:
            if missing.name != entry.module.partition(".")[0]:
                raise  # the plugin is there but broken: say so rather than hide its commands
            continue  # declared by the project's metadata, not shipped here
        register(target)


_add_plugins(app)
