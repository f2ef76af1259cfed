"""Log lines written while a delivery is applied name it (infra/log_context.py): its route,
message, user and trace, worked out for the lines written; a field the call site gives wins."""

from __future__ import annotations

import io
import json
from uuid import UUID

import structlog

from events.envelope import Envelope
from infra import log_context
from infra.logging import configure_logging

USER = UUID("00000000-0000-4000-8000-0000000000aa")
MESSAGE = UUID("00000000-0000-4000-8000-0000000000bb")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _envelope() -> Envelope:
    return Envelope(
        message_id=MESSAGE,
        message_type="t",
        schema_version=1,
        user_id=USER,
        traceparent=TRACEPARENT,
    )


def _lines(write: object) -> list[dict[str, object]]:
    out = io.StringIO()
    configure_logging("json", "info", out)
    try:
        assert callable(write)
        write(structlog.get_logger("test"))
    finally:
        configure_logging("json", "info")  # as the other tests find it
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_line_logged_while_a_delivery_is_applied_names_its_route_message_user_and_trace() -> None:
    def write(log: structlog.typing.FilteringBoundLogger) -> None:
        token = log_context.enter("telecom.usage_record", _envelope())
        try:
            log.warning("inside")
            log.warning("own", message_id="given")
        finally:
            log_context.leave(token)
        log.warning("after")

    inside, own, after = _lines(write)
    assert inside["route"] == "telecom.usage_record"
    assert inside["message_id"] == str(MESSAGE)
    assert inside["user_id"] == str(USER)
    assert inside["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert own["message_id"] == "given"  # the call site's field wins
    assert "message_id" not in after
    assert "route" not in after


def test_a_delivery_without_a_user_or_trace_logs_them_as_null() -> None:
    envelope = Envelope(message_id=MESSAGE, message_type="t", schema_version=1, user_id=None)

    def write(log: structlog.typing.FilteringBoundLogger) -> None:
        token = log_context.enter("telecom.expiry_due", envelope)
        try:
            log.warning("inside")
        finally:
            log_context.leave(token)

    (inside,) = _lines(write)
    assert inside["user_id"] is None
    assert inside["trace_id"] is None
    assert inside["message_id"] == str(MESSAGE)
