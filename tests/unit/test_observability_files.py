"""deploy/observability/: the dashboard is well-formed Grafana JSON, and the PrometheusRule
carries exactly the plain rules file's groups. (promtool checks and unit-tests the rules in
`make check`; tests/e2e/test_observability_metrics.py checks the metric names they use.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[2] / "deploy" / "observability"
DASHBOARD = HERE / "pkgq-dashboard.json"
RULES = HERE / "pkgq-alerts.rules.yml"
PROMETHEUS_RULE = HERE / "prometheusrule.yaml"

ALERTS = {
    "PkgqDeadLettersGrowing",
    "PkgqOutboxOldestRowTooOld",
    "PkgqQueueWithoutConsumer",
    "PkgqHeldUsersGrowing",
    "PkgqReconnectStorm",
    "PkgqWorkerReaped",
    "PkgqInvariantViolated",
    "PkgqRoutePaused",
    "PkgqCircuitBreakerTripped",
    "PkgqDependencyUnreachable",
    "PkgqCriticalTimeOverObjective",
}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard()["panels"] for t in p["targets"]]


def test_every_dashboard_panel_has_a_unique_id_a_place_and_at_least_one_query() -> None:
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["targets"], panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"])
        assert panel["datasource"]["uid"] == "${datasource}"


def test_the_dashboard_shows_what_an_operator_watches() -> None:
    queries = " ".join(q for _, q in panel_queries())
    for metric in (
        "pkgq_messages_total",  # message rate by outcome
        "pkgq_processing_seconds_bucket",  # p99 processing time
        "pkgq_outbox_pending",
        "pkgq_outbox_oldest_pending_seconds",
        "pkgq_dead_letters",  # by route
        "pkgq_held_users",
        "pkgq_job_messages",  # job states
        "pkgq_reconnects_total",
        "pkgq_invariant_violations",
        "pkgq_critical_seconds_bucket",  # the time a user waits, p50 and p99
        "pkgq_critical_p99_objective_seconds",
        "pkgq_access_granted_seconds_bucket",
        "pkgq_publisher_clock_skew_total",
    ):
        assert metric in queries, metric
    assert "sum by (outcome)" in queries
    assert "histogram_quantile(0.99" in queries


def test_the_prometheus_rule_carries_the_rules_file_groups_verbatim() -> None:
    rules = RULES.read_text()
    groups = rules[rules.index("groups:") :]
    resource = PROMETHEUS_RULE.read_text()
    assert "kind: PrometheusRule" in resource
    spec = resource[resource.index("\nspec:\n") + len("\nspec:\n") :]
    assert "".join(line.removeprefix("  ") for line in spec.splitlines(keepends=True)) == groups
    assert all(line.startswith("  ") or not line.strip() for line in spec.splitlines())


def test_the_rules_file_has_each_alert_once_and_a_promtool_test_for_each() -> None:
    alerts = re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.MULTILINE)
    assert sorted(alerts) == sorted(ALERTS)
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "pkgq-alerts.test.yml").read_text()))
    assert tested == ALERTS
