"""What every request handler of the console and the API depends on: the process's one pool,
the signed-in user (viewer, operator, or an API token) and a page rendered with the CSRF token.
The app factory (app.py) opens the pool and mounts the routers that use these."""

from __future__ import annotations

from typing import Annotated, Any

import asyncpg
from fastapi import Depends, HTTPException, Request
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from consumers.web import auth, sessions
from consumers.web.config import WebSettings
from infra.postgres.pool import QueryLogger, create_pool
from infra.settings import Settings


async def open_pool(
    settings: Settings, web: WebSettings, query_logger: QueryLogger | None = None
) -> asyncpg.Pool:
    """The process's one pool, kept open for its life."""
    return await create_pool(
        settings.postgres_dsn,
        min_size=1,
        max_size=web.pool_max_size,
        application_name="pkgq-web",
        query_logger=query_logger,
        session=settings.postgres_session(),
        # Requests never SET, LISTEN or lock for the session: skip the reset round trip, so an
        # API call is one statement on the wire.
        reset_session=False,
        dead_peer_timeout=settings.dead_peer_timeout,
    )


def pool_of(request: Request) -> asyncpg.Pool:
    found: asyncpg.Pool = request.app.state.pool
    return found


def render(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """A console page, with what every page shows: who is signed in (as the page's dependency
    found: sessions.principal) and the CSRF token."""
    who = getattr(request.state, "who", None)
    page: HTMLResponse = request.app.state.templates.TemplateResponse(
        request,
        name,
        {"who": who, "csrf": auth.csrf_token(request), **context},
        status_code=status_code,
    )
    return page


async def page_viewer(request: Request) -> auth.Principal:
    """A console page: any signed-in user, else off to the login form."""
    who = await sessions.principal(request)
    if who is None:
        raise auth.LoginRequiredError
    return who


async def page_operator(request: Request) -> auth.Principal:
    """A console action: an operator (a viewer gets 403)."""
    who = await page_viewer(request)
    if not who.may("operator"):
        raise HTTPException(403, f"{who.name} is a viewer: only operators may do this")
    return who


_BEARER = HTTPBearer(
    auto_error=False,
    description="A token from `pkgq web new-token` (its sha256 in PKGQ_WEB_TOKENS).",
)


async def api_viewer(
    request: Request,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
) -> auth.Principal:
    """An API call: a bearer token, or a console session. (`_documented` puts the bearer scheme
    in the OpenAPI document; the token is checked by auth.token_principal.)"""
    web: WebSettings = request.app.state.web
    who = auth.token_principal(request, web) or await sessions.principal(request)
    if who is None:
        raise HTTPException(
            401,
            "a bearer token or a console session is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return who


Viewer = Annotated[auth.Principal, Depends(page_viewer)]
Operator = Annotated[auth.Principal, Depends(page_operator)]
ApiViewer = Annotated[auth.Principal, Depends(api_viewer)]


def page_size(limit: str | None, default: int, most: int) -> int:
    """A page's `limit` query parameter: `default` when absent, else 1..`most` (else 422)."""
    if limit is None:
        return default
    if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= most:
        raise HTTPException(422, f"limit must be a number from 1 to {most}")
    return int(limit)
