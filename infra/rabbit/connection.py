"""Robust AMQP connections that reconnect (and re-declare) after a broker restart."""

from __future__ import annotations

import ssl
import sys

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from yarl import URL

from infra.settings import Settings
from infra.tls import TlsTarget, TlsVerifyError, amqp_context, explain

DEEPEST_HEADERS = 70_000
"""Python frames pamqp may need to decode one content header: it recurses twice per level of
nesting, and a header frame (at most 128 KiB, RabbitMQ's frame_max) holds up to ~26,000 nested
arrays of 5 bytes each. At Python's default limit of 1000, a publisher's 600-deep header table
raises RecursionError in the frame reader, which kills the connection, and the broker delivers
the same message again on the next one, for ever. pamqp's recursion is Python calling Python,
which since 3.11 takes no C stack; pkgq's own handling of header values is bounded in depth
(events.envelope.jsonable) before anything recursive in C (repr, json) sees them."""


def allow_deep_headers() -> None:
    """Let pamqp decode any header an AMQP frame can hold (see DEEPEST_HEADERS)."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), DEEPEST_HEADERS))


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of the settings' AMQP URL (None for plain `amqp://`): verifying the
    broker against PKGQ_AMQP_CA_FILE, with the client certificate if one is set."""
    if not settings.amqp_tls:
        return None
    return amqp_context(settings.amqp_ca_file, settings.amqp_cert_file, settings.amqp_key_file)


async def open_amqp(settings: Settings, name: str) -> AbstractRobustConnection:
    """A robust connection to the settings' broker, over TLS for an `amqps://` URL."""
    return await connect(settings.amqp_url, name, tls_context(settings), settings.amqp_ca_file)


async def connect(
    url: str, name: str, context: ssl.SSLContext | None = None, ca_file: str | None = None
) -> AbstractRobustConnection:
    """A robust connection named `name` (shown by the broker). An `amqps://` URL always
    verifies the broker: with `context` if given (`ca_file` is what it trusts, for the error
    message), else against the system's CAs. A certificate that is not accepted raises
    TlsVerifyError, whose text says in one line what to check."""
    allow_deep_headers()
    parsed = URL(url)
    if parsed.scheme.lower() == "amqps" and context is None:
        context = amqp_context(None, None, None)
    try:
        return await aio_pika.connect_robust(
            url,
            client_properties={"connection_name": name},
            reconnect_interval=1.0,
            ssl_context=context,
        )
    except Exception as exc:
        target = TlsTarget("RabbitMQ", f"{parsed.host}:{parsed.port}", ca_file, "PKGQ_AMQP_CA_FILE")
        problem = explain(exc, target) if context is not None else None
        if problem is None:
            raise
        raise TlsVerifyError(problem) from exc
