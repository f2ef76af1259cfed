"""`pkgq tail`: a live view of what crosses the exchange and the dead-letter exchange, as a
real process reading a real broker; one line per message, JSON or printable text; SIGTERM
stops it cleanly."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any
from uuid import uuid4

import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_DEAD_REASON, H_SCHEMA_VERSION, H_USER_ID
from events.models import PurchasePackage, RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.rabbit.publisher import Publisher, build_message
from infra.settings import Settings
from tests.support.broker_users import broker_user, grant, unique_role_users, url_for
from tests.support.deliveries import send
from tests.support.processes import settings_env

pytestmark = pytest.mark.e2e

ESC = "\x1b"
WITHIN = 30.0


class Tail:
    """A `pkgq tail` process whose output is read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), WITHIN)
        assert raw, "pkgq tail ended its output"
        return raw.decode().rstrip("\n")

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), WITHIN)


async def started(settings: Settings, *args: str, **env: str) -> Tail:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumers",
        "tail",
        *args,
        env=settings_env(settings, **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    said: list[bytes] = []
    while True:  # its queues are bound once it logs tail_started
        raw = await asyncio.wait_for(proc.stderr.readline(), WITHIN)
        assert raw, f"pkgq tail exited before it started: {b''.join(said).decode()}"
        said.append(raw)
        if b"tail_started" in raw:
            return Tail(proc)


@pytest.fixture
async def tails() -> AsyncIterator[list[Tail]]:
    running: list[Tail] = []
    yield running
    for tail in running:
        if tail.proc.returncode is None:
            tail.proc.kill()
            await tail.proc.wait()


async def dead_letter(
    settings: Settings, amqp: AbstractRobustConnection, message_type: str, reason: str
) -> str:
    """A last-resort copy on the dead-letter exchange, as pkgq's consumer publishes one."""
    publisher = await Publisher.open(amqp, settings.dlx, user_id=settings.amqp_user)
    message_id = uuid4()
    try:
        message = build_message(
            b"{}",
            message_id=message_id,
            message_type=message_type,
            headers={H_SCHEMA_VERSION: 1, H_DEAD_REASON: reason, H_USER_ID: str(uuid4())},
        )
        await publisher.publish(message, USAGE_RECORD.name)
    finally:
        await publisher.close()
    return str(message_id)


async def test_tail_json_prints_one_line_per_message_and_dead_letter_then_stops_on_sigterm(
    settings: Settings, amqp: AbstractRobustConnection, tails: list[Tail]
) -> None:
    tail = await started(settings, "--json")
    tails.append(tail)
    user = uuid4()
    sent = await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=2))
    line: dict[str, Any] = json.loads(await tail.line())
    assert line["exchange"] == settings.exchange
    assert (line["route"], line["type"]) == (USAGE_RECORD.name, "RecordUsage")
    assert (line["user_id"], line["message_id"]) == (str(user), str(sent))
    assert line["outcome"] == "published"
    assert "reason" not in line

    dead_id = await dead_letter(settings, amqp, "RecordUsage", "max_attempts")
    dead: dict[str, Any] = json.loads(await tail.line())
    assert dead["exchange"] == settings.dlx
    assert (dead["message_id"], dead["route"]) == (dead_id, USAGE_RECORD.name)
    assert (dead["outcome"], dead["reason"]) == ("dead_lettered", "max_attempts")

    assert await tail.stop() == 0


async def test_tail_filters_by_route_user_and_dead_letters_and_prints_message_data_safely(
    settings: Settings, amqp: AbstractRobustConnection, tails: list[Tail]
) -> None:
    user = uuid4()
    by_user = await started(settings, "--user", str(user))
    dead_only = await started(settings, "--route", "usage_record", "--dead-letters")
    tails.extend([by_user, dead_only])

    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=uuid4(), package_id=1))
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1))
    mine = await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=1))
    hostile = await dead_letter(settings, amqp, f"[bold]{ESC}[2J", "max_attempts")

    shown = await by_user.line()  # the others' messages and the dead letter are not shown
    assert f"{USAGE_RECORD.name} RecordUsage {user} {mine} published" in shown
    line = await dead_only.line()  # the published messages are not shown
    assert ESC not in line
    assert f"{USAGE_RECORD.name} [bold]\\x1b[2J" in line
    assert line.endswith(f"{hostile} dead_lettered reason=max_attempts")

    assert await by_user.stop() == 0
    assert await dead_only.stop() == 0
    for tail in (by_user, dead_only):
        assert tail.proc.stdout is not None
        assert await tail.proc.stdout.read() == b""  # nothing else was let through


async def test_the_operator_role_has_what_tail_needs_to_watch_both_exchanges(
    settings: Settings, amqp: AbstractRobustConnection, tails: list[Tail]
) -> None:
    users = unique_role_users()
    async with broker_user(users.operator) as password:
        await grant(settings, users, users.operator)
        as_operator = url_for(settings, users.operator, password)
        tail = await started(settings, "--json", PKGQ_AMQP_URL=as_operator)
        tails.append(tail)
        user = uuid4()
        sent = await send(
            settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=1)
        )
        line: dict[str, Any] = json.loads(await tail.line())
        assert (line["message_id"], line["user_id"]) == (str(sent), str(user))
        assert await tail.stop() == 0
