"""structlog set-up: JSON lines off a TTY, readable output on one; context via contextvars.

Long-running processes (`pkgq run`, `pkgq relay`, `pkgq dlq ingest`) log to stdout, other
commands to stderr (their stdout is their output, e.g. `--json`). Libraries' own log records
(aio-pika, asyncpg, OpenTelemetry) go through the same renderer, so the stream stays JSON. Any
URL password in any string field is masked before a line is written, and on a console every
control character in a string field is shown as its escape (infra/terminal.py): messages' data
reaches the log, and must not drive the operator's terminal.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from infra.log_context import add_delivery
from infra.settings import mask_url
from infra.terminal import printable


def redact(_logger: object, _method: str, event: MutableMapping[str, Any]) -> Any:
    """Mask URL passwords in every string value (a last line of defence: call sites log masked
    URLs already)."""
    for key, value in event.items():
        if isinstance(value, str) and ("://" in value or "password=" in value.lower()):
            event[key] = mask_url(value)
    return event


def escape_controls(_logger: object, _method: str, event: MutableMapping[str, Any]) -> Any:
    """For console output only: JSON already escapes control characters."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = printable(value)
    return event


LIBRARIES = ("aiormq", "aio_pika", "asyncpg")
"""The connection libraries whose records `LibraryRecords` reworks."""
_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")
_CONNECTION_WORDS = re.compile(
    r"connect|transport|closed|heartbeat|stuck|reset|timed? ?out|unreachable|refused", re.I
)


class LibraryRecords(logging.Filter):
    """aiormq's, aio-pika's and asyncpg's records at the level the event deserves: a lost or
    failed connection, which pkgq reconnects by itself (docs/how-to/network-faults.md), is a
    WARNING, not an ERROR; its traceback is cut to one line (`error`); and no object address
    (`<Connection ... at 0x7f...>`) reaches the log, so lines of one event read the same every
    time. Other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(LIBRARIES):
            return True
        message = _ADDRESS.sub("", record.getMessage())
        record.msg, record.args = message, None
        exc = record.exc_info[1] if record.exc_info else None
        connection = _CONNECTION_WORDS.search(message) is not None or isinstance(
            exc, OSError | ConnectionError | TimeoutError
        )
        if connection and exc is not None:
            record.exc_info, record.exc_text = None, None
            record.msg = f"{message} ({_ADDRESS.sub('', repr(exc))})"
        if connection and record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class _Current:
    """sys.stdout or sys.stderr as it is when a line is written, not as it was when logging was
    set up: a live display on a terminal (a replay's progress) swaps it for one that prints
    above the display, so log lines do not tear it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def write(self, text: str) -> int:
        stream: TextIO = getattr(sys, self._name)
        return stream.write(text)

    def flush(self) -> None:
        stream: TextIO = getattr(sys, self._name)
        stream.flush()


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    out = stream or sys.stderr
    sink: Any = out
    if out is sys.stdout or out is sys.stderr:
        sink = _Current("stdout" if out is sys.stdout else "stderr")
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    threshold = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        add_delivery,  # the delivery being applied, if any (infra/log_context.py)
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
        redact,
    ]
    if not use_json:
        shared.append(escape_controls)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.PrintLoggerFactory(file=sink),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sink)
    handler.addFilter(LibraryRecords())
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(threshold, logging.WARNING))  # libraries: warnings and up
