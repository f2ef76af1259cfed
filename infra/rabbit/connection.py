"""Robust AMQP connections that reconnect (and re-declare) after a broker restart, and move to
another node of a cluster when theirs goes away."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
from collections.abc import Sequence
from typing import Any

import aio_pika
import structlog
from aio_pika import RobustConnection
from aio_pika.abc import AbstractRobustConnection
from aiormq.connection import TCPTransportFactory, TLSTransportFactory, TransportFactory
from aiormq.exceptions import AMQPConnectionError
from yarl import URL

from infra.dependencies import RABBITMQ, dependencies
from infra.rabbit import wire
from infra.settings import Settings, mask_url, split_urls
from infra.sockets import DEFAULT_DEAD_PEER_TIMEOUT_S, tune_transport
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


log = structlog.get_logger(__name__)

CONNECT_TIMEOUT = 5.0
"""Seconds one attempt to reach a node may take (a partitioned or frozen node may accept TCP
and then say nothing): the attempt fails and the next one goes to the next node."""
TCP_CONNECT_TIMEOUT = 1.5
"""Seconds the TCP handshake of one attempt may take: past the SYN sent again after 1 s, well
before the one after 3 s. A network that comes back during an attempt is then seen by the
next attempt (RECONNECT_INTERVAL later) rather than by a SYN three seconds on."""
RECONNECT_INTERVAL = 0.5
"""aio-pika's pause between attempts to reconnect a lost connection."""
PROBE_INTERVAL = 0.5
"""While disconnected, how often the nodes are probed (a TCP connect) for a live one."""


def heartbeat_for(dead_peer_timeout: float) -> int:
    """The AMQP heartbeat (whole seconds) asked of the broker: half the dead-peer bound, at
    least 2. A heartbeat frame goes each way every half of it, so there is always data for
    TCP_USER_TIMEOUT to time; and the broker closes its side of a connection that went silent
    after about two heartbeats, so within the bound too: until it does, it keeps that dead
    connection's unacknowledged deliveries, which a reconnected consumer would wait for after a
    fault of about the bound's length."""
    return max(2, round(dead_peer_timeout / 2))


def with_heartbeat(url: URL, dead_peer_timeout: float) -> URL:
    """`url` asking for heartbeat_for(dead_peer_timeout), unless it sets `heartbeat` itself."""
    if "heartbeat" in url.query:
        return url
    return url.update_query(heartbeat=str(heartbeat_for(dead_peer_timeout)))


class DeadPeerTransports(TransportFactory):
    """aiormq's transports (TLS for `amqps://`) with the TCP handshake bounded by
    TCP_CONNECT_TIMEOUT and the socket set to find a dead peer (infra/sockets.py)."""

    def __init__(self, dead_peer_timeout: float) -> None:
        self._timeout = dead_peer_timeout
        self._tcp = TCPTransportFactory()
        self._tls = TLSTransportFactory()
        self.socket: Any = None
        """The socket of the latest connection made (what `pkgq` tests inspect)."""

    async def create(
        self, url: URL, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        inner = self._tls if url.scheme.lower() == "amqps" else self._tcp
        try:
            async with asyncio.timeout(TCP_CONNECT_TIMEOUT):
                reader, writer = await inner.create(url, **kwargs)
        except TimeoutError as exc:  # what aio-pika's reconnect loop counts as unreachable
            raise AMQPConnectionError(f"no answer from {url.host}:{url.port}") from exc
        tune_transport(writer.transport, self._timeout)
        self.socket = writer.transport.get_extra_info("socket")
        return reader, writer


class NodeListConnection(RobustConnection):
    """A robust connection over the nodes of a cluster. It connects to one node; when that
    connection closes, or an attempt to reconnect fails, it tries the next one, and while it
    is disconnected it probes every node (a TCP connect, PROBE_INTERVAL apart) and aims its
    next attempt at the first that answers. aio-pika's own recovery then reopens the channels
    and consumers on the new node, as after a restart of a single broker."""

    def __init__(
        self,
        url: URL,
        *args: Any,
        nodes: Sequence[str] = (),
        dead_peer_timeout: float = DEFAULT_DEAD_PEER_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        self._heartbeat_added = "heartbeat" not in URL(url).query
        url = with_heartbeat(URL(url), dead_peer_timeout)
        super().__init__(url, *args, **kwargs)
        # aio-pika keeps only the keyword arguments it knows; aiormq takes this one.
        self.kwargs["transport_factory"] = DeadPeerTransports(dead_peer_timeout)
        self._nodes = [with_heartbeat(URL(n), dead_peer_timeout) for n in nodes] or [url]
        self._seeking: asyncio.Task[None] | None = None
        self._was_connected = False

    @property
    def node(self) -> str:
        """The node it is connected to (or trying next), password masked, as configured (the
        heartbeat this module asks for left out)."""
        url = self.url
        if self._heartbeat_added:
            url = url.with_query({k: v for k, v in url.query.items() if k != "heartbeat"})
        return mask_url(str(url))

    async def _on_connected(self) -> None:
        await super()._on_connected()
        self._was_connected = True
        dependencies().up(RABBITMQ)

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        if not self._close_called:
            dependencies().down(
                RABBITMQ, _reason(closing), f"reconnecting every {RECONNECT_INTERVAL:g} s"
            )
        if not self._close_called and self._was_connected and len(self._nodes) > 1:
            lost = self.node
            self.url = self._after(self.url)
            log.warning("amqp_node_lost", node=lost, next=self.node)
            if self._seeking is None or self._seeking.done():
                self._seeking = asyncio.create_task(self._seek(), name="amqp-seek-node")
        await super()._on_connection_close(closing)

    def _after(self, current: URL) -> URL:
        index = next((i for i, n in enumerate(self._nodes) if n == current), -1)
        return self._nodes[(index + 1) % len(self._nodes)]

    async def _seek(self) -> None:
        """Until connected again: aim the next attempt at a node that accepts connections."""
        while not self.connected.is_set() and not self._close_called:
            candidates = [self.url, *(n for n in self._nodes if n != self.url)]
            for node in candidates:
                if await _accepts(node):
                    if node != self.url:
                        log.info("amqp_node_chosen", node=mask_url(str(node)))
                        self.url = node
                    break
            else:
                self.url = self._after(self.url)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.connected.wait(), timeout=PROBE_INTERVAL)
        if self.connected.is_set():
            log.info("amqp_node_connected", node=self.node)

    async def close(self, exc: Any = aio_pika.exceptions.ConnectionClosed) -> None:
        if self._seeking is not None:
            self._seeking.cancel()
        await super().close(exc)


async def reconnect(connection: AbstractRobustConnection) -> None:
    """Drop the connection's transport, as a lost node would, so that it connects again (to
    the next node of its list, or through the load balancer) and restores its channels; return
    once it is connected (callers bound the wait)."""
    transport = connection.transport
    if transport is not None and not transport.connection.is_closed:
        connection.connected.clear()
        await transport.connection.close(ConnectionResetError("pkgq replaced this connection"))
    await connection.connected.wait()


def _reason(closing: asyncio.Future[Any]) -> str:
    """Why a connection closed, as one line without object addresses."""
    if not closing.done() or closing.cancelled():
        return "connection closed"
    exc = closing.exception()
    return "connection closed" if exc is None else f"{type(exc).__name__}: {exc}"


async def _accepts(node: URL) -> bool:
    """Whether the node accepts a TCP connection within a second (AMQP is not spoken)."""
    port = node.port or (5671 if node.scheme.lower() == "amqps" else 5672)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(node.host or "127.0.0.1", port), timeout=1.0
        )
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def open_amqp(settings: Settings, name: str) -> AbstractRobustConnection:
    """A robust connection to the settings' broker (any live node of PKGQ_AMQP_URL's list),
    over TLS for an `amqps://` URL."""
    return await connect(
        settings.amqp_url,
        name,
        tls_context(settings),
        settings.amqp_ca_file,
        dead_peer_timeout=settings.dead_peer_timeout,
        accelerate=settings.wire_accelerator,
    )


async def connect(
    url: str,
    name: str,
    context: ssl.SSLContext | None = None,
    ca_file: str | None = None,
    *,
    dead_peer_timeout: float = DEFAULT_DEAD_PEER_TIMEOUT_S,
    accelerate: bool = True,
) -> AbstractRobustConnection:
    """A robust connection named `name` (shown by the broker). `url` may list several nodes,
    comma-separated: they are tried in order and the first that accepts wins (NodeListConnection
    moves on to the others later). An `amqps://` URL always verifies the broker: with `context`
    if given (`ca_file` is what it trusts, for the error message), else against the system's
    CAs. A certificate that is not accepted raises TlsVerifyError, whose text says in one line
    what to check. `dead_peer_timeout`: PKGQ_DEAD_PEER_TIMEOUT (the heartbeat it asks for, and
    DeadPeerTransports). `accelerate`: PKGQ_WIRE_ACCELERATOR (infra/rabbit/wire/: the first
    connection of a process decides for it)."""
    allow_deep_headers()
    wire.install(accelerate)
    nodes = split_urls(url)
    parsed = URL(nodes[0])
    if parsed.scheme.lower() == "amqps" and context is None:
        context = amqp_context(None, None, None)
    failure: Exception | None = None
    for node in nodes:
        connection = NodeListConnection(
            URL(node),
            nodes=nodes,
            ssl_context=context,
            client_properties={"connection_name": name},
            reconnect_interval=RECONNECT_INTERVAL,
            dead_peer_timeout=dead_peer_timeout,
        )
        try:
            await connection.connect(timeout=CONNECT_TIMEOUT)
        except Exception as exc:  # noqa: BLE001  (the next node may answer; the last error is raised)
            failure = exc
            with contextlib.suppress(Exception):
                await connection.close()
            if len(nodes) > 1:
                log.warning("amqp_node_unavailable", node=mask_url(node), error=repr(exc))
        else:
            return connection
    assert failure is not None
    target = TlsTarget("RabbitMQ", f"{parsed.host}:{parsed.port}", ca_file, "PKGQ_AMQP_CA_FILE")
    problem = explain(failure, target) if context is not None else None
    if problem is None:
        raise failure
    raise TlsVerifyError(problem) from failure
