"""The per-process "the database is back" signal: work resumes as soon as the service is back
(a standby promoted, a server restarted), not when a retry loop's pause ends.

While any retry loop of the process waits out an outage that a probe can see the end of (the
database unreachable, starting or shutting down, read-only: infra/failure_kinds.probe_can_tell),
one task per process (`Recovery`, per event loop) probes the database every PROBE_INTERVAL_S
seconds (the probe is infra/postgres/pool.watch_for_recovery's: connect, and find the server
writable), and the first probe that succeeds wakes every waiter at once. No probe runs while
nothing waits. The loops that wait this way: infra/transient.py (OutagePauses).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable

import structlog

from infra.failure_kinds import probe_can_tell

log = structlog.get_logger(__name__)

PROBE_INTERVAL_S = 0.5
"""How often the process's one probe tries the database while an outage is waited out."""
PROBE_TIMEOUT_S = 2.0
"""How long one probe may take (a host that does not answer at all)."""

Probe = Callable[[], Awaitable[object]]
"""Returns once the service would serve (the database reached and taking writes); raises
while it would not."""


class Recovery:
    """The per-process (per event loop) "the database is back" signal (see the module
    docstring). `recovery()` gives the running loop's; `watch` sets what it probes."""

    def __init__(self) -> None:
        self._probe: Probe | None = None
        self._back: asyncio.Event | None = None
        self._prober: asyncio.Task[None] | None = None
        self._waiting = 0
        self.probes = 0
        """Probes run so far (for tests and debugging)."""
        self.recoveries = 0
        """Times a probe succeeded and woke the waiters."""

    def watch(self, probe: Probe) -> None:
        """Probe this while an outage lasts (the process's database; the latest given wins)."""
        self._probe = probe

    @property
    def watching(self) -> bool:
        return self._probe is not None

    async def pause(
        self, exc: BaseException, seconds: float, stopping: asyncio.Event | None = None
    ) -> bool:
        """Wait `seconds`, or until `stopping` is set, or, if `exc` is an outage a probe can
        see the end of and a probe is watched, until a probe succeeds. True: a probe ended the
        wait (the service is back), False: the time was up, or `stopping` was set."""
        waits: list[asyncio.Future[object]] = []
        if stopping is not None:
            waits.append(asyncio.ensure_future(stopping.wait()))
        back: asyncio.Event | None = None
        if self._probe is not None and probe_can_tell(exc):
            if self._back is None:
                self._back = asyncio.Event()
            back = self._back
            waits.append(asyncio.ensure_future(back.wait()))
            self._waiting += 1
            if self._prober is None or self._prober.done():
                self._prober = asyncio.create_task(self._probe_until_back(back), name="probe")
        try:
            if waits:
                await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(seconds)
        finally:
            for waiting in waits:
                waiting.cancel()
            if back is not None:
                self._waiting -= 1
                if not self._waiting and self._prober is not None:
                    self._prober.cancel()  # nothing waits: no probe outside an outage
                    self._prober = None
        stopped = stopping is not None and stopping.is_set()
        return back is not None and back.is_set() and not stopped

    async def _probe_until_back(self, back: asyncio.Event) -> None:
        """A probe every PROBE_INTERVAL_S, each started without waiting for the one before to
        give up: behind a network that drops packets a probe hangs until its timeout, and the
        network's return must be seen by the next probe, not after that timeout."""
        loop = asyncio.get_running_loop()
        probing: set[asyncio.Task[bool]] = set()
        next_at = loop.time() + PROBE_INTERVAL_S
        try:
            while True:
                left = max(0.0, next_at - loop.time())
                if probing:
                    done, probing = await asyncio.wait(
                        probing, timeout=left, return_when=asyncio.FIRST_COMPLETED
                    )
                    if any(p.result() for p in done):
                        break
                else:
                    await asyncio.sleep(left)
                probe = self._probe
                if loop.time() < next_at or probe is None:
                    continue
                next_at += PROBE_INTERVAL_S
                self.probes += 1
                probing.add(asyncio.create_task(self._try(probe), name="probe-once"))
        finally:
            for p in probing:
                p.cancel()
        self.recoveries += 1
        self._back = None  # the next outage waits on a signal of its own
        back.set()

    @staticmethod
    async def _try(probe: Probe) -> bool:
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                await probe()
        except Exception as exc:  # noqa: BLE001  (still down: probe again)
            log.debug("recovery_probe_failed", error=repr(exc))
            return False
        return True


_RECOVERIES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Recovery] = (
    weakref.WeakKeyDictionary()
)


def recovery() -> Recovery:
    """The running event loop's Recovery (one per process, in practice)."""
    loop = asyncio.get_running_loop()
    found = _RECOVERIES.get(loop)
    if found is None:
        for closed in [other for other in _RECOVERIES if other.is_closed()]:
            del _RECOVERIES[closed]  # loops that ran before (tests): nothing waits in them
        found = _RECOVERIES[loop] = Recovery()
    return found
