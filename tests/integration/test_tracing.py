"""One purchase's trace, followed through the outbox to the all_expired consumer.

The purchase arrives with a W3C `traceparent`. Each consumer applies its message in a span that
is the child of the message's trace context, and the follow-up events it writes to the outbox
carry that span's context; the relay publishes each in a span of its own (from the moment the
row fell due to the broker's confirm), the child of the consumer's and the parent of the next.
So every hop of the lifecycle (purchase -> queuing -> activate -> expiry timer -> expiring ->
all_expired) is a consumer span of the same trace, with the relay's publish span between two.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumers import publishing
from events.envelope import trace_id_of
from events.models import PurchasePackage
from events.routes import (
    ALL_EXPIRED,
    EXPIRY_DUE,
    PACKAGE_ACTIVATE,
    PACKAGE_EXPIRING,
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
)
from infra.rabbit.tap import Tap
from infra.settings import Settings
from infra.tracing import configure_tracing
from tests.support.deliveries import add_package
from tests.support.in_process import StartApp
from tests.support.observing import eventually

CHAIN = [
    PACKAGE_PURCHASE,
    PACKAGE_QUEUING,
    PACKAGE_ACTIVATE,
    EXPIRY_DUE,
    PACKAGE_EXPIRING,
    ALL_EXPIRED,
]
TRACE_ID = uuid4().hex
ROOT_SPAN = uuid4().hex[:16]


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    assert configure_tracing("test", extra=SimpleSpanProcessor(exporter)) is not None
    return exporter


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def hop(span: ReadableSpan) -> str:
    """`<route> process` (a consumer applying it) or `<route> publish` (the relay sending it)."""
    attributes = span.attributes or {}
    route = attributes.get("messaging.destination.name")
    return f"{route} {attributes.get('messaging.operation.type')}"


def all_of_trace(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [
        span
        for span in exporter.get_finished_spans()
        if (context := span.get_span_context()) is not None
        and f"{context.trace_id:032x}" == TRACE_ID
    ]


def of_trace(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    """This test's consumer spans by route (the first of each route)."""
    found: dict[str, ReadableSpan] = {}
    for span in all_of_trace(exporter):
        if hop(span).endswith(" process"):
            found.setdefault(hop(span).removesuffix(" process"), span)
    return found


async def test_one_purchases_trace_spans_every_hop_through_the_outbox_to_all_expired(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    tap: Tap,
    spans: InMemorySpanExporter,
) -> None:
    package = await add_package(pool, 10**9, duration=timedelta(seconds=1))
    user = uuid4()
    app = in_process(settings, pool, amqp)
    await app.start_consumers()
    await app.start_relay()
    await publishing.publish(
        settings,
        amqp,
        PACKAGE_PURCHASE,
        PurchasePackage(user_id=user, package_id=package),
        traceparent=f"00-{TRACE_ID}-{ROOT_SPAN}-01",
    )

    async def whole_chain_traced() -> bool:
        return set(of_trace(spans)) >= {r.name for r in CHAIN}

    await eventually(whole_chain_traced, within=30)
    await app.close()
    found = of_trace(spans)
    by_id = {span_id(span): span for span in all_of_trace(spans)}
    # Walk from the all_expired consumer's span to the root, parent by parent.
    path = []
    span: ReadableSpan | None = found[ALL_EXPIRED.name]
    while span is not None:
        path.append(hop(span))
        parent = span.parent.span_id if span.parent is not None else None
        if parent == int(ROOT_SPAN, 16):
            break
        assert parent in by_id, f"the parent of {path[-1]} is not a span of this trace"
        span = by_id[parent]
    assert path[0] == f"{ALL_EXPIRED.name} process"
    assert path[-1] == f"{PACKAGE_PURCHASE.name} process"  # its parent: the publisher's span
    # Between two consumers, the relay's span for publishing the follow-up from the outbox.
    for later, earlier in itertools.pairwise(path[:-1]):
        if later.endswith(" process"):
            assert earlier == later.replace(" process", " publish"), path
    assert f"{PACKAGE_QUEUING.name} process" in path
    assert f"{EXPIRY_DUE.name} publish" in path
    for route in CHAIN:  # every hop is a span of the trace, under a span of the trace
        above = found[route.name].parent
        assert above is not None
        assert above.span_id in by_id or above.span_id == int(ROOT_SPAN, 16)

    # What travelled: the outbox rows and the published all_expired event carry the trace.
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT route, headers->>'traceparent' AS tp FROM telecom.outbox WHERE user_id = $1",
            user,
        )
    assert {r["route"] for r in rows} >= {r.name for r in CHAIN[1:]}
    assert {trace_id_of(r["tp"]) for r in rows} == {TRACE_ID}
    (ended,) = [t for t in tap.on(ALL_EXPIRED.name) if t.json()["user_id"] == str(user)]
    assert trace_id_of(str(ended.headers["traceparent"])) == TRACE_ID
