"""Closing a client's connection from the broker's side, as an operator or a network
partition would: through the management API (no `rabbitmqctl`, whose Erlang VM costs about a
second of CPU to start)."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.parse
import urllib.request
from typing import Any

from infra.rabbit.management import management_base
from infra.settings import Settings
from tests.support.observing import eventually


def _call(settings: Settings, method: str, path: str) -> Any:
    base, user, password = management_base(settings)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(f"{base}{path}", method=method)  # noqa: S310
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
        body = response.read()
    return json.loads(body) if body else None


def connections_named(settings: Settings, name: str) -> list[str]:
    """The broker's names of the connections with this client name (the management API lists
    a new connection a moment after it opens: none yet is possible)."""
    listed = _call(settings, "GET", "/api/connections?columns=name,client_properties")
    return [
        c["name"] for c in listed if c.get("client_properties", {}).get("connection_name") == name
    ]


def close_connections_named(settings: Settings, name: str) -> int:
    """Close the connections with this client name. Returns how many were closed."""
    names = connections_named(settings, name)
    for broker_name in names:
        _call(settings, "DELETE", f"/api/connections/{urllib.parse.quote(broker_name, safe='')}")
    return len(names)


async def listed(settings: Settings, name: str) -> None:
    """Until the management API lists the one connection with this client name (so that a
    test can then close it at the moment it chooses)."""

    async def one() -> bool:
        return len(await asyncio.to_thread(connections_named, settings, name)) == 1

    await eventually(one)


async def close_connection(settings: Settings, name: str) -> None:
    """Close the one connection with this client name, once the management API lists it."""

    async def closed() -> bool:
        return await asyncio.to_thread(close_connections_named, settings, name) == 1

    await eventually(closed)
