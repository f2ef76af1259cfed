"""`pkgq publish --schema-version`: a body of the route's previous version is checked against
that version's model and sent under its version, as an older publisher sends it; a version the
route does not take is refused before anything is sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from uuid import uuid4

import asyncpg
import pytest

from consumers.cli import exit_codes
from events.envelope import H_SCHEMA_VERSION
from infra.rabbit.tap import Tap
from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli

pytestmark = pytest.mark.e2e


async def test_a_v1_usage_record_published_as_v1_is_applied_and_a_v2_one_beside_it(
    settings: Settings, pool: asyncpg.Pool, tap: Tap, spawn: Callable[..., PkgqProcess]
) -> None:
    spawn("run")
    user = str(uuid4())
    old = json.dumps({"user_id": user, "upload": 3, "download": 0})
    new = json.dumps({"user_id": user, "upload": 4, "download": 0, "usage_id": "cdr-1"})
    sent = await cli(settings, "publish", "usage_record", old, "--schema-version", "1")
    assert sent.returncode == 0, sent.stderr
    sent = await cli(settings, "publish", "usage_record", new)
    assert sent.returncode == 0, sent.stderr

    async def billed() -> bool:
        async with pool.acquire() as conn:
            up = await conn.fetchval(
                "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id::text = $1", user
            )
        return bool(up == 7)

    await eventually(billed)
    sent_versions = [
        t.headers.get(H_SCHEMA_VERSION)
        for t in tap.seen
        if t.exchange == settings.exchange and t.json().get("user_id") == user
    ]
    assert sent_versions == [1, 2]  # each under the version it was written in


async def test_a_v2_field_in_a_v1_body_and_an_unknown_version_are_refused_naming_the_versions(
    settings: Settings,
) -> None:
    user = str(uuid4())
    mixed = json.dumps({"user_id": user, "upload": 1, "download": 0, "usage_id": "x"})
    refused = await cli(settings, "publish", "usage_record", mixed, "--schema-version", "1")
    assert refused.returncode == exit_codes.USAGE
    assert "schema version 1" in refused.stderr
    assert "usage_id" in refused.stderr
    body = json.dumps({"user_id": user, "upload": 1, "download": 0})
    unknown = await cli(settings, "publish", "usage_record", body, "--schema-version", "3")
    assert unknown.returncode == exit_codes.USAGE
    assert "2 (current) or 1, not 3" in unknown.stderr
