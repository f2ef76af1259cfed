"""Every metric the dashboard and the alert rules use is one a real pkgq process exports: a
`pkgq run` is spawned with its status port and its /metrics scraped."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.settings import Settings
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, free_port, http_get

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parents[2] / "deploy" / "observability"
METRIC = re.compile(r"\bpkgq_[a-z0-9_]+\b")


def used_metric_names() -> set[str]:
    """Metric names in the dashboard's queries and the rules' expressions (recording rules'
    own names contain colons, `pkgq:…`, and are not exported by pkgq)."""
    found: set[str] = set()
    for name in ("pkgq-dashboard.json", "pkgq-alerts.rules.yml"):
        found |= set(METRIC.findall((HERE / name).read_text()))
    return found


def exported_names(exposition: str) -> set[str]:
    """The sample names a scrape can contain: the samples present, and for every declared
    family (a labelled one may have no sample yet) the names its type produces."""
    names = {line.split("{")[0].split()[0] for line in exposition.splitlines() if line[:1] != "#"}
    for kind_line in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.MULTILINE):
        name, kind = kind_line
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    names.discard("")
    return names


def test_the_name_extractor_finds_histogram_buckets_and_labelled_families() -> None:
    exposition = (
        "# HELP pkgq_x_seconds x\n# TYPE pkgq_x_seconds histogram\n"
        "# HELP pkgq_y y\n# TYPE pkgq_y gauge\n"
        'pkgq_z_total{a="b"} 1.0\n'
    )
    assert exported_names(exposition) == {
        "pkgq_x_seconds_bucket",
        "pkgq_x_seconds_sum",
        "pkgq_x_seconds_count",
        "pkgq_y",
        "pkgq_z_total",
    }


async def test_every_metric_the_dashboard_and_the_alerts_use_is_exported_by_a_pkgq_process(
    settings: Settings, spawn: Callable[..., PkgqProcess]
) -> None:
    port = free_port()
    run = spawn(
        "run",
        PKGQ_HTTP_PORT=str(port),
        PKGQ_HTTP_HOST="127.0.0.1",
        PKGQ_METRICS_REFRESH_INTERVAL="0.5",
    )
    scraped: list[str] = []

    async def scrape() -> bool:
        assert run.proc.poll() is None, run.logs()
        try:
            status, text = await http_get(port, "/metrics")
        except OSError:
            return False
        scraped[:] = [text]
        # The database and queue gauges are filled by the first refresh.
        return status == 200 and "pkgq_queue_consumers{" in text

    await eventually(scrape, within=60)
    used = used_metric_names()
    assert len(used) >= 12  # the extractor found the queries
    missing = used - exported_names(scraped[0])
    assert not missing, f"used by deploy/observability but not exported: {sorted(missing)}"
