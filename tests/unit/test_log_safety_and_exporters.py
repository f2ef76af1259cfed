"""Passwords never reach a log line, and the OTEL_* variables choose the span exporters."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

from infra.logging import configure_logging
from infra.settings import mask_url
from infra.tracing import _exporters


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:p@h1:5432,h2:5432/db", "postgresql://u:***@h1:5432,h2:5432/db"),
        (
            "postgresql://u@h/db?password=secret&sslmode=require",
            "postgresql://u@h/db?password=***&sslmode=require",
        ),
        ("postgresql://u:p%40ss@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
        ("amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/"),
        ("http://a:b@h:15672/api", "http://a:***@h:15672/api"),
        ("not a url", "not a url"),
    ],
)
def test_mask_url_masks_every_form_of_password_and_never_raises(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_a_password_in_any_log_field_or_library_record_is_masked_on_the_way_out() -> None:
    out = io.StringIO()
    configure_logging("json", "info", out)
    try:
        structlog.get_logger("t").info("connecting", target="amqp://svc:hunter2@rabbit:5672/")
        logging.getLogger("aiormq").warning("lost amqp://svc:hunter2@rabbit:5672/ again")
    finally:
        configure_logging("json", "info")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "hunter2" not in out.getvalue()
    assert lines[0]["target"] == "amqp://svc:***@rabbit:5672/"
    assert lines[1]["level"] == "warning"  # a library's record, rendered as JSON too
    assert "svc:***@rabbit" in lines[1]["event"]


def test_no_exporter_unless_the_otel_variables_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    assert _exporters() == []
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert _exporters() == []


def test_the_exporter_list_and_an_endpoint_switch_exporting_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp, console")
    assert [type(e) for e in _exporters()] == [OTLPSpanExporter, ConsoleSpanExporter]
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert [type(e) for e in _exporters()] == [OTLPSpanExporter]
