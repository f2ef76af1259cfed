"""infra/faults.py: the spec parses as documented and is checked at start-up (Settings), a point
is a no-op unless a fault enables it, and an enabled fault kills at its route and its count."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from events.routes import PACKAGE_PURCHASE, PACKAGE_QUEUING
from infra import faults
from infra.faults import Fault, FaultSpecError
from infra.settings import Settings

QUEUING = PACKAGE_QUEUING.name
PURCHASE = PACKAGE_PURCHASE.name


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """The os.kill calls `hit` makes (none reaches the test process), with faults reset after."""
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: calls.append((pid, sig)))
    yield calls
    faults.configure(None)


def test_the_documented_example_parses_into_two_faults() -> None:
    spec = "delivery.before_commit=telecom.usage_record,relay.after_confirm@3"
    assert faults.parse(spec) == (
        Fault(faults.DELIVERY_BEFORE_COMMIT, "telecom.usage_record", 1),
        Fault(faults.RELAY_AFTER_CONFIRM, None, 3),
    )


def test_blanks_and_empty_entries_are_ignored_and_an_empty_spec_names_nothing() -> None:
    assert faults.parse("") == ()
    assert faults.parse(" , ") == ()
    assert faults.parse(f" {faults.CONSUMER_AFTER_COMMIT}={QUEUING}@2 ,") == (
        Fault(faults.CONSUMER_AFTER_COMMIT, QUEUING, 2),
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("consumer.after_comit", "unknown fault point 'consumer.after_comit'; points are"),
        ("kill_before_commit=telecom.package_purchase", "unknown fault point"),
        ("relay.after_confirm@", "is not of the form point[=route][@n]"),
        ("relay.after_confirm@x", "is not of the form"),
        ("relay.after_confirm@-1", "is not of the form"),
        ("consumer.after_commit=a=b", "is not of the form"),
        ("consumer.after_commit=", "is not of the form"),
        ("=telecom.package_purchase", "is not of the form"),
        ("relay.after_confirm@0", "must be 1 or more"),
        ("relay.after_confirm@1,relay.after_confirm@2", "is given twice"),
    ],
)
def test_a_bad_spec_is_refused_with_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(FaultSpecError, match=re.escape(message)):
        faults.parse(spec)


def test_settings_read_pkgq_faults_and_default_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().faults == ""
    monkeypatch.setenv("PKGQ_FAULTS", f"{faults.RELAY_AFTER_CONFIRM}@10")
    assert Settings().faults == "relay.after_confirm@10"


def test_settings_refuse_an_unknown_point_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKGQ_FAULTS", "consumer.after_ack")
    with pytest.raises(ValidationError) as info:
        Settings()
    text = str(info.value)
    assert "PKGQ_FAULTS 'consumer.after_ack': unknown fault point 'consumer.after_ack'" in text
    assert faults.CONSUMER_AFTER_COMMIT in text  # the points it could have named


def test_settings_refuse_a_fault_for_an_unknown_route() -> None:
    with pytest.raises(ValidationError, match=r"unknown route\(s\) \['package_queuing'\]"):
        Settings(faults=f"{faults.CONSUMER_AFTER_COMMIT}=package_queuing")


def test_no_point_kills_while_nothing_is_enabled(kills: list[tuple[int, int]]) -> None:
    faults.configure(None)
    for point in sorted(faults.POINTS):
        for _ in range(5):
            faults.hit(point)
            faults.hit(point, route=QUEUING)
    faults.hit("not.a.point")  # not even looked at while disabled: no cost, no error
    assert kills == []


def test_a_fault_kills_only_at_its_own_point_and_route(kills: list[tuple[int, int]]) -> None:
    faults.configure(f"{faults.CONSUMER_AFTER_COMMIT}={QUEUING}")
    faults.hit(faults.DELIVERY_BEFORE_COMMIT, route=QUEUING)
    faults.hit(faults.CONSUMER_AFTER_COMMIT, route=PURCHASE)
    faults.hit(faults.CONSUMER_AFTER_COMMIT)
    assert kills == []
    faults.hit(faults.CONSUMER_AFTER_COMMIT, route=QUEUING)
    assert kills == [(os.getpid(), signal.SIGKILL)]


def test_a_fault_without_a_route_kills_at_its_nth_hit_on_any_route(
    kills: list[tuple[int, int]],
) -> None:
    faults.configure(f"{faults.RELAY_AFTER_CONFIRM}@3")
    faults.hit(faults.RELAY_AFTER_CONFIRM, route=QUEUING)
    faults.hit(faults.RELAY_AFTER_CONFIRM, route=PURCHASE)
    assert kills == []
    faults.hit(faults.RELAY_AFTER_CONFIRM)
    assert len(kills) == 1


def test_configure_replaces_what_was_enabled_and_restarts_the_counts(
    kills: list[tuple[int, int]],
) -> None:
    faults.configure(f"{faults.RELAY_AFTER_CONFIRM}@2")
    faults.hit(faults.RELAY_AFTER_CONFIRM)
    faults.configure(f"{faults.RELAY_AFTER_CONFIRM}@2")
    faults.hit(faults.RELAY_AFTER_CONFIRM)
    assert kills == []
    with pytest.raises(FaultSpecError):
        faults.configure("nonsense")
    faults.hit(faults.RELAY_AFTER_CONFIRM)  # a refused spec changed nothing: this is the 2nd
    assert len(kills) == 1
    faults.configure("")
    faults.hit(faults.RELAY_AFTER_CONFIRM)
    assert len(kills) == 1


def test_an_unknown_point_is_a_bug_once_faults_are_enabled(kills: list[tuple[int, int]]) -> None:
    faults.configure(faults.CONSUMER_AFTER_COMMIT)
    with pytest.raises(ValueError, match=re.escape("unknown fault point 'consumer.after_comit'")):
        faults.hit("consumer.after_comit")
    assert kills == []


def _hit_in_a_child(spec: str) -> subprocess.CompletedProcess[str]:
    script = (
        "from infra import faults\n"
        f"faults.configure({spec!r})\n"
        "faults.hit(faults.CONSUMER_AFTER_COMMIT, route='telecom.package_queuing')\n"
        "print('survived')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=False
    )


def test_an_enabled_fault_sigkills_the_process_and_says_which() -> None:
    killed = _hit_in_a_child(f"{faults.CONSUMER_AFTER_COMMIT}={QUEUING}")
    assert killed.returncode == -signal.SIGKILL
    assert "survived" not in killed.stdout
    assert f"fault consumer.after_commit={QUEUING}@1 reached: SIGKILL" in killed.stderr
    spared = _hit_in_a_child("")
    assert (spared.returncode, spared.stdout) == (0, "survived\n")
