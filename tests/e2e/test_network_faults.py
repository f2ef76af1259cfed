"""Silent network faults between pkgq's processes and its services: the lifecycle resumes
within the stated bound of the fault's end, nothing is lost or applied twice, and the stall
was reported while it lasted.

`pkgq run` and `pkgq relay` run in a network namespace of the test's own and reach PostgreSQL
and RabbitMQ through a forwarder on the host (tests/support/netfault.py); the test itself
talks to the services directly. Scale with PKGQ_NETFAULT_USERS (users in the workload) and
PKGQ_NETFAULT_SECONDS (how long each fault lasts: longer than the dead-peer timeout, so that
connections die under it). Each recovery time is printed, and appended as a JSON line to
PKGQ_NETFAULT_REPORT if that names a file.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from infra.settings import Settings
from tests.e2e.workload import Workload
from tests.support import pg_roles
from tests.support.netfault import AMQP_PORT, POSTGRES_PORT, NetLab
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, assert_doctor_clean

pytestmark = [pytest.mark.e2e]

USERS = int(os.environ.get("PKGQ_NETFAULT_USERS", "4"))
FAULT_S = float(os.environ.get("PKGQ_NETFAULT_SECONDS", "10"))
RESUME_BOUND_S = 3.0
"""docs/how-to/network-faults.md: work sent during a fault is applied within this many
seconds of the fault's end (at the default PKGQ_DEAD_PEER_TIMEOUT)."""
SLACK_S = 3.0
"""What the test allows on top of the bound for a busy CI machine (two cores, shared)."""


@pytest.fixture
def lab() -> Iterator[NetLab]:
    with NetLab() as made:
        yield made


async def _run_fault(
    name: str,
    lab: NetLab,
    start: Callable[[], object],
    end: Callable[[], object],
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    seed: int,
    warned: list[str],
) -> None:
    workload = await Workload.create(pool, seed=seed, users=USERS)
    dsn = pg_roles.as_role(settings.postgres_dsn, pg_roles.RUNTIME)
    env = lab.env(dsn, settings.amqp_url)
    relay = PkgqProcess(settings, "relay", python=lab.python, **env)
    consumers = PkgqProcess(settings, "run", python=lab.python, **env)
    try:
        await workload.send_purchases(settings, amqp)
        await workload.wait_all_queued(pool)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.to_thread(start)
        await workload.send_usage(settings, amqp)  # the test's own path is not faulted
        await asyncio.sleep(max(0.0, began + FAULT_S - loop.time()))
        await asyncio.to_thread(end)
        ended = loop.time()
        expected = workload.expected_state()
        while await workload.actual(pool) != expected:
            if loop.time() - ended > RESUME_BOUND_S + SLACK_S + 30:
                break
            await asyncio.sleep(0.05)
        took = loop.time() - ended
        _report(name, took)

        def tails() -> str:
            return "\n".join(
                f"--- pkgq {p.args[0]}\n" + p.logs()[-6000:] for p in (consumers, relay)
            )

        try:
            await workload.wait_end_state(pool, within=1)  # the diff, if it never got there
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{tails()}") from None
        assert took <= RESUME_BOUND_S + SLACK_S, f"{name}: resumed {took:.1f}s after\n{tails()}"
        assert relay.proc.poll() is None, relay.logs()
        assert consumers.proc.poll() is None, consumers.logs()
        for dependency in warned:
            for event in ("dependency_unreachable", "dependency_recovered"):

                async def said(event: str = event, dependency: str = dependency) -> bool:
                    return _logged(consumers.logs() + relay.logs(), event, dependency)

                said.__qualname__ = f"{event}_{dependency}_logged"
                await eventually(said, within=15)
        assert consumers.terminate() == 0, consumers.logs()
        assert relay.terminate() == 0, relay.logs()
    finally:
        for process in (consumers, relay):
            if process.proc.poll() is None:
                process.kill()
    await assert_doctor_clean(settings)


def _logged(logs: str, event: str, dependency: str) -> bool:
    for line in logs.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == event and record.get("dependency") == dependency:
            return True
    return False


def _report(name: str, took: float) -> None:
    print(f"netfault {name}: resumed {took:.2f}s after the fault ended")
    path = os.environ.get("PKGQ_NETFAULT_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(
                json.dumps(
                    {
                        "fault": name,
                        "users": USERS,
                        "fault_s": FAULT_S,
                        "resumed_after_s": round(took, 2),
                    }
                )
                + "\n"
            )


async def test_postgres_blackholed_resumes_within_the_bound_and_applies_everything_once(
    lab: NetLab, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    rules = lab.blackhole_rules(POSTGRES_PORT)
    await _run_fault(
        "postgres_blackhole",
        lab,
        lambda: lab.drop(*rules),
        lambda: lab.undrop(rules),
        settings,
        pool,
        amqp,
        seed=71,
        warned=["postgres"],
    )


async def test_rabbitmq_blackholed_resumes_within_the_bound_and_applies_everything_once(
    lab: NetLab, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    rules = lab.blackhole_rules(AMQP_PORT)
    await _run_fault(
        "rabbitmq_blackhole",
        lab,
        lambda: lab.drop(*rules),
        lambda: lab.undrop(rules),
        settings,
        pool,
        amqp,
        seed=72,
        warned=["rabbitmq"],
    )


async def test_one_way_partition_resumes_within_the_bound_and_applies_everything_once(
    lab: NetLab, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    rules = lab.one_way_rules()
    await _run_fault(
        "one_way_partition",
        lab,
        lambda: lab.drop(*rules),
        lambda: lab.undrop(rules),
        settings,
        pool,
        amqp,
        seed=73,
        warned=["postgres", "rabbitmq"],
    )


async def test_added_latency_and_loss_resume_within_the_bound_and_apply_everything_once(
    lab: NetLab, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    rules = lab.loss_rules(0.01)

    def start() -> None:
        lab.delay(True)
        lab.drop(*rules)

    def end() -> None:
        lab.undrop(rules)
        lab.delay(False)

    await _run_fault(
        "latency_600ms_loss_1pct", lab, start, end, settings, pool, amqp, seed=74, warned=[]
    )


async def test_forwarder_reset_resumes_within_the_bound_and_applies_everything_once(
    lab: NetLab, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    await _run_fault(
        "reset",
        lab,
        lab.kill_proxy,
        lab.start_proxy,
        settings,
        pool,
        amqp,
        seed=75,
        warned=["postgres", "rabbitmq"],
    )
