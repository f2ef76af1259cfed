"""OpenTelemetry traces across the queue: the W3C `traceparent` travels with every message.

A consumer applies each message in a span that continues the trace in the message's
`traceparent` header (or starts one). The follow-up events the handler writes to the outbox
carry that span's `traceparent`, and the relay publishes the row's headers as they are, so one
purchase's trace runs purchase -> queuing -> activate -> expiring -> all_expired, one span per
hop, each the child of the one before.

Every message gets a trace context to follow in the logs and the outbox. Real spans (the
OpenTelemetry SDK's) are made only when something receives them; otherwise each hop only takes
a new span id under the incoming trace (or starts a trace), which costs next to nothing. Spans
are exported only when the standard variables ask for it:
- `OTEL_TRACES_EXPORTER=otlp` (OTLP over HTTP; `OTEL_EXPORTER_OTLP_ENDPOINT`, …) or `console`;
- or an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`);
- `OTEL_SERVICE_NAME` names the service (default `pkgq-<role>`); `OTEL_SDK_DISABLED=true`
  turns spans off altogether (the incoming `traceparent` is then passed on unchanged).
Nothing is exported by default.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from uuid import UUID

import structlog
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from events.envelope import trace_id_of

log = structlog.get_logger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER = "pkgq"
_provider: TracerProvider | None = None
_recording = False
"""Whether anything receives spans (an exporter, or a test's processor)."""


def _exporters() -> list[SpanExporter]:
    """What `OTEL_TRACES_EXPORTER` (a comma-separated list) and the OTLP endpoint variables ask
    for. OTLP is sent over HTTP/protobuf (the only OTLP exporter installed)."""
    chosen = [
        name.strip().lower()
        for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if name.strip()
    ]
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not chosen and endpoint:
        chosen = ["otlp"]
    found: list[SpanExporter] = []
    for name in chosen:
        if name == "console":
            found.append(ConsoleSpanExporter())
        elif name == "otlp":
            protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            if protocol != "http/protobuf":
                log.warning("otel_protocol_unsupported", protocol=protocol, using="http/protobuf")
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            found.append(OTLPSpanExporter())
        elif name != "none":
            log.warning("otel_exporter_unknown", exporter=name, supported="otlp, console, none")
    return found


def configure_tracing(role: str, *, extra: SpanProcessor | None = None) -> TracerProvider | None:
    """Install the tracer provider once per process (later calls only add `extra`)."""
    global _provider, _recording
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if _provider is None:
        name = os.environ.get("OTEL_SERVICE_NAME") or f"pkgq-{role}"
        _provider = TracerProvider(resource=Resource.create({"service.name": name}))
        for exporter in _exporters():
            _provider.add_span_processor(BatchSpanProcessor(exporter))
            _recording = True
            log.info("tracing_exporting", exporter=type(exporter).__name__, service=name)
        trace.set_tracer_provider(_provider)
    if extra is not None:
        _provider.add_span_processor(extra)
        _recording = True
    return _provider


def shutdown_tracing() -> None:
    """Flush what is still buffered for the exporter (at process exit)."""
    if _provider is not None:
        _provider.shutdown()


def consuming(
    route: str, message_id: UUID | str, traceparent: str | None
) -> AbstractContextManager[str | None]:
    """Apply one message in a CONSUMER span, the child of its `traceparent`. Yields the
    `traceparent` its follow-up messages carry. Entered for every delivery: with no span to
    record, a plain context object (no generator) and the message id left as it is."""
    if not _recording:
        return _Unrecorded(traceparent if _provider is None else child_traceparent(traceparent))
    return _span(route, "process", SpanKind.CONSUMER, str(message_id), traceparent, None)


class _Unrecorded(AbstractContextManager["str | None"]):
    """`consuming` when no span is recorded: yields the traceparent to carry on."""

    __slots__ = ("_carried",)

    def __init__(self, carried: str | None) -> None:
        self._carried = carried

    def __enter__(self) -> str | None:
        return self._carried

    def __exit__(self, *_: object) -> None:
        return None


def publishing(
    route: str, message_id: UUID | str, traceparent: str | None, since: datetime | None
) -> AbstractContextManager[str | None]:
    """The relay's PRODUCER span for publishing an outbox row, from the moment the row fell due
    (`since`) to the broker's confirm: the time a message spent in the outbox shows in its trace.
    Yields the `traceparent` to publish with (unchanged when no span is recorded: a plain
    context object, as for `consuming`)."""
    if not _recording:
        return _Unrecorded(traceparent)
    return _span(route, "publish", SpanKind.PRODUCER, str(message_id), traceparent, since)


@contextmanager
def _span(
    route: str,
    operation: str,
    kind: SpanKind,
    message_id: str,
    traceparent: str | None,
    since: datetime | None,
) -> Iterator[str | None]:
    """A recorded messaging span, the child of `traceparent`; yields its own `traceparent`."""
    parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(
        f"{route} {operation}",
        context=parent,
        kind=kind,
        start_time=int(since.timestamp() * 1e9) if since is not None else None,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": operation,
            "messaging.destination.name": route,
            "messaging.message.id": message_id,
        },
    ) as span:
        yield traceparent_of(span, traceparent)


def child_traceparent(traceparent: str | None) -> str:
    """A new span id under `traceparent`'s trace (a new trace if it has none)."""
    trace_id = trace_id_of(traceparent)
    flags = traceparent.rsplit("-", 1)[-1] if trace_id is not None and traceparent else "01"
    if trace_id is None:
        trace_id = f"{random.getrandbits(128) or 1:032x}"
    return f"00-{trace_id}-{random.getrandbits(64) or 1:016x}-{flags}"


def traceparent_of(span: Span, fallback: str | None) -> str | None:
    """The `traceparent` that follow-up messages carry: the span's, or (no SDK) the incoming."""
    if not span.get_span_context().is_valid:
        return fallback
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", fallback)
