"""The application factory: one FastAPI app, one asyncpg pool opened at startup and kept for the
process's life (no per-request connection setup), Jinja2 templates and a little static CSS/JS."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

import asyncpg
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.datastructures import MutableHeaders
from starlette.middleware.sessions import SessionMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from consumers.web import (
    api,
    auth,
    dlq_pages,
    hold_pages,
    pages,
    replay_pages,
    route_pages,
    sessions,
    timeline_pages,
    trends,
)
from consumers.web.config import WebSettings
from consumers.web.dependencies import open_pool, render
from consumers.web.throttle import Limit, LoginThrottle
from infra.settings import Settings

HERE = Path(__file__).parent
TITLE = "pkgq read API"
VERSION = "1"


def templates() -> Jinja2Templates:
    found = Jinja2Templates(directory=HERE / "templates")
    found.env.filters["short"] = _short
    return found


def _short(value: object, width: int = 60) -> str:
    line = str(value if value is not None else "").replace("\n", " ")
    return line if len(line) <= width else line[: width - 1] + "…"


def create_app(
    settings: Settings,
    web: WebSettings,
    pool: asyncpg.Pool | None = None,
) -> FastAPI:
    """The console and the API. `pool`: an open pool to use (tests); by default the app opens
    its own at startup, PKGQ_WEB_POOL_MAX_SIZE connections at most, and closes it at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if pool is not None:
            app.state.pool = pool
            await sessions.end_unconfigured(pool, web)
            yield
            return
        own = await open_pool(settings, web)
        app.state.pool = own
        try:
            await sessions.end_unconfigured(own, web)
            yield
        finally:
            await own.close()

    app = FastAPI(
        title=TITLE,
        version=VERSION,
        description=(
            "pkgq's read API for node management: a user's current package (GetCurrentPackage), "
            "all their packages (GetAllMyPackages) and the access read model. Every call needs "
            "`Authorization: Bearer <token>` (PKGQ_WEB_TOKENS) or a console session."
        ),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/v1/openapi.json",
    )
    app.state.settings = settings
    app.state.web = web
    app.state.pool = pool
    app.state.templates = templates()
    app.state.login_throttle = LoginThrottle(
        Limit(web.login_failures, web.login_window),
        Limit(web.login_address_failures, web.login_window),
    )
    app.add_middleware(
        SessionMiddleware,
        secret_key=web.secret,
        session_cookie="pkgq_session",
        max_age=web.session_ttl,
        same_site="strict",
        https_only=web.secure_cookies,
    )
    app.add_middleware(SecurityHeaders)
    if web.trusted_proxies:
        # Outermost, so the throttle, the sign-in log lines and uvicorn's access log all see
        # the forwarded client: from a trusted peer, the right-most X-Forwarded-For address
        # that is no trusted proxy (a client cannot prepend its way past its ingress) and the
        # X-Forwarded-Proto scheme. Here rather than uvicorn's proxy_headers, whose default
        # trusts 127.0.0.1 and FORWARDED_ALLOW_IPS from the environment.
        app.add_middleware(
            ProxyHeadersMiddleware, trusted_hosts=[str(net) for net in web.trusted_proxies]
        )
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.include_router(api.router)
    app.include_router(pages.router)
    app.include_router(replay_pages.router)
    app.include_router(dlq_pages.router)
    app.include_router(hold_pages.router)
    app.include_router(route_pages.router)
    app.include_router(trends.router)
    app.include_router(timeline_pages.router)

    @app.exception_handler(auth.LoginRequiredError)
    async def to_login(request: Request, exc: auth.LoginRequiredError) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target)}", status_code=303)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if request.url.path.startswith(("/api/", "/healthz", "/readyz")):
            return await http_exception_handler(request, exc)
        if exc.status_code < 500:
            # Signed in, the error page has the console's header (a 404 for an unknown path
            # had no page dependency look the session up yet).
            await sessions.principal(request)
        return render(
            request,
            "error.html",
            {"status": exc.status_code, "detail": exc.detail},
            status_code=exc.status_code,
        )

    return app


_HEADERS = {
    # Only this site's own script and style; no framing (clickjacking a confirmation button);
    # no referrer with ids in it leaves the site.
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class SecurityHeaders:
    """The headers above on every console response (plain ASGI: nothing in the API's path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(_HEADERS)
            await send(message)

        await self.app(scope, receive, with_headers)
