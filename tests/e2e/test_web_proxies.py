"""`pkgq web` behind an ingress (PKGQ_WEB_TRUSTED_PROXIES): a real process on 127.0.0.1, which
the test's requests play the ingress from. X-Forwarded-For and X-Forwarded-Proto count only
from a trusted peer, and then the client is the right-most forwarded address that is no trusted
proxy; from anyone else the headers are ignored."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli, free_port, http_get
from tests.web.client import OPERATOR_PASSWORD, sign_in
from tests.web.stack import web_env

pytestmark = pytest.mark.e2e
THROTTLE = {"PKGQ_WEB_LOGIN_ADDRESS_FAILURES": "3", "PKGQ_WEB_LOGIN_FAILURES": "100"}


async def _console(spawn: Callable[..., PkgqProcess], **env: str) -> tuple[PkgqProcess, str]:
    port = free_port()
    web = spawn("web", **web_env(port), **THROTTLE, PKGQ_WEB_ACCESS_LOG="true", **env)

    async def ready() -> bool:
        try:
            return (await http_get(port, "/readyz"))[0] == 200
        except OSError:
            return False

    await eventually(ready, within=60)
    return web, f"http://127.0.0.1:{port}"


async def _sign_in(base: str, forwarded_for: str, user: str, password: str) -> int:
    """A sign-in (the form, then its post) whose requests carry `forwarded_for`."""
    headers = {"X-Forwarded-For": forwarded_for}
    async with httpx.AsyncClient(base_url=base, headers=headers) as http:
        return (await sign_in(http, user, password)).status_code


async def _redirect_scheme(base: str) -> str:
    """The scheme of the absolute URL the app redirects `/login/` to, asked as https."""
    async with httpx.AsyncClient(base_url=base) as http:
        moved = await http.get("/login/", headers={"X-Forwarded-Proto": "https"})
    assert moved.status_code == 307, moved.text
    return httpx.URL(moved.headers["location"]).scheme


def _events(web: PkgqProcess, event: str) -> list[dict[str, Any]]:
    return [line for line in _lines(web) if line.get("event") == event]


def _posted_from(web: PkgqProcess) -> list[str]:
    """The client of each sign-in post, as uvicorn's access log names it."""
    access = (line["event"] for line in _lines(web) if line.get("logger") == "uvicorn.access")
    return [event.split(" ")[0] for event in access if '"POST /login ' in event]


def _lines(web: PkgqProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in web.logs().splitlines() if line.startswith("{")]


async def test_behind_a_trusted_proxy_sign_ins_are_throttled_per_forwarded_client(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    web, base = await _console(spawn, PKGQ_WEB_TRUSTED_PROXIES="10.0.0.0/8, 127.0.0.1")
    # Client A at 203.0.113.7 writes its own X-Forwarded-For (a new one each time); its
    # ingress appends A's address, and a second trusted hop (10.1.2.3) appends the ingress's.
    for n, name in enumerate(["ann", "bob", "cy"]):
        assert await _sign_in(base, f"198.51.100.{n}, 203.0.113.7, 10.1.2.3", name, "x") == 401
    a = await _sign_in(base, "192.0.2.1, 203.0.113.7, 10.1.2.3", "olga", OPERATOR_PASSWORD)
    assert a == 429  # A is locked out, whatever it prepended
    assert await _sign_in(base, "203.0.113.8", "olga", OPERATOR_PASSWORD) == 303  # B is not
    assert await _redirect_scheme(base) == "https"  # X-Forwarded-Proto is believed too
    assert [e["address"] for e in _events(web, "web_login_failed")] == ["203.0.113.7"] * 3
    assert [e["address"] for e in _events(web, "web_login_throttled")] == ["203.0.113.7"]
    assert _posted_from(web) == ["203.0.113.7:0"] * 4 + ["203.0.113.8:0"]
    [started] = _events(web, "web_starting")
    assert started["trusted_proxies"] == ["10.0.0.0/8", "127.0.0.1/32"]
    assert web.terminate() == 0, web.logs()


@pytest.mark.parametrize("trusted", ["", "10.0.0.0/8"], ids=["none-trusted", "peer-not-trusted"])
async def test_an_untrusted_peers_forwarded_headers_are_ignored_so_spoofing_escapes_no_lockout(
    settings: Settings, spawn: Callable[..., PkgqProcess], trusted: str
) -> None:
    web, base = await _console(spawn, PKGQ_WEB_TRUSTED_PROXIES=trusted)
    for n, name in enumerate(["ann", "bob", "cy"]):
        assert await _sign_in(base, f"203.0.113.{n}", name, "x") == 401
    assert await _sign_in(base, "203.0.113.99", "olga", OPERATOR_PASSWORD) == 429
    assert await _redirect_scheme(base) == "http"
    assert {e["address"] for e in _events(web, "web_login_failed")} == {"127.0.0.1"}
    assert {client.split(":")[0] for client in _posted_from(web)} == {"127.0.0.1"}
    assert web.terminate() == 0, web.logs()


async def test_the_console_refuses_to_start_with_a_trusted_proxy_that_is_no_address(
    settings: Settings,
) -> None:
    done = await cli(settings, "web", "--port", "0", PKGQ_WEB_TRUSTED_PROXIES="10.0.0.1/8")
    assert done.returncode == 2, done.stderr
    assert "PKGQ_WEB_TRUSTED_PROXIES: '10.0.0.1/8' is not an IP address" in done.stderr
    assert "host bits set" in done.stderr
