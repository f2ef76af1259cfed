"""Under systemd (Type=notify): READY=1 once consuming, WATCHDOG=1 from the event loop, and
STOPPING=1 when the graceful drain begins, sent by real `pkgq run` and `pkgq relay` processes;
the message in hand at SIGTERM is applied and acked before the process exits."""

from __future__ import annotations

import asyncio
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.settings import Settings
from tests.support.deliveries import send
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess

pytestmark = pytest.mark.e2e


@pytest.fixture
def notify_socket() -> Iterator[socket.socket]:
    with tempfile.TemporaryDirectory() as folder:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(Path(folder) / "notify"))
        sock.setblocking(False)
        yield sock
        sock.close()


async def received(sock: socket.socket, want: str, seen: list[str], within: float = 30) -> None:
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(within):
        while not any(want in message for message in seen):
            seen.append((await loop.sock_recv(sock, 4096)).decode())


@pytest.mark.parametrize("command", ["run", "relay"])
async def test_the_process_notifies_ready_watchdog_and_stopping(
    command: str, notify_socket: socket.socket, spawn: Callable[..., PkgqProcess]
) -> None:
    process = spawn(command, NOTIFY_SOCKET=notify_socket.getsockname(), WATCHDOG_USEC="1000000")
    seen: list[str] = []
    await received(notify_socket, "READY=1", seen)
    await received(notify_socket, "WATCHDOG=1", seen)
    pings = sum("WATCHDOG=1" in m for m in seen)
    await asyncio.sleep(1.2)  # at least two more pings, at half of WATCHDOG_USEC
    while True:
        try:
            seen.append(notify_socket.recv(4096).decode())
        except BlockingIOError:
            break
    assert sum("WATCHDOG=1" in m for m in seen) >= pings + 2
    process.proc.send_signal(signal.SIGTERM)
    await received(notify_socket, "STOPPING=1", seen)
    assert process.terminate() == 0, process.logs()


async def test_sigterm_sends_stopping_and_the_message_in_hand_is_applied_and_acked_before_exit(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    notify_socket: socket.socket,
    spawn: Callable[..., PkgqProcess],
) -> None:
    process = spawn("run", "usage_record", NOTIFY_SOCKET=notify_socket.getsockname())
    seen: list[str] = []
    await received(notify_socket, "READY=1", seen)
    user = uuid4()
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=1, download=0))

    async def user_known() -> bool:
        async with pool.acquire() as conn:
            return bool(
                await conn.fetchval("SELECT 1 FROM telecom.queue_users WHERE user_id = $1", user)
            )

    await eventually(user_known)
    blocker = await pool.acquire()
    try:
        # Hold the user's row: the next usage record is taken and waits in its transaction.
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute(
            "SELECT 1 FROM telecom.queue_users WHERE user_id = $1 FOR UPDATE", user
        )
        await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=10, download=0))

        async def in_flight() -> bool:
            async with pool.acquire() as conn:
                waiting = await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            return int(waiting) >= 1

        await eventually(in_flight)
        process.proc.send_signal(signal.SIGTERM)
        await received(notify_socket, "STOPPING=1", seen)
        await transaction.rollback()  # let the message in hand finish
    finally:
        await pool.release(blocker)
    assert await asyncio.to_thread(process.proc.wait, 30) == 0, process.logs()
    async with pool.acquire() as conn:
        unbilled = await conn.fetchval(
            "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
        )
    assert unbilled == 11  # the message in hand was applied before the exit
    channel = await amqp.channel()
    try:
        queue = await channel.declare_queue(settings.queue_name(USAGE_RECORD.name), passive=True)
        assert queue.declaration_result.message_count == 0  # and acked: nothing to redeliver
    finally:
        await channel.close()
