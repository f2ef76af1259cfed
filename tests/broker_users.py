"""RabbitMQ users for tests of the trust boundary: created with rabbitmqctl under unique names,
with a role's permissions from the definitions, and deleted afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from typing import Any
from uuid import uuid4

from yarl import URL

from infra.rabbit.roles import RoleUsers, role_definitions
from infra.settings import Settings


async def rabbitmqctl(*args: str) -> None:
    await asyncio.to_thread(
        subprocess.run, ["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60
    )


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
            await rabbitmqctl(
                "set_permissions", "-p", "/", name,
                entry["configure"], entry["write"], entry["read"],
            )  # fmt: skip
    for entry in roles["topic_permissions"]:
        if entry["user"] == name:
            await rabbitmqctl(
                "set_topic_permissions", "-p", "/", name,
                entry["exchange"], entry["write"], entry["read"],
            )  # fmt: skip


@contextlib.asynccontextmanager
async def broker_user(name: str) -> AsyncIterator[str]:
    """A user `name` with a fresh password (yielded) and no permissions yet; deleted after."""
    password = uuid4().hex
    await rabbitmqctl("add_user", name, password)
    try:
        yield password
    finally:
        await rabbitmqctl("delete_user", name)
