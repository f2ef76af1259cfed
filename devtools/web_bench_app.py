"""The app `pkgq web bench` loads (devtools/web_bench.py): production's console and read API
(consumers/web/app.py), served as `pkgq web` serves it, with one route added that production
does not have: GET /api/v1/baseline, the yardstick /api/v1/users/{id}/current is measured
against. It goes through the same stack (bearer auth, the app's long-lived pool, a JSON answer)
around the cheapest one-row statement, so the ratio of the two is what the read API's own
work costs.

    python -m devtools.web_bench_app    # PKGQ_* and PKGQ_WEB_* settings as `pkgq web` reads
"""

from __future__ import annotations

import asyncpg
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from consumers.cli.web import serve_app
from consumers.web.app import create_app
from consumers.web.config import WebSettings
from consumers.web.dependencies import ApiViewer, pool_of
from devtools.postgres import web_bench_data
from infra.settings import Settings

BASELINE = "/api/v1/baseline"

baseline = APIRouter(include_in_schema=False)


@baseline.get(BASELINE)
async def select_one(request: Request, who: ApiViewer) -> JSONResponse:
    """The benchmark's yardstick: the read API's auth, pool and JSON path, one trivial
    statement."""
    async with pool_of(request).acquire() as conn:
        return JSONResponse({"one": await web_bench_data.select_one(conn)})


def bench_app(settings: Settings, web: WebSettings, pool: asyncpg.Pool | None = None) -> FastAPI:
    """Production's app (`pool`: as create_app's) with the baseline route added."""
    app = create_app(settings, web, pool)
    app.include_router(baseline)
    return app


def main() -> None:
    """Serve the bench's app until SIGTERM/SIGINT, as `pkgq web` serves production's."""
    serve_app(bench_app)


if __name__ == "__main__":
    main()
