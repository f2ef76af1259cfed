"""`pkgq web`: serve the console and the read API; create users and tokens; end a user's
sessions; print the OpenAPI document."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import structlog
import typer
from pydantic import ValidationError

from consumers.cli import exit_codes
from consumers.web.config import WebSettings

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from infra.settings import Settings

web_app = typer.Typer(
    help="The operator console and the read API (one ASGI process on PKGQ_WEB_PORT).",
    invoke_without_command=True,
)


@web_app.callback()
def serve(
    ctx: typer.Context,
    port: Annotated[int | None, typer.Option(help="Listen here (PKGQ_WEB_PORT, 8080).")] = None,
    host: Annotated[
        str | None, typer.Option(help="Bind address (PKGQ_WEB_HOST, 127.0.0.1).")
    ] = None,
) -> None:
    """Serve the console and the API until SIGTERM/SIGINT (without a subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from consumers.web.app import create_app

    serve_app(create_app, host=host, port=port)


def serve_app(
    app_of: Callable[[Settings, WebSettings], FastAPI],
    *,
    host: str | None = None,
    port: int | None = None,
) -> None:
    """Load the settings (a bad PKGQ_WEB_* one exits 2), build the app with `app_of` and serve
    it until SIGTERM/SIGINT: what `pkgq web` does with the console's app (consumers/web/app.py),
    and `pkgq web bench` with that app and its yardstick route added."""
    import uvicorn

    from consumers.cli.running import load_routing_settings, run

    settings = load_routing_settings(logs_to_stdout=True)
    try:
        web = WebSettings.load()
    except ValidationError as exc:
        exit_codes.fail(exit_codes.USAGE, "; ".join(_setting_errors(exc)))
    problems = web.problems()
    if problems:
        exit_codes.fail(exit_codes.USAGE, "; ".join(problems))
    app = app_of(settings, web)
    if web.access_log:  # its lines are info, and libraries only log warnings (infra/logging.py)
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    structlog.get_logger(__name__).info(
        "web_starting",
        trusted_proxies=[str(net) for net in web.trusted_proxies],
        forwarded_headers="believed from trusted_proxies" if web.trusted_proxies else "ignored",
    )
    config = uvicorn.Config(
        app,
        host=host or web.host,
        port=port if port is not None else web.port,
        access_log=web.access_log,
        log_config=None,  # structlog renders the stdlib records (infra/logging.py)
        proxy_headers=False,  # PKGQ_WEB_TRUSTED_PROXIES decides instead (create_app)
    )
    run(_serve(config))


def _setting_errors(exc: ValidationError) -> list[str]:
    """Each invalid PKGQ_WEB_* setting by its variable's name, in a line."""
    found = []
    for error in exc.errors():
        field, *inside = (str(part) for part in error["loc"])
        where = f" ({'.'.join(inside)})" if inside else ""
        found.append(
            f"PKGQ_WEB_{field.upper()}{where}: {error['msg'].removeprefix('Value error, ')}"
        )
    return found


async def _serve(config: uvicorn.Config) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests in hand and exit 0, as every
    pkgq process does (uvicorn's own handlers would re-raise the signal at the end)."""
    import uvicorn

    from consumers.runtime import stop_on_signals

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # pkgq's handlers (stop_on_signals) end it instead

    server = Server(config)
    stop = stop_on_signals()
    serving = asyncio.create_task(server.serve())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stopping.cancel()
    await serving


@web_app.command("hash-password")
def hash_password_cmd(
    stdin: Annotated[bool, typer.Option("--stdin", help="Read the password from stdin.")] = False,
) -> None:
    """Print a password hash for PKGQ_WEB_USERS (asks for the password twice on a terminal)."""
    from consumers.web.auth import hash_password

    if stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            exit_codes.fail(exit_codes.USAGE, "the passwords differ")
    if len(password) < 8:
        exit_codes.fail(exit_codes.USAGE, "use at least 8 characters")
    print(hash_password(password))


@web_app.command("new-token")
def new_token_cmd(
    name: Annotated[str, typer.Argument(help="Who uses it, e.g. node-mgmt.")],
    role: Annotated[str, typer.Option(help="viewer (read) or operator.")] = "viewer",
) -> None:
    """Make a bearer token for the API: prints the token (give it to the client) and the
    PKGQ_WEB_TOKENS entry (only its sha256 is stored)."""
    from consumers.web.auth import new_token

    if role not in ("viewer", "operator"):
        raise typer.BadParameter("role must be viewer or operator")
    token, digest = new_token()
    print(f"token: {token}")
    print("PKGQ_WEB_TOKENS entry: " + json.dumps({name: {"role": role, "sha256": digest}}))


@web_app.command("sign-out")
def sign_out_cmd(
    name: Annotated[str, typer.Argument(help="The console user, as named in PKGQ_WEB_USERS.")],
) -> None:
    """End every console session of a user at once, on every replica (their "Sign out
    everywhere"): for a lost laptop or a cookie that may have leaked. They may sign in again;
    to stop that, remove them from PKGQ_WEB_USERS or change their password hash."""
    from consumers.cli.running import load_settings, on_database
    from infra.postgres import web_sessions

    ended = on_database(load_settings(), lambda conn: web_sessions.end_all(conn, name))
    print(f"{name}: {ended} session(s) ended")


def openapi_document() -> dict[str, Any]:
    """The read API's OpenAPI document (docs/openapi.json), built without any service."""
    from consumers.web.app import create_app
    from infra.settings import Settings

    app = create_app(Settings(), WebSettings(secret="x" * 32))
    return app.openapi()


@web_app.command("openapi")
def openapi_cmd() -> None:
    """Print the read API's OpenAPI document (docs/openapi.json is this)."""
    print(json.dumps(openapi_document(), indent=2, sort_keys=True))
