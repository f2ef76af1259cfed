"""The systemd notify protocol (sd_notify), without a library: a datagram to $NOTIFY_SOCKET.

`READY=1` once the process does its work, `STOPPING=1` when a graceful drain begins, and
`WATCHDOG=1` from a task in the event loop every half of $WATCHDOG_USEC, so a loop that stops
turning stops the pings and systemd restarts the service. Outside systemd (no NOTIFY_SOCKET)
every call does nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import structlog

log = structlog.get_logger(__name__)


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        # An abstract socket is written with a leading '@' and addressed with a NUL byte.
        self._address = "\0" + path[1:] if path.startswith("@") else path
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval = int(usec) / 2_000_000 if usec.isdigit() and int(usec) else None
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def notify(self, *states: str) -> None:
        if not self._address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.connect(self._address)
                sock.sendall("\n".join(states).encode())
            except OSError as exc:
                log.warning("sd_notify_failed", error=repr(exc))

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}")

    def stopping(self) -> None:
        self.notify("STOPPING=1", "STATUS=draining")

    def start_watchdog(self) -> None:
        if self._address and self.watchdog_interval and self._watchdog is None:
            self._watchdog = asyncio.create_task(self._ping(), name="sd-watchdog")

    async def stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None

    async def _ping(self) -> None:
        assert self.watchdog_interval is not None
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_interval)
