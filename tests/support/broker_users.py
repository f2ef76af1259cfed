"""RabbitMQ users for tests of the trust boundary: created under unique names through the
broker's management API (as rabbitmqctl would, without starting an Erlang VM per call: about a
second of CPU each), with a role's permissions from the definitions, and deleted afterwards;
and the removal of everything a test declared under its namespace."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from uuid import UUID, uuid4

import aio_pika
import httpx
from aio_pika.abc import AbstractRobustConnection
from yarl import URL

from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION
from events.routes import Route
from infra.rabbit.connection import connect
from infra.rabbit.roles import RoleUsers, role_definitions
from infra.settings import Settings

MANAGEMENT = URL(os.environ.get("PKGQ_TEST_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672/"))
"""The management API, as the broker's administrator (guest on a dev box)."""
VHOST = quote("/", safe="")


async def admin(method: str, path: str, body: Any = None) -> Any:
    """One call to the management API (`path` below /api/); its JSON answer, if any."""
    async with _client() as client:
        return await _call(client, method, path, body)


def _client() -> httpx.AsyncClient:
    auth = (MANAGEMENT.user or "", MANAGEMENT.password or "")
    return httpx.AsyncClient(
        auth=auth, timeout=30, base_url=str(MANAGEMENT.with_user(None) / "api")
    )


async def _call(client: httpx.AsyncClient, method: str, path: str, body: Any = None) -> Any:
    answer = await client.request(method, "/" + path, json=body)
    answer.raise_for_status()
    return answer.json() if answer.content else None


def _user(name: str) -> str:
    return quote(name, safe="")


async def add_user(name: str, password: str, tags: str = "") -> None:
    await admin("PUT", f"users/{_user(name)}", {"password": password, "tags": tags})


async def delete_user(name: str) -> None:
    await admin("DELETE", f"users/{_user(name)}")


async def change_password(name: str, password: str) -> None:
    """A new password; the user keeps its tags."""
    found = await admin("GET", f"users/{_user(name)}")
    tags = found["tags"]
    tags = ",".join(tags) if isinstance(tags, list) else tags
    await add_user(name, password, tags)


async def set_permissions(name: str, configure: str, write: str, read: str) -> None:
    body = {"configure": configure, "write": write, "read": read}
    await admin("PUT", f"permissions/{VHOST}/{_user(name)}", body)


async def set_topic_permissions(name: str, exchange: str, write: str, read: str) -> None:
    body = {"exchange": exchange, "write": write, "read": read}
    await admin("PUT", f"topic-permissions/{VHOST}/{_user(name)}", body)


async def import_definitions(document: dict[str, Any]) -> None:
    await admin("POST", "definitions", document)


def unique_role_users() -> RoleUsers:
    tag = uuid4().hex[:10]
    return RoleUsers(
        runtime=f"pkgq-t-{tag}-runtime",
        publisher=f"pkgq-t-{tag}-publisher",
        operator=f"pkgq-t-{tag}-operator",
        autoscaler=f"pkgq-t-{tag}-autoscaler",
    )


def url_for(settings: Settings, user: str, password: str) -> str:
    """The test's AMQP URL with another user's credentials."""
    return str(URL(settings.amqp_url).with_user(user).with_password(password))


async def grant(settings: Settings, users: RoleUsers, name: str) -> None:
    """Give `name` the permissions and topic permissions the definitions give it."""
    roles: dict[str, Any] = role_definitions(settings, "/", users)
    for entry in roles["permissions"]:
        if entry["user"] == name:
            await set_permissions(name, entry["configure"], entry["write"], entry["read"])
    for entry in roles["topic_permissions"]:
        if entry["user"] == name:
            await set_topic_permissions(name, entry["exchange"], entry["write"], entry["read"])


@dataclass
class Publisher:
    name: str
    connection: AbstractRobustConnection

    async def publish(
        self,
        settings: Settings,
        route: Route,
        body: bytes,
        message_id: UUID,
        *,
        headers: dict[str, Any] | None = None,
        content_type: str = CONTENT_TYPE,
        version: int | None = None,
    ) -> None:
        """Publish as this broker user (its own name in `user_id`, which the broker checks),
        with a confirm."""
        channel = await self.connection.channel(publisher_confirms=True)
        try:
            exchange = await channel.get_exchange(settings.exchange, ensure=False)
            await exchange.publish(
                aio_pika.Message(
                    body,
                    message_id=str(message_id),
                    type=route.message_type,
                    content_type=content_type,
                    user_id=self.name,
                    headers={
                        H_SCHEMA_VERSION: version or route.schema_version,
                        **(headers or {}),
                    },
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                route.name,
                mandatory=True,
            )
        finally:
            await channel.close()


@contextlib.asynccontextmanager
async def publisher_connection(settings: Settings, what: str) -> AsyncIterator[Publisher]:
    """A connection as a broker user of its own, made for the test with the definitions'
    publisher role and nothing more (an outsider, or an honest shop)."""
    users = unique_role_users()
    async with broker_user(users.publisher) as password:
        await grant(settings, users, users.publisher)
        url = url_for(settings, users.publisher, password)
        connection = await connect(url, f"pkgq-test-{what}")
        try:
            yield Publisher(users.publisher, connection)
        finally:
            await connection.close()


@contextlib.asynccontextmanager
async def broker_user(name: str, tags: str = "") -> AsyncIterator[str]:
    """A user `name` with a fresh password (yielded) and no permissions yet; deleted after."""
    password = uuid4().hex
    await add_user(name, password, tags)
    try:
        yield password
    finally:
        await delete_user(name)


async def named(
    client: httpx.AsyncClient, kind: str, pattern: str, columns: str
) -> list[dict[str, Any]]:
    """Every queue or exchange (`kind`) of vhost / whose name matches the regex `pattern`,
    with `columns`. The API filters by name only when it pages (at most 500 a page)."""
    items: list[dict[str, Any]] = []
    page, pages = 1, 1
    while page <= pages:
        found = await _call(
            client,
            "GET",
            f"{kind}/{VHOST}?page={page}&page_size=500&use_regex=true"
            f"&name={quote(pattern, safe='')}&columns={columns}",
        )
        items += found["items"]
        page, pages = page + 1, found["page_count"]
    return items


async def delete_namespaces(namespaces: set[str]) -> int:
    """Delete every queue and exchange named `<namespace>.…` for these namespaces: what the
    tests declared under a queue prefix or partition count they switched to, which a test's
    own clean-up by its settings' names misses. One listing per kind, one client for every call
    (a client costs tens of milliseconds of CPU). Returns how many it deleted."""
    deleted = 0
    async with _client() as client:
        for kind in ("queues", "exchanges"):
            names = [item["name"] for item in await named(client, kind, "^pkgq_t_", "name")]
            for name in names:
                if name.partition(".")[0] not in namespaces:
                    continue  # another session's, or another worker's
                try:
                    await _call(client, "DELETE", f"{kind}/{VHOST}/{_user(name)}")
                except httpx.HTTPStatusError as gone:  # an auto-delete queue may go first
                    if gone.response.status_code != 404:
                        raise
                deleted += 1
    return deleted
