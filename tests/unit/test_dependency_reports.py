"""The stall report of infra/dependencies.py: when it warns, how often, and what it says."""

from __future__ import annotations

import asyncio
import time

import structlog
from prometheus_client import REGISTRY

from infra.dependencies import FIRST_REPORT_S, LONGEST_GAP_S, Dependencies, dependencies


def _up_value(service: str, dependency: str) -> float | None:
    return REGISTRY.get_sample_value(
        "pkgq_dependency_up", {"service": service, "dependency": dependency}
    )


async def test_a_stall_is_warned_from_seconds_in_at_a_slowing_rate_then_its_end_said() -> None:
    deps = Dependencies()
    deps.service = "unit-a"
    with structlog.testing.capture_logs() as logs:
        deps.down("postgres", ConnectionResetError("gone"), "retrying", route="usage_record")
        start = time.monotonic()
        assert deps.report(start + FIRST_REPORT_S - 0.1) == 0  # a blip is quiet
        moments = [start + s for s in (3.0, 4.0, 9.0, 12.0, 21.0, 45.0, 93.0, 150.0, 153.0, 200.0)]
        counts = [deps.report(at) for at in moments]
        deps.up("postgres", "usage_record")
    assert counts == [1, 0, 1, 0, 1, 1, 1, 0, 1, 0]  # gaps 6, 12, 24, 48, then 60 at most
    warnings = [e for e in logs if e["event"] == "dependency_unreachable"]
    assert all(w["log_level"] == "warning" for w in warnings)
    assert warnings[0]["route"] == "usage_record"
    assert warnings[0]["doing"] == "retrying"
    assert "since" in warnings[0]
    assert warnings[0]["for_s"] >= FIRST_REPORT_S
    assert max(w["next_report_in_s"] for w in warnings) == LONGEST_GAP_S
    (recovered,) = [e for e in logs if e["event"] == "dependency_recovered"]
    assert recovered["dependency"] == "postgres"
    assert recovered["outage_s"] >= 0


async def test_the_metric_and_readiness_are_down_while_any_route_of_a_dependency_is_down() -> None:
    deps = Dependencies()
    deps.service = "unit-b"
    deps.up("rabbitmq")
    assert _up_value("unit-b", "rabbitmq") == 1
    deps.down("rabbitmq", "connection closed", "reconnecting")
    deps.down("rabbitmq", "closed channel", "renewing", route="relay")
    assert _up_value("unit-b", "rabbitmq") == 0
    assert not deps.all_up()
    deps.up("rabbitmq", "relay")  # ends the relay's stall and the route-less one
    assert deps.all_up()
    assert _up_value("unit-b", "rabbitmq") == 1


async def test_a_short_failure_is_never_warned_and_logs_no_recovery() -> None:
    deps = Dependencies()
    with structlog.testing.capture_logs() as logs:
        deps.down("postgres", "reset", "retrying")
        deps.up("postgres")
    assert [e["event"] for e in logs if e["log_level"] != "debug"] == []


async def test_the_process_registry_reports_by_itself_while_something_is_down() -> None:
    deps = dependencies()
    assert dependencies() is deps
    deps.down("postgres", "unreachable", "probing")
    reporter = deps._reporter
    assert reporter is not None
    assert not reporter.done()
    deps.up("postgres")
    await asyncio.wait_for(reporter, timeout=5)  # it ends once nothing is down
