"""Which failures are transient (infrastructure) and how they are retried in-process.

Two tiers:
- an *outage* (the database or broker is unreachable, shutting down, out of disk, failing over,
  or not migrated yet) says nothing about the message: it is retried in place for as long as it
  lasts, never dead-lettered. A permission error (SQLSTATE 42501, a grant revoked from the
  runtime role or never given) is one too: the message is fine and the deployment is not, so
  burying it would lose work an operator restores with one GRANT. Unlike a restarting server
  it does not clear on its own, so it is logged as an error at once (`needs_operator`);
- a *blip* (serialization failure, deadlock, lock or statement timeout, a cached plan
  invalidated by a migration) is retried a few times, briefly; if it persists it is treated as
  the message's own failure, so one message can never block its route forever.
Postgres errors are classified by SQLSTATE, so whole families are covered.

An outage is waited out in pauses that double (up to 30 s), but work must resume as soon as the
service is back (a standby promoted, a server restarted), not when the pause ends: while any
retry loop of the process waits out an outage that a probe can see the end of (the database
unreachable, starting or shutting down, read-only: `probe_can_tell`), one task per process
(`Recovery`, per event loop) probes the database every PROBE_INTERVAL_S seconds (the probe is
infra/postgres/pool.watch_for_recovery's: connect, and find the server writable), and the
first probe that succeeds wakes every waiter at once. No probe runs while nothing waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import asyncpg
import structlog
from aiormq.exceptions import AMQPConnectionError, AMQPError, ChannelInvalidStateError
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from infra.dependencies import POSTGRES, RABBITMQ, dependencies
from infra.tls import TlsVerifyError

OUTAGE_SQLSTATE_CLASSES = frozenset(
    {
        "08",  # connection exception
        "53",  # insufficient resources: disk full, out of memory, too many connections
        "57",  # operator intervention: shutdown, cannot connect now (57014 excepted below)
        "58",  # system error (I/O)
    }
)
OUTAGE_SQLSTATES = frozenset(
    {
        "25006",  # read-only transaction: a failover in progress
        "3F000",  # schema missing: consumers started before `pkgq migrate`
        "42P01",  # table missing: the same
        "42501",  # insufficient privilege: a grant missing from the runtime role
    }
)
PROBED_SQLSTATES = frozenset(
    {
        "25006",  # read-only: a demoted primary, a standby behind the address
        "57P01",  # admin shutdown: terminated by a restart or a failover manager
        "57P02",  # crash shutdown
        "57P03",  # cannot connect now: starting up, shutting down, in recovery
    }
)
"""With SQLSTATE class 08: Postgres outages that end when the server can be reached again and
takes writes, which a probe can see (see Recovery)."""
OPERATOR_SQLSTATES = frozenset({"42501"})
"""Outages that only an operator ends: alert at once. (A missing schema is not here: consumers
starting just before `pkgq migrate` is a normal race, so it turns loud only if it lasts.)"""
BLIP_SQLSTATES = frozenset({"55P03", "57014"})  # lock not available; statement timeout


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", None) or "")


def is_outage(exc: BaseException) -> bool:
    """The service itself is unavailable: wait for it, however long it takes."""
    if isinstance(exc, TimeoutError):
        return False  # a blip, though Python makes it an OSError
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        if state in BLIP_SQLSTATES:
            return False
        return state[:2] in OUTAGE_SQLSTATE_CLASSES or state in OUTAGE_SQLSTATES
    if isinstance(exc, asyncpg.InterfaceError):
        # Also raised for plain bugs (wrong argument count, concurrent use of a connection);
        # only a closed connection is an outage.
        return "closed" in str(exc)
    return isinstance(
        exc,
        (
            # Raised when a connection broken in mid-query (a server shutdown) is reset.
            asyncpg.exceptions._base.InternalClientError,  # not re-exported at the top level
            ConnectionError,
            OSError,
            AMQPConnectionError,
            ChannelInvalidStateError,
        ),
    )


def needs_operator(exc: BaseException) -> bool:
    """An outage that will not clear by itself: log it as an error from the first time. A
    missing grant, or a server certificate this process does not accept (a wrong CA, a host
    name the certificate is not issued for)."""
    if isinstance(exc, TlsVerifyError | ssl.SSLCertVerificationError):
        return True
    cause = exc.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError):  # aiormq wraps it
        return True
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc) in OPERATOR_SQLSTATES


def probe_can_tell(exc: BaseException) -> bool:
    """An outage whose end a probe of the database can see: it cannot be reached (refused,
    reset, closed, no host that takes writes), it is starting or shutting down, or it is
    read-only (a failover). Not a missing schema or grant, a full disk or a certificate not
    accepted (the database answers a probe while the call still fails), nor RabbitMQ's."""
    if not is_outage(exc) or needs_operator(exc):
        return False
    if isinstance(exc, AMQPError | ChannelInvalidStateError):
        return False
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        return state[:2] == "08" or state in PROBED_SQLSTATES
    return True  # refused, reset, a closed connection, no host of the DSN that would serve


def is_demotion(exc: BaseException) -> bool:
    """The connection is on a server that no longer takes writes: a primary demoted to a
    standby (or an address that now leads to one), found by a statement refused as read-only
    (SQLSTATE 25006) or by Postgres saying it is in recovery. Every connection to that server
    is useless for pkgq: the pool must drop them (infra/postgres/pool.forget_if_demoted), so
    that the next ones go to whichever host takes writes now."""
    for cause in _chain(exc):
        if isinstance(cause, asyncpg.PostgresError) and (
            _sqlstate(cause) == "25006" or "recovery" in str(cause).lower()
        ):
            return True
    return False


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(exc: BaseException) -> bool:
    """Worth retrying at once: an outage, or a blip that usually clears within a second."""
    if is_outage(exc) or isinstance(exc, asyncpg.InvalidCachedStatementError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        return state[:2] == "40" or state in BLIP_SQLSTATES  # serialization, deadlock
    return isinstance(
        exc, (asyncpg.InvalidCachedStatementError, TimeoutError, asyncio.TimeoutError)
    )


PERMANENT_SQLSTATES = frozenset({"23502", "23514"})  # not-null and check violations
"""With SQLSTATE class 22 (data exception: out of range, invalid text, untranslatable
character, ...): what Postgres refuses for the data itself, every time it is asked."""


def is_permanent(exc: BaseException) -> bool:
    """A data error that can never succeed: the same statement with the same data fails the
    same way. asyncpg refuses some such values before sending them (a number out of a column's
    range, a lone surrogate in text) with SQLSTATE 22000: permanent too."""
    if isinstance(exc, asyncpg.PostgresError):
        state = _sqlstate(exc)
        return state[:2] == "22" or state in PERMANENT_SQLSTATES
    return isinstance(exc, UnicodeEncodeError)


def transient_retrying(attempts: int = 5, max_wait: float = 2.0) -> AsyncRetrying:
    """Bounded, exponential, jittered, short: for a blip, not for an outage."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=0.05, max=max_wait),
        reraise=True,
    )


log = structlog.get_logger(__name__)

BLOCKED_ALERT_AFTER_S = 300.0
LOUD_REPEAT_S = 10.0
"""An outage worth an error is said again every ten seconds at most."""
OUTAGE_FIRST_PAUSE_S = 1.0
OUTAGE_LONGEST_PAUSE_S = 2.0
"""until_done's pauses: the first, doubled after each failure up to the longest (short: once
the network is back, work resumes within it, whether or not the probe noticed first)."""
PROBE_INTERVAL_S = 0.5
"""How often the process's one probe tries the database while an outage is waited out."""
PROBE_TIMEOUT_S = 2.0
"""How long one probe may take (a host that does not answer at all)."""
PROBE_IN_VAIN_LIMIT = 3
"""Times one retry loop is woken by a probe and fails again before it stops listening to the
probe for this outage (the probe finds the database back, but something it does not see still
fails): its pauses then end on their own timer only, so it never spins."""
T = TypeVar("T")

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


class OutagePauses:
    """The pauses of one retry loop while a failure lasts: `first` seconds, doubling up to
    `longest`, each cut short when `stopping` is set or the process's probe finds the
    database back (Recovery), unless the probe has already woken this loop
    PROBE_IN_VAIN_LIMIT times without the next try succeeding. `reset()` once a try works."""

    def __init__(self, first: float, longest: float, *, probed: bool = True) -> None:
        """`probed=False`: the failures are not the database's (RabbitMQ at start-up); the
        pauses end on their own timer only."""
        self._first = first
        self._longest = longest
        self._probed = probed
        self.current = first
        """The next pause, in seconds (what logs call retry_in_s)."""
        self._woken = False
        self._in_vain = 0

    def reset(self) -> None:
        self.current = self._first
        self._woken = False
        self._in_vain = 0

    async def wait(
        self,
        exc: BaseException,
        stopping: asyncio.Event | None = None,
        at_most: float | None = None,
    ) -> bool:
        """Pause after the failure `exc` (at most `at_most` seconds, if given); True: the probe
        ended it (the service is back: try again now)."""
        if self._woken:
            self._in_vain += 1  # woken as the service was back, and it still failed
        seconds = self.current if at_most is None else max(0.0, min(self.current, at_most))
        if not self._probed or self._in_vain >= PROBE_IN_VAIN_LIMIT:
            with contextlib.suppress(TimeoutError):
                if stopping is not None:
                    await asyncio.wait_for(stopping.wait(), timeout=seconds)
                else:
                    await asyncio.sleep(seconds)
            self._woken = False
        else:
            self._woken = await recovery().pause(exc, seconds, stopping)
        self.current = min(self.current * 2, self._longest)
        return self._woken


class StoppingError(Exception):
    """Shutdown began while waiting for the infrastructure to come back."""


def dependency_of(exc: BaseException) -> str:
    """Which dependency an outage is of: RabbitMQ's errors, else PostgreSQL."""
    if isinstance(exc, AMQPError | ChannelInvalidStateError):
        return RABBITMQ
    return POSTGRES


async def until_done(
    call: Callable[[], Awaitable[T]], stopping: asyncio.Event, route: str = ""
) -> T:
    """Retry blips briefly with tenacity; wait out outages with pauses until it works (each
    pause ends early once the process's probe finds the database back: OutagePauses). Raises
    StoppingError if `stopping` is set while it waits; anything else it raises as it comes.
    While an outage lasts the process's dependency registry knows (infra/dependencies.py,
    `route`: what waits)."""
    pauses = OutagePauses(OUTAGE_FIRST_PAUSE_S, OUTAGE_LONGEST_PAUSE_S)
    blocked_since = time.monotonic()
    said_loudly = -LOUD_REPEAT_S
    stalled: str | None = None
    while True:
        try:
            result = await _with_blip_retries(call)
        except Exception as exc:
            if not is_outage(exc):
                raise
            if stopping.is_set():
                raise StoppingError from exc
            stalled = dependency_of(exc)
            dependencies().down(
                stalled,
                exc,
                f"holding the batch unacked, trying again within {pauses.current:g} s"
                + (" or once a probe finds it back" if probe_can_tell(exc) else ""),
                route,
            )
            blocked_for = time.monotonic() - blocked_since
            # Loud after a while: an outage that lasts may be a deployment mistake (a schema
            # never migrated), and every later message on the route waits behind it. A missing
            # grant is one from the start: it never clears by itself.
            loud = blocked_for > BLOCKED_ALERT_AFTER_S or needs_operator(exc)
            # The first failure is a warning; the tries after it come every few seconds, so
            # the dependency report says how it goes on (at a slowing rate), and an error is
            # repeated every LOUD_REPEAT_S at most.
            now = time.monotonic()
            if loud and now - said_loudly >= LOUD_REPEAT_S:
                level, said_loudly = log.error, now
            else:
                level = log.warning if pauses.current <= OUTAGE_FIRST_PAUSE_S else log.debug
            level(
                "infrastructure_unavailable",
                error=repr(exc),
                retry_in_s=pauses.current,
                blocked_for_s=round(blocked_for),
            )
            await pauses.wait(exc, stopping)
        else:
            if stalled is not None:
                dependencies().up(stalled, route)
            return result


async def _with_blip_retries(call: Callable[[], Awaitable[T]]) -> T:
    async for attempt in transient_retrying():
        with attempt:
            return await call()
    raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover
