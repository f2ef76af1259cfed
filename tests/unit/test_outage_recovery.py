"""Waiting out an outage ends when the database is back, not when the pause does: one probe per
process (infra/recovery.Recovery) wakes every waiter; no probe runs while nothing waits; an
outage a probe cannot see the end of is waited out on the timer alone; and a retry loop the
probe wakes in vain stops listening to it. A demoted primary is told apart by its errors.

No real service here: a probe that fails until a switch is set (tests/integration/
test_postgres_failover.py probes the real server)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from aiormq.exceptions import AMQPConnectionError

from infra import recovery as recovery_module
from infra import transient
from infra.postgres.pool import ServerNotWritableError
from infra.transient import (
    OutagePauses,
    is_demotion,
    probe_can_tell,
    recovery,
    until_done,
)

FOREVER = 3600.0
"""A pause no test waits out: a waiter that resumes was woken by the probe."""

REFUSED = ConnectionRefusedError(111, "Connect call failed")


class Switch:
    """A probe that fails until `on` is set, counting its calls."""

    def __init__(self) -> None:
        self.on = False
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if not self.on:
            raise ConnectionRefusedError(111, "still down")


@pytest.fixture(autouse=True)
def fast_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recovery_module, "PROBE_INTERVAL_S", 0.01)


async def _until(condition: object, what: str) -> None:
    for _ in range(2000):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


@pytest.mark.parametrize(
    "exc",
    [
        REFUSED,
        asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.exceptions.TargetServerAttributeNotMatched("None of the hosts match"),
        ServerNotWritableError("read-only"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_database_unreachable_starting_or_read_only_is_an_outage_a_probe_sees_end(
    exc: BaseException,
) -> None:
    assert probe_can_tell(exc)


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.UndefinedTableError('relation "telecom.inbox" does not exist'),
        asyncpg.InsufficientPrivilegeError("permission denied for table package_queue"),
        asyncpg.DiskFullError("could not extend file"),
        AMQPConnectionError("broker went away"),
        asyncpg.SerializationError("could not serialize access"),
        ValueError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_what_a_probe_would_find_back_while_the_call_still_fails_is_not_probed(
    exc: BaseException,
) -> None:
    assert not probe_can_tell(exc)


def test_a_read_only_refusal_or_recovery_is_a_demotion_and_a_refused_connection_is_not() -> None:
    assert is_demotion(asyncpg.ReadOnlySQLTransactionError("cannot execute UPDATE"))
    assert is_demotion(asyncpg.FeatureNotSupportedError("cannot execute LISTEN during recovery"))
    wrapped = RuntimeError("the batch failed")
    wrapped.__cause__ = asyncpg.ReadOnlySQLTransactionError("cannot execute INSERT")
    assert is_demotion(wrapped)
    assert not is_demotion(REFUSED)
    assert not is_demotion(asyncpg.UniqueViolationError("duplicate key"))


async def test_every_waiter_is_woken_by_the_one_probe_as_soon_as_it_succeeds() -> None:
    switch = Switch()
    recovery().watch(switch)
    waiters = [asyncio.create_task(recovery().pause(REFUSED, FOREVER)) for _ in range(5)]
    await _until(lambda: switch.calls >= 3, "three probes")
    switch.on = True
    woken = await asyncio.wait_for(asyncio.gather(*waiters), timeout=30)
    assert woken == [True] * 5  # by the probe: their pauses last an hour
    assert recovery().recoveries == 1
    calls = switch.calls
    await asyncio.sleep(0.1)  # ten probe intervals with nothing waiting
    assert switch.calls == calls, "a probe ran with no outage"


async def test_an_outage_a_probe_cannot_see_end_waits_on_its_timer_and_probes_nothing() -> None:
    switch = Switch()
    switch.on = True
    recovery().watch(switch)
    grant = asyncpg.InsufficientPrivilegeError("permission denied for table package_queue")
    assert not await recovery().pause(grant, 0.05)
    assert switch.calls == 0


async def test_shutdown_ends_a_pause_and_is_not_taken_for_the_service_coming_back() -> None:
    recovery().watch(Switch())
    stopping = asyncio.Event()
    waiter = asyncio.create_task(recovery().pause(REFUSED, FOREVER, stopping))
    await asyncio.sleep(0.03)
    stopping.set()
    assert not await asyncio.wait_for(waiter, timeout=30)


async def test_until_done_resumes_on_the_probe_not_on_its_back_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transient, "OUTAGE_FIRST_PAUSE_S", FOREVER)
    monkeypatch.setattr(transient, "OUTAGE_LONGEST_PAUSE_S", FOREVER)
    switch = Switch()
    recovery().watch(switch)
    calls = 0

    async def write() -> str:
        nonlocal calls
        calls += 1
        if not switch.on:
            raise REFUSED
        return "written"

    done = asyncio.create_task(until_done(write, asyncio.Event()))
    await _until(lambda: switch.calls >= 1, "a probe")
    tried = calls  # the first try and its quick tries
    await _until(lambda: switch.calls >= 4, "more probes")
    assert calls == tried  # waiting: the probe tries the database, not the work
    switch.on = True
    assert await asyncio.wait_for(done, timeout=30) == "written"
    assert calls == tried + 1
    assert recovery().recoveries == 1


async def test_a_loop_the_probe_wakes_in_vain_stops_listening_to_it() -> None:
    switch = Switch()
    switch.on = True  # the database answers, yet the call keeps failing
    recovery().watch(switch)
    pauses = OutagePauses(0.05, 0.05)
    woken = [await pauses.wait(REFUSED) for _ in range(transient.PROBE_IN_VAIN_LIMIT + 2)]
    assert woken == [True] * transient.PROBE_IN_VAIN_LIMIT + [False, False]
    pauses.reset()
    assert await pauses.wait(REFUSED)  # a new outage listens again


async def test_without_a_watched_probe_an_outage_is_waited_out_as_before() -> None:
    assert not recovery().watching
    assert not await OutagePauses(0.01, 0.01).wait(REFUSED)
