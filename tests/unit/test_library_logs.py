"""aiormq's, aio-pika's and asyncpg's own log records as pkgq writes them (infra/logging.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from aiormq.exceptions import AMQPConnectionError

from infra.logging import configure_logging


class Thing:
    """Something whose default repr carries an object address."""


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure_logging("json", "info", out)
    try:
        yield out
    finally:
        configure_logging("json", "info")


def _records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_library_connection_error_is_written_as_a_warning_without_address_or_traceback(
    lines: io.StringIO,
) -> None:
    logging.getLogger("aiormq.connection").error(
        "error when creating transport: %r", AMQPConnectionError("no answer from rabbit:5672")
    )
    error = ConnectionResetError("reset by peer")
    logging.getLogger("aio_pika.robust_connection").error(
        "Connection %r lost", Thing(), exc_info=(ConnectionResetError, error, None)
    )
    first, second = _records(lines)
    assert first["level"] == "warning"
    assert "no answer from rabbit:5672" in first["event"]
    assert second["level"] == "warning"
    assert "0x" not in second["event"]
    assert "exception" not in second
    assert "ConnectionResetError('reset by peer')" in second["event"]


def test_a_library_error_that_is_not_about_a_connection_stays_an_error_without_addresses(
    lines: io.StringIO,
) -> None:
    logging.getLogger("aio_pika.queue").error("Failed to decode %r", Thing())
    (record,) = _records(lines)
    assert record["level"] == "error"
    assert "0x" not in record["event"]


def test_records_of_other_libraries_are_left_as_they_are(lines: io.StringIO) -> None:
    logging.getLogger("opentelemetry.sdk").error("export failed %s", "closed transport")
    (record,) = _records(lines)
    assert record["level"] == "error"
