"""Which of the process's dependencies (PostgreSQL, RabbitMQ) it cannot reach now, said while
it lasts (docs/how-to/network-faults.md).

Whatever finds a dependency failing calls `down` (what fails, the route it blocks if any, and
what it does about it); whatever succeeds on it calls `up`. From FIRST_REPORT_S into a stall,
one WARNING `dependency_unreachable` per dependency and route, repeated at a slowing rate (the
gap doubles up to LONGEST_GAP_S); once it works again one INFO `dependency_recovered` with the
outage's length. `pkgq_dependency_up{service,dependency}` is 0 while any of its routes is down,
and the readiness probe fails meanwhile (`all_up`). One registry per event loop (per process),
with no task while everything is up.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from prometheus_client import Gauge

log = structlog.get_logger(__name__)

POSTGRES = "postgres"
RABBITMQ = "rabbitmq"

FIRST_REPORT_S = 3.0
"""Seconds into a stall before the first warning: shorter failures are blips, handled quietly."""
LONGEST_GAP_S = 60.0
"""The longest gap between two warnings of one stall (the gap doubles from FIRST_REPORT_S)."""
TICK_S = 0.5

DEPENDENCY_UP = Gauge(
    "pkgq_dependency_up",
    "1 while this process reaches the dependency (postgres, rabbitmq), 0 while a connection "
    "to it is found dead or cannot be made (from the first failure to the first success).",
    ["service", "dependency"],
)


@dataclass(slots=True)
class Stall:
    since: float
    """time.monotonic() of the first failure."""
    since_wall: datetime
    error: str
    doing: str
    next_report: float
    gap: float = FIRST_REPORT_S
    reports: int = 0


class Dependencies:
    def __init__(self) -> None:
        self.service = "pkgq"
        """The `service` label (set by the process at start-up: run, relay, dlq-ingest, web)."""
        self._stalls: dict[tuple[str, str], Stall] = {}
        self._reporter: asyncio.Task[None] | None = None

    def down(
        self, dependency: str, error: BaseException | str, doing: str, route: str = ""
    ) -> None:
        """`dependency` failed (for `route`, if the failure blocks one route only); `doing`: what
        the process does about it ("reconnecting every 0.5 s", ...). The first call of a stall
        starts its clock; later ones update its error and what is done."""
        key = (dependency, route)
        text = error if isinstance(error, str) else repr(error)
        stall = self._stalls.get(key)
        if stall is None:
            now = time.monotonic()
            self._stalls[key] = Stall(
                now, datetime.now(UTC), text, doing, next_report=now + FIRST_REPORT_S
            )
            DEPENDENCY_UP.labels(service=self.service, dependency=dependency).set(0)
            log.debug("dependency_failed", dependency=dependency, route=route, error=text)
            self._ensure_reporter()
        else:
            stall.error, stall.doing = text, doing

    def up(self, dependency: str, route: str | None = None) -> None:
        """`dependency` works again (for `route`, and for whatever blocked no route in
        particular; None: for every route)."""
        ended = [
            key
            for key in self._stalls
            if key[0] == dependency and (route is None or key[1] in (route, ""))
        ]
        now = time.monotonic()
        for key in ended:
            stall = self._stalls.pop(key)
            if stall.reports:
                log.info(
                    "dependency_recovered",
                    dependency=dependency,
                    route=key[1] or None,
                    since=stall.since_wall.isoformat(),
                    outage_s=round(now - stall.since, 1),
                )
        if not any(key[0] == dependency for key in self._stalls):
            DEPENDENCY_UP.labels(service=self.service, dependency=dependency).set(1)

    def is_up(self, dependency: str) -> bool:
        return not any(key[0] == dependency for key in self._stalls)

    def all_up(self) -> bool:
        """Nothing unreachable (the readiness probe's part)."""
        return not self._stalls

    def report(self, now: float | None = None) -> int:
        """Log the warnings due at `now` (monotonic); returns how many were logged."""
        now = time.monotonic() if now is None else now
        logged = 0
        for (dependency, route), stall in self._stalls.items():
            if now < stall.next_report:
                continue
            stall.reports += 1
            logged += 1
            log.warning(
                "dependency_unreachable",
                dependency=dependency,
                route=route or None,
                since=stall.since_wall.isoformat(),
                for_s=round(now - stall.since, 1),
                error=stall.error,
                doing=stall.doing,
                next_report_in_s=min(stall.gap * 2, LONGEST_GAP_S),
            )
            stall.gap = min(stall.gap * 2, LONGEST_GAP_S)
            stall.next_report = now + stall.gap
        return logged

    def _ensure_reporter(self) -> None:
        if self._reporter is None or self._reporter.done():
            self._reporter = asyncio.get_running_loop().create_task(
                self._report_while_down(), name="dependency-reporter"
            )

    async def _report_while_down(self) -> None:
        while self._stalls:
            await asyncio.sleep(TICK_S)
            self.report()


_REGISTRIES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dependencies] = (
    weakref.WeakKeyDictionary()
)


def dependencies() -> Dependencies:
    """The running event loop's registry (one per process, in practice)."""
    loop = asyncio.get_running_loop()
    found = _REGISTRIES.get(loop)
    if found is None:
        found = _REGISTRIES[loop] = Dependencies()
    return found
