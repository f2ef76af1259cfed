"""The retry loops' worst cases, as docs/explanation/retries.md states them: driven with a
failure that never clears, on injected pauses and an injected clock (nothing waits for real).

until_done (infra/transient.py): a blip gets QUICK_TRIES tries and at most 0.75 s of pauses,
then is raised; an outage gets QUICK_TRIES quick tries between pauses of 1 s then 2 s (never
more) until `stopping` is set; an outage only an operator ends is an error at once, said again
every LOUD_REPEAT_S at most. The last resort's copy (infra/rabbit/last_resort.py) retries on
the same pauses until stopped."""

from __future__ import annotations

import asyncio
from itertools import pairwise
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from infra.rabbit import last_resort
from infra.transient import (
    LOUD_REPEAT_S,
    OUTAGE_FIRST_PAUSE_S,
    OUTAGE_LONGEST_PAUSE_S,
    QUICK_FIRST_PAUSE_S,
    QUICK_TRIES,
    StoppingError,
    until_done,
)

REFUSED = ConnectionRefusedError(111, "Connect call failed")


class Driven:
    """Pauses that only record what is asked and move a clock on by it. A pause given
    `stopping` is an outage's (a quick pause is not): after `outage_pauses` of them, `stopping`
    is set, as a shutdown would."""

    def __init__(self, stopping: asyncio.Event, outage_pauses: int = 1_000) -> None:
        self.stopping = stopping
        self.limit = outage_pauses
        self.now = 0.0
        self.quick: list[list[float]] = [[]]
        """The quick pauses, one list per run of tries (between two outage pauses)."""
        self.outage: list[float] = []
        self.outage_at: list[float] = []

    def clock(self) -> float:
        return self.now

    async def wait(self, exc: BaseException, seconds: float, stopping: Any) -> bool:
        if stopping is None:
            self.quick[-1].append(seconds)
        else:
            self.outage_at.append(self.now)
            self.outage.append(seconds)
            self.quick.append([])
            if len(self.outage) >= self.limit:
                self.stopping.set()
        self.now += seconds
        return False


def failing(exc: BaseException, tries: list[int]) -> Any:
    async def call() -> None:
        tries.append(1)
        raise exc

    return call


def assert_quick(pauses: list[float]) -> None:
    """A run's quick pauses: one fewer than its tries, each under its doubling ceiling."""
    assert len(pauses) == QUICK_TRIES - 1
    for k, seconds in enumerate(pauses):
        assert 0 <= seconds <= QUICK_FIRST_PAUSE_S * 2**k
    assert sum(pauses) <= 0.75


async def test_a_blip_that_never_clears_gets_five_tries_and_under_a_second_of_pauses() -> None:
    stopping = asyncio.Event()
    driven = Driven(stopping)
    tries: list[int] = []
    with pytest.raises(asyncpg.DeadlockDetectedError):
        await until_done(
            failing(asyncpg.DeadlockDetectedError("deadlock detected"), tries),
            stopping,
            wait=driven.wait,
            clock=driven.clock,
        )
    assert len(tries) == QUICK_TRIES == 5
    assert driven.outage == []
    assert_quick(driven.quick[0])


async def test_an_outage_that_never_clears_is_tried_on_pauses_capped_at_two_s_until_stopped() -> (
    None
):
    stopping = asyncio.Event()
    driven = Driven(stopping, outage_pauses=6)
    tries: list[int] = []
    with pytest.raises(StoppingError):
        await until_done(failing(REFUSED, tries), stopping, wait=driven.wait, clock=driven.clock)
    assert driven.outage == [OUTAGE_FIRST_PAUSE_S, *[OUTAGE_LONGEST_PAUSE_S] * 5]
    assert driven.outage == [1.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    # QUICK_TRIES tries before each pause, and one after the last: stopping ends it there.
    assert len(tries) == QUICK_TRIES * 6 + 1
    for run in driven.quick[:-1]:
        assert_quick(run)
    assert driven.quick[-1] == []


async def test_an_outage_only_an_operator_ends_is_an_error_again_every_ten_s_at_most() -> None:
    stopping = asyncio.Event()
    driven = Driven(stopping, outage_pauses=20)
    grant = asyncpg.InsufficientPrivilegeError("permission denied for table package_queue")
    with capture_logs() as logs, pytest.raises(StoppingError):
        await until_done(failing(grant, []), stopping, wait=driven.wait, clock=driven.clock)
    # Debug lines may be filtered out by the logging set up before: the errors are what counts.
    loud = [
        e["blocked_for_s"]
        for e in logs
        if e["event"] == "infrastructure_unavailable" and e["log_level"] == "error"
    ]
    assert loud[0] <= 1  # at once: after the first quick tries (0.75 s of pauses at most)
    assert len(loud) >= 3  # about 40 s of outage
    # blocked_for_s is rounded to the second: LOUD_REPEAT_S apart at least, and said again
    # within one more pause and its quick tries
    assert all(LOUD_REPEAT_S - 1 <= b - a <= LOUD_REPEAT_S + 3 for a, b in pairwise(loud))


class Refusing:
    """A publisher whose every publish fails (the dead-letter exchange refuses the copy)."""

    user_id = "pkgq"

    def __init__(self) -> None:
        self.tries = 0

    async def publish(self, message: Any, routing_key: str) -> None:
        self.tries += 1
        raise RuntimeError("nacked")


class Open:
    is_closed = False


class Message:
    """Just what the last resort reads of a delivery."""

    body = b"{}"
    message_id = "m-1"
    type = "X"
    content_type = "application/json"
    timestamp = None
    user_id = "pkgq"
    headers: dict[str, Any] = {}  # noqa: RUF012
    channel = Open()

    def __init__(self) -> None:
        self.acked = False

    async def ack(self) -> None:
        self.acked = True


async def test_the_last_resort_retries_its_copy_on_the_outage_pauses_until_stopped() -> None:
    stopping = asyncio.Event()
    driven = Driven(stopping, outage_pauses=8)
    publisher, message = Refusing(), Message()
    with capture_logs() as logs:
        copied = await last_resort.copy_to_dead_letters(
            message,  # type: ignore[arg-type]
            publisher,  # type: ignore[arg-type]
            queue_name="q",
            consumer="c",
            reason="handler_error",
            exc=RuntimeError("a bug"),
            stopping=stopping,
            wait=driven.wait,
            clock=driven.clock,
        )
    assert not copied
    assert not message.acked
    assert driven.outage == [1.0, *[2.0] * 7]
    assert publisher.tries == 9  # one before each pause, and the one that finds it stopping
    failed = [e for e in logs if e["event"] == "dead_letter_publish_failed"]
    assert [e["log_level"] for e in failed if e["log_level"] == "error"] == ["error"] * 2
    # at 0 s and at 11 s, of 15 s of refusals; the lines between are debug lines
