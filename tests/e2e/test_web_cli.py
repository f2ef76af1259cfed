"""`pkgq web`'s own commands, run as an operator runs them: password hashes and tokens for the
settings, the OpenAPI document, and a refusal to start without a secret or anyone to sign in."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from uuid import uuid4

import asyncpg
import pytest

from consumers.web.auth import verify_password
from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli, free_port, http_get, pkgq
from tests.web.client import OPERATOR_PASSWORD, VIEWER_PASSWORD, client, sign_in
from tests.web.stack import web_env

pytestmark = pytest.mark.e2e
COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


async def test_hash_password_prints_a_hash_that_verifies_the_password(settings: Settings) -> None:
    done = await cli(settings, "web", "hash-password", "--stdin", stdin="s3cret-enough\n")
    assert done.returncode == 0, done.stderr
    stored = done.stdout.strip()
    assert stored.startswith("scrypt$15$8$1$")
    assert verify_password("s3cret-enough", stored)
    assert not verify_password("s3cret-enougH", stored)
    short = await cli(settings, "web", "hash-password", "--stdin", stdin="short\n")
    assert short.returncode == 2  # a usage error (the CLI's contract)
    assert "at least 8 characters" in short.stderr


async def test_new_token_prints_the_token_and_only_its_sha256_for_the_settings(
    settings: Settings,
) -> None:
    done = await cli(settings, "web", "new-token", "node-mgmt")
    assert done.returncode == 0, done.stderr
    token_line, entry_line = done.stdout.strip().splitlines()
    token = token_line.removeprefix("token: ")
    entry = json.loads(entry_line.removeprefix("PKGQ_WEB_TOKENS entry: "))
    assert entry == {
        "node-mgmt": {"role": "viewer", "sha256": hashlib.sha256(token.encode()).hexdigest()}
    }
    assert token not in entry_line


async def test_the_console_refuses_to_start_without_a_secret_or_anyone_to_sign_in(
    settings: Settings,
) -> None:
    done = await cli(settings, "web", "--port", "0")
    assert done.returncode == 2
    assert "PKGQ_WEB_SECRET must be set" in done.stderr
    assert "nobody could sign in" in done.stderr


def test_the_openapi_command_prints_the_committed_document(settings: Settings) -> None:
    done = pkgq(settings, "web", "openapi")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(COMMITTED.read_text())


async def test_the_console_process_answers_its_probes_refuses_anonymous_calls_and_stops_on_sigterm(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    port = free_port()
    web = spawn("web", **web_env(port))

    async def ready() -> bool:
        try:
            return (await http_get(port, "/readyz"))[0] == 200
        except OSError:
            return False

    await eventually(ready, within=60)
    assert await http_get(port, "/healthz") == (200, "ok")
    status, body = await http_get(port, f"/api/v1/users/{uuid4()}/current")
    assert status == 401
    assert "bearer token" in body
    status, _ = await http_get(port, "/dead-letters")
    assert status == 303  # to the sign-in form
    assert web.terminate() == 0, web.logs()


async def test_web_sign_out_ends_every_console_session_of_that_user_only(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    async with client(settings, pool) as laptop, client(settings, pool) as colleague:
        await sign_in(laptop, "olga", OPERATOR_PASSWORD)
        await sign_in(colleague, "vic", VIEWER_PASSWORD)
        done = await cli(settings, "web", "sign-out", "olga")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "olga: 1 session(s) ended"
        assert (await laptop.get("/holds")).status_code == 303  # off to sign in
        assert (await colleague.get("/holds")).status_code == 200
        again = await cli(settings, "web", "sign-out", "olga")
        assert again.stdout.strip() == "olga: 0 session(s) ended"
