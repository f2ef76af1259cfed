"""Who consumes each partition queue, as the broker says (its management API): the active
consumer of a single-active-consumer queue and the ones waiting, by the `pkgq` process they
belong to (the connection's client-provided name, `pkgq-run@host:pid`)."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import quote, unquote, urlsplit

from infra.rabbit.management import management_base
from infra.settings import Settings


@dataclass
class QueueConsumers:
    active: list[str] = field(default_factory=list)
    """The pids of the processes whose consumer is active (exactly one when all is well)."""
    waiting: list[str] = field(default_factory=list)
    """The pids of the processes whose consumer stands by."""


def _get(settings: Settings, path: str) -> list[dict[str, object]]:
    base, user, password = management_base(settings)
    request = urllib.request.Request(f"{base}{path}")  # noqa: S310  (the test's broker)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        found = json.loads(response.read())
    return found if isinstance(found, list) else []


def _consumers_now(settings: Settings, queues: list[str]) -> dict[str, QueueConsumers]:
    path = urlsplit(settings.amqp_urls[0]).path
    vhost = quote(unquote(path[1:]) if len(path) > 1 else "/", safe="")
    pids: dict[str, str] = {}
    """Connection name (host:port -> host:port) -> the pid in its client-provided name."""
    for connection in _get(settings, f"/api/vhosts/{vhost}/connections"):
        properties = connection.get("client_properties")
        named = properties.get("connection_name") if isinstance(properties, dict) else None
        if isinstance(named, str) and ":" in named:
            pids[str(connection.get("name"))] = named.rsplit(":", 1)[-1]
    found = {queue: QueueConsumers() for queue in queues}
    for consumer in _get(settings, f"/api/consumers/{vhost}"):
        queue = consumer.get("queue")
        channel = consumer.get("channel_details")
        if not isinstance(queue, dict) or not isinstance(channel, dict):
            continue
        name = queue.get("name")
        if name not in found:
            continue
        pid = pids.get(str(channel.get("connection_name")), "?")
        if consumer.get("active") and consumer.get("activity_status") != "waiting":
            found[str(name)].active.append(pid)
        else:
            found[str(name)].waiting.append(pid)
    return found


async def partition_consumers(settings: Settings, queues: list[str]) -> dict[str, QueueConsumers]:
    """Each queue's active and waiting consumers, by process id."""
    return await asyncio.to_thread(_consumers_now, settings, queues)
