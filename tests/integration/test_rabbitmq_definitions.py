"""deploy/rabbitmq/definitions.json is the topology the processes declare, and stays so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import ChannelAccessRefused, ChannelNotFoundEntity

from events.models import PurchasePackage
from events.routes import ALL_ROUTES, PACKAGE_PURCHASE
from infra.postgres import access
from infra.rabbit.connection import connect
from infra.rabbit.roles import RoleUsers
from infra.rabbit.topology import TopologyMissingError, declare_all, definitions, route_queues
from infra.settings import Settings
from tests.support.broker_users import (
    change_password,
    delete_user,
    import_definitions,
    unique_role_users,
    url_for,
)
from tests.support.deliveries import add_package, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually
from tests.support.processes import cli

COMMITTED = Path(__file__).resolve().parents[2] / "deploy" / "rabbitmq" / "definitions.json"


def test_the_committed_definitions_are_what_the_code_declares_with_default_settings() -> None:
    current = definitions(Settings(exchange="telecom", queue_prefix="pkgq", partitions={}))
    committed = json.loads(COMMITTED.read_text())
    assert committed == current, (
        "deploy/rabbitmq/definitions.json is stale: regenerate it with "
        "`pkgq definitions > deploy/rabbitmq/definitions.json`"
    )


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_broker_provisioned_from_the_definitions_accepts_every_process_declaration(
    settings: Settings, amqp: AbstractRobustConnection, queue_type: str
) -> None:
    # The test's own names (and users), provisioned the way an operator would, then declared
    # the way every pkgq process does at start-up: any argument that differs fails with
    # PRECONDITION_FAILED. "quorum": the replicated profile, every queue a quorum queue.
    parted = settings.model_copy(
        update={
            "queue_prefix": settings.queue_prefix + ".prov",
            "partitions": {},
            "queue_type": queue_type,
        }
    )
    users = unique_role_users()
    document = definitions(parted, users=users)
    try:
        await import_definitions(document)
        connection = await connect(parted.amqp_url, "pkgq-test-definitions")
        try:
            await eventually(lambda: provisioned(connection, document), within=30)
            channel = await connection.channel()
            await declare_all(channel, parted)  # raises TopologyMismatchError on any drift
        finally:
            await connection.close()
    finally:
        await delete_provisioned(parted, users)


async def test_the_runtime_user_runs_pkgq_without_configure_permission_on_a_provisioned_broker(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool
) -> None:
    parted = settings.model_copy(
        update={"queue_prefix": settings.queue_prefix + ".prov", "partitions": {}}
    )
    users = unique_role_users()
    document = definitions(parted, users=users)
    try:
        await import_definitions(document)
        password = uuid4().hex  # the definitions carry no passwords: the operator sets them
        await change_password(users.runtime, password)
        runtime = parted.model_copy(
            update={
                "amqp_url": url_for(parted, users.runtime, password),
                "declare_topology": False,
            }
        )
        connection = await connect(runtime.amqp_url, "pkgq-test-runtime")
        try:
            await eventually(lambda: provisioned(connection, document), within=30)
            # Declaring is configuring: refused to the runtime user, so pkgq must not do it.
            with pytest.raises(ChannelAccessRefused):
                await declare_all(await connection.channel(), parted)
            app = in_process(runtime, pool, connection)
            await app.start_consumers()
            await app.start_relay()
            package = await add_package(pool, 1000)
            user = uuid4()
            await send(
                runtime,
                connection,
                PACKAGE_PURCHASE,
                PurchasePackage(user_id=user, package_id=package),
            )

            async def granted() -> bool:
                async with pool.acquire() as conn:
                    row = await access.get_access(conn, user)
                return row is not None and bool(row["granted"])

            await eventually(granted)  # purchase, queuing and activate, as the runtime user
            await app.close()
        finally:
            await connection.close()
    finally:
        await delete_provisioned(parted, users)


async def provisioned(connection: AbstractRobustConnection, document: dict[str, Any]) -> bool:
    """Whether every queue of the document exists (the import finishes asynchronously)."""
    probe = await connection.channel()
    try:
        for queue in document["queues"]:
            await probe.declare_queue(queue["name"], passive=True)
    except ChannelNotFoundEntity:
        return False
    finally:
        if not probe.is_closed:
            await probe.close()
    return True


async def delete_provisioned(settings: Settings, users: RoleUsers) -> None:
    connection = await connect(settings.amqp_url, "pkgq-test-definitions-cleanup")
    try:
        channel = await connection.channel()
        for name, _ in [
            q for route in ALL_ROUTES.values() for q in route_queues(settings, route.name)
        ]:
            await channel.queue_delete(name)
        await channel.queue_delete(settings.dead_letter_queue)
    finally:
        await connection.close()
    for user in (users.runtime, users.publisher, users.operator, users.autoscaler):
        await delete_user(user)


async def test_pkgq_definitions_lists_the_roles_without_passwords_and_no_users_leaves_them_out(
    settings: Settings,
) -> None:
    full = await cli(settings, "definitions")
    topology = await cli(settings, "definitions", "--no-users")
    assert (full.returncode, topology.returncode) == (0, 0), full.stderr + topology.stderr
    users = json.loads(full.stdout)["users"]
    assert [u["name"] for u in users] == [
        "pkgq",
        "pkgq-publisher",
        "pkgq-operator",
        "pkgq-autoscaler",
    ]
    assert not any("password" in key for user in users for key in user)
    assert json.loads(topology.stdout) == definitions(settings, users=None)


async def test_without_declaring_a_missing_topology_is_reported_with_how_to_provision_it(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    missing = settings.model_copy(
        update={"exchange": settings.exchange + ".absent", "declare_topology": False}
    )
    with pytest.raises(TopologyMissingError, match="import_definitions"):
        await declare_all(await amqp.channel(), missing)


async def test_the_operator_may_declare_and_bind_the_whole_topology_and_its_alternate_exchange(
    settings: Settings,
) -> None:
    ours = settings.model_copy(
        update={
            "exchange": settings.exchange + ".op",
            "queue_prefix": settings.queue_prefix + ".op",
            "partitions": {},
        }
    )
    users = unique_role_users()
    document = definitions(ours, users=users)
    try:
        await import_definitions(document)
        password = uuid4().hex
        await change_password(users.operator, password)
        operator = await connect(url_for(ours, users.operator, password), "pkgq-test-operator")
        try:
            await eventually(lambda: provisioned(operator, document), within=30)
            # Declaring is configuring, binding is write on the queue and read on the
            # exchange: every one of them, the alternate exchange's included, is allowed.
            await declare_all(await operator.channel(), ours)
        finally:
            await operator.close()
    finally:
        await delete_provisioned(ours, users)
        connection = await connect(ours.amqp_url, "pkgq-test-operator-cleanup")
        try:
            channel = await connection.channel()
            await channel.queue_delete(ours.dead_letter_queue)
            for name in (ours.exchange, ours.dlx, ours.unroutable_exchange):
                await channel.exchange_delete(name)
        finally:
            await connection.close()
