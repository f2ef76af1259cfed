"""A publisher that is not Python: docs/publishing.md's `amqp-publish` example (Debian's
amqp-tools, a C client) sends a purchase to a real `pkgq run`, which applies it."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import asyncpg
import pytest

from events.routes import PACKAGE_PURCHASE
from infra.settings import Settings
from tests.support.deliveries import add_package
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[2] / "docs" / "publishing.md"
MARK = "<!-- amqp-publish example"


def documented_example() -> str:
    """The shell block that follows the marker in docs/publishing.md."""
    text = DOC.read_text()
    found = re.search(re.escape(MARK) + r".*?\n```sh\n(.*?)\n```", text, re.DOTALL)
    assert found, f"{DOC} has no ```sh block after {MARK!r}"
    return found.group(1)


def amqp_tools_url(url: str) -> str:
    """rabbitmq-c reads a trailing `/` as the empty vhost; without a path it means `/`."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="" if parts.path == "/" else parts.path))


def test_the_documented_example_publishes_a_purchase_with_every_envelope_field() -> None:
    example = documented_example()
    assert "--routing-key=telecom.package_purchase" in example
    for field in ("x-message-id", f"x-message-type: {PACKAGE_PURCHASE.message_type}"):
        assert field in example
    assert "--content-type=application/json" in example


async def test_a_purchase_published_with_amqp_publish_is_applied_once_in_postgres(
    settings: Settings, pool: asyncpg.Pool, spawn: Callable[..., PkgqProcess]
) -> None:
    tool = shutil.which("amqp-publish")
    assert tool, "amqp-publish is missing: run deploy/local/ensure-tools.sh"
    package = await add_package(pool, 1_000_000)
    user = uuid4()
    run = spawn("run", "package_purchase", "--no-ingest")

    async def subscribed() -> bool:
        assert run.proc.poll() is None, run.logs()
        return '"event": "ready"' in run.logs()

    await eventually(subscribed, within=60)
    env = {
        "PATH": "/usr/bin:/bin",
        "AMQP_URL": amqp_tools_url(settings.amqp_url),
        "EXCHANGE": settings.exchange,
        "USER_ID": str(user),
        "PACKAGE_ID": str(package),
    }
    done = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euo", "pipefail", "-c", documented_example()],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr

    async def queued() -> bool:
        async with pool.acquire() as conn:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1", user
                )
            )

    await eventually(queued, within=30)
    async with pool.acquire() as conn:
        items = await conn.fetch(
            "SELECT package_id, status::text AS status FROM telecom.package_queue "
            "WHERE user_id = $1",
            user,
        )
        dead = await conn.fetchval("SELECT count(*) FROM telecom.dead_letters")
        inbox = await conn.fetchval(
            "SELECT count(*) FROM telecom.inbox WHERE consumer = $1", PACKAGE_PURCHASE.short_name
        )
    assert [(r["package_id"], r["status"]) for r in items] == [(package, "in_queue")]
    assert dead == 0
    assert inbox == 1  # applied under the message_id it sent as x-message-id
