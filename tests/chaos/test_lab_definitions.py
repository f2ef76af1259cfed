"""The replicated profile's definitions (`pkgq definitions --queue-type quorum`) import into the
lab's 3-node cluster, every queue comes out replicated on all three nodes, and pkgq declares
over them from any node without a mismatch."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest

from infra.rabbit.connection import connect
from infra.rabbit.topology import declare_all
from infra.settings import Settings
from tests.support.ha_lab import Lab, listed
from tests.support.processes import cli

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


async def test_the_quorum_definitions_import_into_the_cluster_and_every_node_declares_over_them(
    the_lab: Lab, namespace: str
) -> None:
    settings = Settings(
        amqp_url=the_lab.amqp_nodes,
        exchange=f"{namespace}.telecom",
        queue_prefix=f"{namespace}.pkgq",
        queue_type="quorum",
    )
    printed = await cli(settings, "definitions", "--queue-type", "quorum", "--no-users")
    assert printed.returncode == 0, printed.stderr
    document: dict[str, Any] = json.loads(printed.stdout)
    names = {q["name"] for q in document["queues"]}
    assert settings.dead_letter_queue in names
    async with the_lab.client() as client:
        imported = await client.post("/definitions", json=document)
        assert imported.status_code in (200, 201, 204), imported.text
        found = await listed(client, "queues", f"{namespace}.", "name,type,members,arguments")
    queues = {q["name"]: q for q in found}
    assert set(queues) == names
    for name, queue in queues.items():
        assert queue["type"] == "quorum", name
        assert len(queue["members"]) == 3, (name, queue["members"])
        arguments = queue["arguments"]
        if "x-dead-letter-exchange" in arguments:  # the route queues: dead-lettered at least once
            assert arguments["x-dead-letter-strategy"] == "at-least-once", name
            assert arguments["x-overflow"] == "reject-publish", name
            assert arguments["x-delivery-limit"] == settings.delivery_limit, name
    for node in the_lab.amqp_nodes.split(","):
        connection = await connect(node, "pkgq-test-lab-declare")
        try:
            channel = await connection.channel()
            await declare_all(channel, settings)  # TopologyMismatchError on any drift
        finally:
            await connection.close()


async def test_every_lab_node_resends_an_unconfirmed_dead_letter_after_15_seconds(
    the_lab: Lab,
) -> None:
    """The lab's nodes read deploy/rabbitmq/advanced.config: a dead letter whose confirm was
    lost with a node comes again in 15 s, not RabbitMQ's default 3 minutes."""
    read = "{ok, T} = application:get_env(rabbit, dead_letter_worker_publisher_confirm_timeout), T."
    for node in (1, 2, 3):
        found = await asyncio.to_thread(
            subprocess.run,
            ["rabbitmqctl", "-n", f"pkgqha{node}@localhost", "eval", read],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert found.returncode == 0, found.stderr
        # A lab started before the setting existed keeps its old config: `make ha-lab-down`.
        assert found.stdout.strip() == "15000", (node, found.stdout)
