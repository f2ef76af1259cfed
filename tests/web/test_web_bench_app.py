"""The app `pkgq web bench` serves (devtools/web_bench_app.py): production's app with the
baseline route added in devtools, behind the read API's own auth and pool; production's app has
no such route."""

from __future__ import annotations

import asyncpg
import httpx

from consumers.web.app import create_app
from devtools.web_bench_app import BASELINE, bench_app
from infra.settings import Settings
from tests.web.client import bearer, web_settings


def _client(app: object) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # an ASGI app
    return httpx.AsyncClient(transport=transport, base_url="http://console")


async def test_the_bench_app_answers_the_baseline_with_one_row_behind_the_read_apis_auth(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with _client(bench_app(settings, web_settings(), pool)) as http:
        signed = await http.get(BASELINE, headers=bearer())
        anonymous = await http.get(BASELINE)
        current = await http.get(
            "/api/v1/users/00000000-0000-0000-0000-000000000000/current", headers=bearer()
        )

    assert (signed.status_code, signed.json()) == (200, {"one": 1})
    assert anonymous.status_code == 401
    assert current.status_code == 404  # the read API itself is there, unchanged: unknown user


async def test_the_production_app_has_no_baseline_route(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    app = create_app(settings, web_settings(), pool)
    async with _client(app) as http:
        reply = await http.get(BASELINE, headers=bearer())

    assert reply.status_code == 404
    assert all(getattr(route, "path", None) != BASELINE for route in app.routes)
