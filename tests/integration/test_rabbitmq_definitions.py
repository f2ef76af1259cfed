"""deploy/rabbitmq/definitions.json is the topology the processes declare, and stays so."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
from pathlib import Path

from aio_pika.abc import AbstractRobustConnection
from aiormq.exceptions import ChannelNotFoundEntity

from infra.rabbit.connection import connect
from infra.rabbit.topology import declare_all, definitions
from infra.settings import Settings
from tests.support import eventually

COMMITTED = Path(__file__).resolve().parents[2] / "deploy" / "rabbitmq" / "definitions.json"


def test_the_committed_definitions_are_what_the_code_declares_with_default_settings() -> None:
    current = definitions(Settings(exchange="telecom", queue_prefix="pkgq", partitions={}))
    committed = json.loads(COMMITTED.read_text())
    assert committed == current, (
        "deploy/rabbitmq/definitions.json is stale: regenerate it with "
        "`pkgq definitions > deploy/rabbitmq/definitions.json`"
    )


async def test_a_broker_provisioned_from_the_definitions_accepts_every_process_declaration(
    settings: Settings, amqp: AbstractRobustConnection
) -> None:
    # The test's own names, provisioned the way an operator would, then declared the way every
    # pkgq process does at start-up: any argument that differs fails with PRECONDITION_FAILED.
    parted = settings.model_copy(
        update={"queue_prefix": settings.queue_prefix + ".prov", "partitions": {}}
    )
    with tempfile.NamedTemporaryFile("w", suffix=".json") as document:
        json.dump(definitions(parted), document)
        document.flush()
        os.chmod(document.name, 0o644)  # rabbitmqctl reads it as the broker's own user
        await asyncio.to_thread(
            subprocess.run,
            ["rabbitmqctl", "-q", "import_definitions", document.name],
            check=True,
            capture_output=True,
            timeout=60,
        )
    connection = await connect(parted.amqp_url, "pkgq-test-definitions")
    try:
        channel = await connection.channel()
        names = [q["name"] for q in definitions(parted)["queues"]]

        async def imported() -> bool:  # the import finishes asynchronously
            probe = await connection.channel()
            try:
                for name in names:
                    await probe.declare_queue(name, passive=True)
            except ChannelNotFoundEntity:
                return False
            finally:
                if not probe.is_closed:
                    await probe.close()
            return True

        await eventually(imported, within=30)
        await declare_all(channel, parted)  # raises TopologyMismatchError on any drift
        for name in names:
            await channel.queue_delete(name)
    finally:
        await connection.close()
