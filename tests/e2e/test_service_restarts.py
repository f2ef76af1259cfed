"""Postgres or RabbitMQ restarts in the middle of a run: processes recover, the end state is exact.

These restart the machine's real services (the CI machine's too) and wait for them to come back.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from infra.settings import Settings
from tests.e2e.workload import Workload
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, assert_doctor_clean, free_port, http_get

pytestmark = [pytest.mark.e2e, pytest.mark.serial]


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)


def restart_postgres() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    _run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart")


def restart_rabbitmq() -> None:
    _run("rabbitmqctl", "stop_app")
    _run("rabbitmqctl", "start_app")
    _run("rabbitmqctl", "await_startup", "--timeout", "60")


async def _run_with_restart(
    restart: Callable[[], None],
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
    seed: int,
) -> None:
    workload = await Workload.create(pool, seed=seed)
    relay = spawn("relay")
    consumers = spawn("run")
    await workload.send_purchases(settings, amqp)
    await workload.wait_all_queued(pool)
    usage = asyncio.create_task(workload.send_usage(settings, amqp))
    await asyncio.sleep(0.3)  # part of the usage is in flight
    await asyncio.to_thread(restart)
    await usage  # the test's own publisher rides out the restart too
    try:
        await workload.wait_end_state(pool, within=60)
    except AssertionError as exc:
        trouble = []
        for p in (relay, consumers):
            lines = p.logs().splitlines()
            trouble += [f"--- pkgq {' '.join(p.args)} exit={p.proc.poll()}"]
            trouble += [ln for ln in lines if "dead_lettered" in ln or '"error"' in ln][:10]
            if p.proc.poll() not in (None, 0):
                trouble += lines[-40:]
        raise AssertionError(f"{exc}\nprocess log lines:\n" + "\n".join(trouble)) from None
    assert relay.proc.poll() is None, relay.logs()
    assert consumers.proc.poll() is None, consumers.logs()
    assert consumers.terminate() == 0, consumers.logs()
    assert relay.terminate() == 0, relay.logs()
    await assert_doctor_clean(settings)


async def test_postgres_restart_mid_run_loses_nothing_and_applies_nothing_twice(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    await _run_with_restart(restart_postgres, settings, pool, amqp, spawn, seed=5)


async def test_rabbitmq_restart_mid_run_loses_nothing_and_applies_nothing_twice(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    await _run_with_restart(restart_rabbitmq, settings, pool, amqp, spawn, seed=6)


async def test_sigterm_while_rabbitmq_is_down_still_exits_within_the_drain_timeout(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    consumers = spawn("run", PKGQ_DRAIN_TIMEOUT="5")
    await asyncio.sleep(2.0)  # consuming
    await asyncio.to_thread(_run, "rabbitmqctl", "stop_app")
    try:
        await asyncio.sleep(1.0)
        started = asyncio.get_running_loop().time()
        code = await asyncio.to_thread(consumers.terminate, 30)
        took = asyncio.get_running_loop().time() - started
    finally:
        await asyncio.to_thread(_run, "rabbitmqctl", "start_app")
        await asyncio.to_thread(_run, "rabbitmqctl", "await_startup", "--timeout", "60")
    assert code == 0, consumers.logs()
    assert took < 15, f"shutdown took {took:.1f}s"


def _postgres(action: str) -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    _run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action)


async def test_readyz_turns_not_ready_while_postgres_is_stopped_and_ready_once_it_is_back(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    port = free_port()
    consumers = spawn("run", "usage_record", PKGQ_HTTP_PORT=str(port), PKGQ_HTTP_HOST="127.0.0.1")

    def readyz_is(code: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            try:
                return (await http_get(port, "/readyz"))[0] == code
            except OSError:
                return False

        check.__qualname__ = f"readyz_is_{code}"
        return check

    await eventually(readyz_is(200), within=30)
    await asyncio.to_thread(_postgres, "stop")
    try:
        await eventually(readyz_is(503), within=30)
        assert (await http_get(port, "/healthz"))[0] == 200  # alive, only not ready
    finally:
        await asyncio.to_thread(_postgres, "start")
    await eventually(readyz_is(200), within=60)
    assert consumers.proc.poll() is None, consumers.logs()
