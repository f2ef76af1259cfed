"""Under systemd (Type=notify): READY=1 once consuming, WATCHDOG=1 from the event loop, and
STOPPING=1 when the graceful drain begins, sent by real `pkgq run` and `pkgq relay` processes."""

from __future__ import annotations

import asyncio
import signal
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import PkgqProcess

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
