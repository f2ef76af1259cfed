"""The trace context each hop passes on when no span is recorded: same trace, new span id."""

from __future__ import annotations

import re

from events.envelope import trace_id_of
from infra.tracing import child_traceparent

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def test_a_child_keeps_the_trace_and_its_flags_and_takes_a_new_span_id() -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    child = child_traceparent(parent)
    assert TRACEPARENT.match(child)
    assert trace_id_of(child) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert child.split("-")[2] != "00f067aa0ba902b7"
    assert child.endswith("-01")
    assert child_traceparent(child).split("-")[2] != child.split("-")[2]


def test_without_a_trace_a_message_starts_one() -> None:
    for missing in (None, "", "garbage", "00-short-00f067aa0ba902b7-01"):
        started = child_traceparent(missing)
        assert TRACEPARENT.match(started)
        assert trace_id_of(started) is not None


def test_the_trace_id_is_read_only_from_a_well_formed_traceparent() -> None:
    assert trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") == (
        "4bf92f3577b34da6a3ce929d0e0e4736"
    )
    assert trace_id_of(None) is None
    assert trace_id_of("00-abc-def-01") is None
