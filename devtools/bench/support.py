"""What the `pkgq bench` phases share: the scenario's knobs, a run's result, the benchmark's own
names, and how its messages and child processes are made."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar
from uuid import UUID, uuid4

import aio_pika

from events.envelope import Envelope
from events.routes import Route
from infra.rabbit.publisher import build_message
from infra.settings import Settings

TRAFFIC = 1000
"""Each package's traffic limit; each usage record uses exactly one package up."""
TABLES = (
    "package_queue",
    "queue_users",
    "outbox",
    "inbox",
    "access",
    "dead_letters",
    "holds",
    "parked",
)


@dataclass
class Scenario:
    users: int = 400
    packages: int = 5
    small_rows: int = 10_000
    large_rows: int = 1_000_000
    batch_size: int = Settings.model_fields["batch_size"].default
    batch_max: int = Settings.model_fields["batch_max"].default
    prefetch: int = Settings.model_fields["prefetch"].default
    """pkgq's own defaults, unless the bench is told otherwise (and the raw baseline's QoS)."""
    raw_messages: int = 5_000
    repeat: int = 2
    """Runs of each backlog drain; the fastest counts."""
    lifecycle_repeat: int = 3
    """Runs of the raw broker and of each pkgq lifecycle phase (short runs, so the noisiest
    figures: more of them); the fastest counts."""
    replicas: int = 1
    """`pkgq run` processes; above 1, every route gets as many partitions, one per replica."""
    backlog_users: int = 1_000
    backlog_records: int = 20_000
    """The backlog phase: usage records already queued, spread over that many users."""
    timeout: float = 240.0
    namespace: str = "bench"
    """Names of its own: database pkgq_<namespace>, exchange and queues <namespace>.*."""


@dataclass
class RunResult:
    label: str
    events: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)
    rss_mb: dict[str, float] = field(default_factory=dict)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_settings(base: Settings, namespace: str = "bench") -> Settings:
    """The benchmark's own database and broker names, next to the configured ones."""
    server = base.postgres_dsn.rsplit("/", 1)[0]
    owner_server = base.owner_dsn().rsplit("/", 1)[0]
    return base.model_copy(
        update={
            "postgres_dsn": f"{server}/pkgq_{namespace}",
            "migrate_dsn": f"{owner_server}/pkgq_{namespace}",
            "exchange": f"{namespace}.telecom",
            "queue_prefix": f"{namespace}.pkgq",
            "relay_poll_interval": 0.2,
        }
    )


def message(body: bytes, route: Route, user: UUID | None) -> aio_pika.Message:
    envelope = Envelope(
        message_id=uuid4(),
        message_type=route.message_type,
        schema_version=route.schema_version,
        user_id=user,
    )
    return build_message(
        body,
        message_id=envelope.message_id,
        message_type=envelope.message_type,
        headers=envelope.headers(),
    )


def child_env(
    settings: Settings, *, batch_size: int, prefetch: int, batch_max: int | None = None
) -> dict[str, str]:
    """The environment of the bench's `pkgq` processes (batch_max: batch_size if not given)."""
    return {
        **os.environ,
        **settings.child_env(),
        "PKGQ_BATCH_SIZE": str(batch_size),
        "PKGQ_BATCH_MAX": str(batch_max or batch_size),
        "PKGQ_PREFETCH": str(prefetch),
        "PKGQ_LOG_LEVEL": "warning",
        "PKGQ_LOG_FORMAT": "json",
    }


R = TypeVar("R")


async def in_turns(
    pairs: int,
    first: Callable[[], Awaitable[R]],
    second: Callable[[], Awaitable[R]],
    *,
    between: Callable[[], Awaitable[object]] | None = None,
) -> tuple[list[R], list[R]]:
    """`pairs` runs of each side taking turns, so a slow spell of the shared machine falls on
    both; each side first in every other pair (the first of a pair is often the faster).
    `between` runs before every pair but the first."""
    firsts: list[R] = []
    seconds: list[R] = []
    for number in range(pairs):
        if number and between is not None:
            await between()
        if number % 2:
            seconds.append(await second())
            firsts.append(await first())
        else:
            firsts.append(await first())
            seconds.append(await second())
    return firsts, seconds


def fastest(results: Iterable[RunResult]) -> RunResult:
    """The run with the most events per second (a shared machine only ever slows a run down)."""
    return max(results, key=lambda r: r.events_per_s)


STATUS_PORT_BASE = "PKGQ_BENCH_STATUS_PORT"
"""When set (a port number B), the bench's relay serves /metrics on B and its `pkgq run`
replica i on B + 1 + i, on 127.0.0.1: deploy/observability/render.py scrapes them."""


def status_port_env(env: dict[str, str], offset: int) -> dict[str, str]:
    """`env` with the status port of the bench's child number `offset`, if asked for."""
    base = env.get(STATUS_PORT_BASE)
    if not base:
        return env
    return {**env, "PKGQ_HTTP_PORT": str(int(base) + offset), "PKGQ_HTTP_HOST": "127.0.0.1"}


def spawn(
    args: list[str], env: dict[str, str], module: str = "consumers"
) -> subprocess.Popen[bytes]:
    """`python -m module args`: `pkgq` by default."""
    return subprocess.Popen(  # noqa: S603  (our own entry point)
        [sys.executable, "-m", module, *args], env=env, stdout=subprocess.DEVNULL
    )


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set size so far."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process `pid` has used so far; NaN if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime: after the name, 14th and 15th
    except (OSError, IndexError, ValueError):
        return float("nan")
    return ticks / os.sysconf("SC_CLK_TCK")


def stop_processes(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM, then wait for each (a graceful drain); kill what has not exited within 30 s."""
    started = list(processes)
    for p in started:
        p.send_signal(signal.SIGTERM)
    for p in started:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()


def backlog_rounds(users: int, records: int) -> list[int]:
    """Publishing rounds: round r sends one record to each of its first n users, so record j
    goes to user j % users and no user has two records in one (concurrent) round."""
    full, rest = divmod(records, users)
    return [users] * full + ([rest] if rest else [])


def statement_kinds(statements: Sequence[str]) -> dict[str, int]:
    """Statements counted by their first keyword (INSERT, SELECT, ...), most frequent first."""
    counts: dict[str, int] = {}
    for text in statements:
        words = text.lstrip("( ").split(maxsplit=1)
        kind = words[0].rstrip(";").upper() if words else "?"
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
