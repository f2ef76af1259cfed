"""How a transient failure is retried in-process: the one loop around a call (`until_done`),
the quick tries of a blip, and the pauses of an outage (`OutagePauses`).

What is transient, and of which kind (an outage or a blip): infra/failure_kinds.py (its names
are importable from here too). When the database is back: infra/recovery.py. Every retry loop
of pkgq, with its bound: docs/explanation/retries.md.

`until_done(call, stopping)` is the consumer's loop around one batch (infra/rabbit/consumer.py):
- a try that fails on a transient failure (an outage or a blip) is tried again after a short
  jittered pause: QUICK_TRIES tries in a row at most, the pauses between them drawn from
  0..0.05, 0..0.1, 0..0.2 and 0..0.4 s (`quick_pause_s`, at most 0.75 s in all);
- a *blip* still failing on the last of them is raised: the caller takes it for the call's own
  failure. Worst case for a blip: QUICK_TRIES tries and 0.75 s of pauses, plus the tries' own
  time;
- an *outage* still failing on the last of them is waited out: a pause of OUTAGE_FIRST_PAUSE_S
  (1 s), doubling up to OUTAGE_LONGEST_PAUSE_S (2 s) and staying there, cut short as soon as
  the process's probe finds the database back (infra/recovery.py) or `stopping` is set; then
  the quick tries start over (a pool's stale connections are replaced one per try). An outage
  has no bound of its own: the loop ends when the call works, or with StoppingError once
  `stopping` is set (looked at after every failed try of an outage, and it ends a pause);
- anything else is raised at once.
The first failure of an outage is logged as a warning and the tries after it as debug lines
(the dependency report, infra/dependencies.py, warns at a slowing rate); an outage only an
operator ends (`needs_operator`), or one that lasts BLOCKED_ALERT_AFTER_S, is an error, said
again every LOUD_REPEAT_S at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from infra.dependencies import dependencies
from infra.failure_kinds import (
    BLIP_SQLSTATES,
    OPERATOR_SQLSTATES,
    OUTAGE_SQLSTATE_CLASSES,
    OUTAGE_SQLSTATES,
    PERMANENT_SQLSTATES,
    PROBED_SQLSTATES,
    dependency_of,
    is_demotion,
    is_outage,
    is_permanent,
    is_transient,
    needs_operator,
    probe_can_tell,
)
from infra.recovery import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, Probe, Recovery, recovery

__all__ = [
    "BLIP_SQLSTATES",
    "BLOCKED_ALERT_AFTER_S",
    "LOUD_REPEAT_S",
    "OPERATOR_SQLSTATES",
    "OUTAGE_FIRST_PAUSE_S",
    "OUTAGE_LONGEST_PAUSE_S",
    "OUTAGE_SQLSTATES",
    "OUTAGE_SQLSTATE_CLASSES",
    "PERMANENT_SQLSTATES",
    "PROBED_SQLSTATES",
    "PROBE_INTERVAL_S",
    "PROBE_IN_VAIN_LIMIT",
    "PROBE_TIMEOUT_S",
    "QUICK_FIRST_PAUSE_S",
    "QUICK_TRIES",
    "OutagePauses",
    "Probe",
    "Recovery",
    "StoppingError",
    "Wait",
    "dependency_of",
    "is_demotion",
    "is_outage",
    "is_permanent",
    "is_transient",
    "needs_operator",
    "probe_can_tell",
    "quick_pause_s",
    "recovery",
    "timer",
    "transient_retrying",
    "until_done",
]

log = structlog.get_logger(__name__)
T = TypeVar("T")

QUICK_TRIES = 5
"""Tries in a row of a call failing on a transient failure before the failure counts as
lasting: a blip is then raised, an outage waited out (OutagePauses)."""
QUICK_FIRST_PAUSE_S = 0.05
"""The ceiling of the first quick pause; it doubles after each try: 0.05, 0.1, 0.2, 0.4 s."""
BLOCKED_ALERT_AFTER_S = 300.0
LOUD_REPEAT_S = 10.0
"""An outage worth an error is said again every ten seconds at most."""
OUTAGE_FIRST_PAUSE_S = 1.0
OUTAGE_LONGEST_PAUSE_S = 2.0
"""until_done's pauses: the first, doubled after each failure up to the longest (short: once
the network is back, work resumes within it, whether or not the probe noticed first)."""
PROBE_IN_VAIN_LIMIT = 3
"""Times one retry loop is woken by a probe and fails again before it stops listening to the
probe for this outage (the probe finds the database back, but something it does not see still
fails): its pauses then end on their own timer only, so it never spins."""

Wait = Callable[[BaseException, float, asyncio.Event | None], Awaitable[bool]]
"""How a pause is waited: `(exc, seconds, stopping)` after the failure `exc`, ended early when
`stopping` is set; True when it ended because the service is back. Tests inject one that only
records the pauses asked for."""


def quick_pause_s(tries: int) -> float:
    """The jittered pause after the `tries`-th failed try in a row (1: the first)."""
    return random.uniform(0, QUICK_FIRST_PAUSE_S * 2 ** (tries - 1))


def transient_retrying(attempts: int = QUICK_TRIES, max_wait: float = 2.0) -> AsyncRetrying:
    """The quick tries alone, for a one-off operation that no other loop retries (an
    operator's bulk command, a group's cancel): bounded, exponential, jittered, short. Not for
    an outage: one still failing on the last try is raised, not waited out."""
    return AsyncRetrying(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(attempts),
        wait=wait_random_exponential(multiplier=QUICK_FIRST_PAUSE_S, max=max_wait),
        reraise=True,
    )


async def timer(exc: BaseException, seconds: float, stopping: asyncio.Event | None) -> bool:
    """A pause on the clock alone: `seconds`, or until `stopping` is set (never "back")."""
    with contextlib.suppress(TimeoutError):
        if stopping is not None:
            await asyncio.wait_for(stopping.wait(), timeout=seconds)
        else:
            await asyncio.sleep(seconds)
    return False


class OutagePauses:
    """The pauses of one retry loop while a failure lasts: `first` seconds, doubling up to
    `longest`, each cut short when `stopping` is set or the process's probe finds the
    database back (Recovery), unless the probe has already woken this loop
    PROBE_IN_VAIN_LIMIT times without the next try succeeding. `reset()` once a try works."""

    def __init__(
        self, first: float, longest: float, *, probed: bool = True, wait: Wait | None = None
    ) -> None:
        """`probed=False`: the failures are not the database's (RabbitMQ at start-up); the
        pauses end on their own timer only. `wait`: how each pause is waited, instead of the
        probe or the timer (tests)."""
        self._first = first
        self._longest = longest
        self._probed = probed
        self._wait = wait
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
        if self._wait is not None:
            self._woken = await self._wait(exc, seconds, stopping)
        elif not self._probed or self._in_vain >= PROBE_IN_VAIN_LIMIT:
            self._woken = await timer(exc, seconds, stopping)
        else:
            self._woken = await recovery().pause(exc, seconds, stopping)
        self.current = min(self.current * 2, self._longest)
        return self._woken


class StoppingError(Exception):
    """Shutdown began while waiting for the infrastructure to come back."""


async def until_done(
    call: Callable[[], Awaitable[T]],
    stopping: asyncio.Event,
    route: str = "",
    *,
    wait: Wait | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`call()` until it works: the one loop of the module docstring (quick tries for a blip or
    an outage, then pauses for an outage). Raises StoppingError if `stopping` is set while an
    outage lasts; a blip that outlasts the quick tries, or anything not transient, as it
    comes. While an outage lasts the process's dependency registry knows
    (infra/dependencies.py, `route`: what waits). `wait` and `clock`: the pauses and the time
    as tests drive them (by default the probe's or the timer's, and time.monotonic)."""
    pauses = OutagePauses(OUTAGE_FIRST_PAUSE_S, OUTAGE_LONGEST_PAUSE_S, wait=wait)
    quick = wait or timer
    blocked_since = clock()
    said_loudly = blocked_since - LOUD_REPEAT_S
    stalled: str | None = None
    tries = 0  # failed in a row since the start or the last outage pause
    while True:
        try:
            result = await call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            outage = is_outage(exc)
            if outage and stopping.is_set():
                raise StoppingError from exc
            tries += 1
            if tries < QUICK_TRIES:
                await quick(exc, quick_pause_s(tries), None)
                continue
            if not outage:
                raise  # a blip that lasts: the call's own failure
            tries = 0
            stalled = dependency_of(exc)
            dependencies().down(
                stalled,
                exc,
                f"holding the batch unacked, trying again within {pauses.current:g} s"
                + (" or once a probe finds it back" if probe_can_tell(exc) else ""),
                route,
            )
            now = clock()
            blocked_for = now - blocked_since
            # Loud after a while: an outage that lasts may be a deployment mistake (a schema
            # never migrated), and every later message on the route waits behind it. A missing
            # grant is one from the start: it never clears by itself.
            loud = blocked_for > BLOCKED_ALERT_AFTER_S or needs_operator(exc)
            # The first failure is a warning; the tries after it come every few seconds, so
            # the dependency report says how it goes on (at a slowing rate), and an error is
            # repeated every LOUD_REPEAT_S at most.
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
