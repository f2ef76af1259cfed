"""`pkgq bench` at a tiny size: it runs every phase and ends with its machine-readable lines.

No figure is judged here (timings on a shared machine are noise); `make bench` is the
measurement.
"""

from __future__ import annotations

import math

import asyncpg
import pytest

from infra.settings import Settings
from tests.support.processes import cli

pytestmark = pytest.mark.e2e

KEYS = [
    "ratio_vs_simple_consumer",
    "ratio_vs_faststream",
    "faststream_records_per_s",
    "ratio_usage_vs_broker_consume",
    "broker_consume_ack_per_s",
    "statements_per_batch",
    "events_per_s",
    "p50_ms",
    "p99_ms",
    "rss_mb_max",
    "ratio_vs_raw_broker",
    "ratio_vs_naive",
    "ratio_1m_vs_10k",
]


async def _drop_database(settings: Settings, name: str) -> None:
    admin = await asyncpg.connect(settings.postgres_dsn.rsplit("/", 1)[0] + "/postgres")
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


async def test_bench_runs_every_phase_and_ends_with_one_key_value_line_per_figure(
    settings: Settings,
) -> None:
    # Names of its own (the test's), so a `make bench` running meanwhile is not disturbed.
    namespace = settings.exchange.split(".", 1)[0] + "_bench"
    done = await cli(
        settings,
        "bench",
        "--users",
        "8",
        "--packages",
        "2",
        "--small-rows",
        "100",
        "--large-rows",
        "300",
        "--raw-messages",
        "200",
        "--backlog-users",
        "20",
        "--backlog-records",
        "200",
        "--repeat",
        "1",
        "--lifecycle-repeat",
        "1",
        "--namespace",
        namespace,
    )
    for database in (f"pkgq_{namespace}", f"pkgq_{namespace}_large"):
        await _drop_database(settings, database)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()[-len(KEYS) :]
    figures = dict(line.split("=", 1) for line in lines)
    assert list(figures) == KEYS
    for key, value in figures.items():
        assert math.isfinite(float(value)), (key, value)
        assert float(value) > 0, (key, value)
