"""Queue figures from the broker: the management API (the plugin ships with the server), and
what plain AMQP can tell (ready messages and consumers, by passive declares).

AMQP tells a client only a queue's ready count; how many deliveries consumers hold unacknowledged
(the job queue's "taken") is known to the broker's management API. Unreachable or disabled: None,
and callers show the figure as unknown.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import structlog
from aio_pika.abc import AbstractConnection
from aiormq.exceptions import ChannelNotFoundEntity

from infra.rabbit.connection import open_amqp
from infra.rabbit.topology import route_queues
from infra.settings import Settings
from infra.tls import TlsTarget, amqp_context, explain

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class QueueFigures:
    ready: int
    unacked: int
    consumers: int


def management_base(settings: Settings) -> tuple[str, str, str]:
    """(base URL, user, password): PKGQ_MANAGEMENT_URL, or the AMQP host with the AMQP
    credentials, on port 15672 (http) or, when the AMQP URL is `amqps://`, on 15671 (https,
    verified as the AMQP connection is: docs/how-to/tls.md)."""
    amqp = urlsplit(settings.amqp_urls[0])
    if settings.management_url:
        base = urlsplit(settings.management_url)
        user = unquote(base.username or amqp.username or "guest")
        password = unquote(base.password or amqp.password or "guest")
        netloc = base.hostname or "127.0.0.1"
        if base.port:
            netloc = f"{netloc}:{base.port}"
        return f"{base.scheme or 'http'}://{netloc}{base.path.rstrip('/')}", user, password
    host = amqp.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return (
        f"https://{host}:15671" if settings.amqp_tls else f"http://{host}:15672",
        unquote(amqp.username or "guest"),
        unquote(amqp.password or "guest"),
    )


def _vhost(settings: Settings) -> str:
    path = urlsplit(settings.amqp_urls[0]).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def management_context(settings: Settings, url: str) -> ssl.SSLContext | None:
    """For an https management URL: the AMQP connection's CA and client certificate (the
    system's CAs if none is set). Verification is always on."""
    if urlsplit(url).scheme.lower() != "https":
        return None
    return amqp_context(settings.amqp_ca_file, settings.amqp_cert_file, settings.amqp_key_file)


def _fetch(
    url: str, user: str, password: str, timeout: float, context: ssl.SSLContext | None = None
) -> object:
    request = urllib.request.Request(url)  # noqa: S310  (an http(s) URL from settings)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # noqa: S310
        return json.loads(response.read())


COLUMNS = "name,messages_ready,messages_unacknowledged,consumers"


async def queue_figures(
    settings: Settings, names: list[str], wait_s: float = 3.0
) -> dict[str, QueueFigures] | None:
    """Figures of the named queues that exist (None: the management API is not reachable)."""
    base, user, password = management_base(settings)
    url = f"{base}/api/queues/{quote(_vhost(settings), safe='')}?columns={COLUMNS}"
    try:
        rows = await asyncio.to_thread(
            _fetch, url, user, password, wait_s, management_context(settings, url)
        )
    except (OSError, urllib.error.URLError, ValueError) as exc:
        problem = explain(
            exc,
            TlsTarget(
                "the RabbitMQ management API",
                urlsplit(base).netloc,
                settings.amqp_ca_file,
                "PKGQ_AMQP_CA_FILE",
            ),
        )
        if problem is not None:
            log.warning("management_api_tls_failed", error=problem)
        return None
    wanted = set(names)
    found: dict[str, QueueFigures] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("name") in wanted:
            found[row["name"]] = QueueFigures(
                int(row.get("messages_ready") or 0),
                int(row.get("messages_unacknowledged") or 0),
                int(row.get("consumers") or 0),
            )
    return found


async def passive_figures(
    connection: AbstractConnection, names: list[str]
) -> dict[str, tuple[int, int] | None]:
    """(ready messages, consumers) of each named queue by passive declares on one channel of
    `connection` (None: the queue does not exist). Needs no permission on the queues."""
    found: dict[str, tuple[int, int] | None] = {}
    channel = await connection.channel()
    try:
        for name in names:
            try:
                queue = await channel.declare_queue(name, passive=True)
            except ChannelNotFoundEntity:
                found[name] = None
                await channel.reopen()  # a failed passive declare closes the channel
                continue
            result = queue.declaration_result
            found[name] = (result.message_count or 0, result.consumer_count or 0)
    finally:
        if not channel.is_closed:
            await channel.close()
    return found


async def queue_depths(settings: Settings, route: str) -> list[dict[str, Any]]:
    """Ready messages and consumers of each of the route's queues (as configured here)."""
    connection = await open_amqp(settings, "pkgq-partitions")
    found: list[dict[str, Any]] = []
    try:
        for name, key in route_queues(settings, route):
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                result = queue.declaration_result
                found.append(
                    {
                        "queue": name,
                        "binding": key,
                        "ready": result.message_count,
                        "consumers": result.consumer_count,
                    }
                )
            except ChannelNotFoundEntity:
                found.append({"queue": name, "binding": key, "ready": None, "consumers": None})
            finally:
                if not channel.is_closed:
                    await channel.close()
    finally:
        await connection.close()
    return found
