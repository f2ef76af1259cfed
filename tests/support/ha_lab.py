"""The local HA lab (deploy/local/ha/lab.sh) from a test: start it, read its addresses, its
chaos primitives (kill and start a RabbitMQ node, crash and promote PostgreSQL), which node
leads which queue, and the removal of what a test left on it."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
from yarl import URL

from tests.support.broker_users import named

LAB = Path(__file__).resolve().parents[2] / "deploy" / "local" / "ha" / "lab.sh"


class LabError(Exception):
    pass


def _lab(*args: str, timeout: float = 240) -> str:
    done = subprocess.run(
        [str(LAB), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise LabError(f"lab.sh {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout.strip()


def exists() -> bool:
    """Whether a lab has been made here and not removed (its state directory's marker), healthy
    or not: a lab that a developer keeps, even one left failed over, is theirs to remove."""
    state = Path(os.environ.get("PKGQ_HA_DIR", "/var/tmp/pkgq-ha"))  # noqa: S108  (lab.sh's own)
    return (state / ".pkgq-ha-lab").exists()


def down() -> None:
    _lab("down")


@dataclass(frozen=True)
class Lab:
    amqp_nodes: str
    """The three nodes' URLs, comma-separated (PKGQ_AMQP_URL as a node list)."""
    amqp_lb: str
    """haproxy in front of them (as a Kubernetes Service would be)."""
    postgres_dsn: str
    """Both PostgreSQL servers, `target_session_attrs=read-write`."""
    management: str
    """The management API behind haproxy, as the administrator."""

    @classmethod
    def up(cls) -> Lab:
        values = {}
        for line in _lab("up").splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            values[name] = value
        return cls(
            amqp_nodes=values["PKGQ_HA_AMQP_NODES"],
            amqp_lb=values["PKGQ_HA_AMQP_LB"],
            postgres_dsn=values["PKGQ_HA_POSTGRES_DSN"],
            management=values["PKGQ_HA_MANAGEMENT"],
        )

    def dsn(self, database: str, user: str) -> str:
        """The lab's multi-host DSN for `database`, as `user`."""
        hosts, _, query = self.postgres_dsn.removeprefix("postgresql://postgres@").partition("/")
        return f"postgresql://{user}@{hosts}/{database}?{query.partition('?')[2]}"

    def client(self) -> httpx.AsyncClient:
        url = URL(self.management)
        return httpx.AsyncClient(
            auth=(url.user or "", url.password or ""),
            timeout=30,
            base_url=str(url.with_user(None) / "api"),
        )

    async def leaders(self, prefix: str) -> dict[str, int]:
        """Queue name -> the node (1-3) leading it (a quorum queue) or hosting it (classic), for
        every queue whose name starts with `prefix`: one call to the management API (a
        `rabbitmqctl` per queue costs a second of CPU each)."""
        async with self.client() as client:
            queues = await listed(client, "queues", prefix, "name,leader,node")
        found: dict[str, int] = {}
        for queue in queues:
            node = queue.get("leader") or queue.get("node") or ""
            if node.startswith("pkgqha") and node[6:7] in "123":
                found[queue["name"]] = int(node[6])
        return found

    async def queue_states(self, prefix: str) -> list[dict[str, Any]]:
        """For a failure message: each queue whose name starts with `prefix`, with its depth,
        unacknowledged count, consumers and leader."""
        async with self.client() as client:
            columns = "name,messages_ready,messages_unacknowledged,consumers,leader"
            return await listed(client, "queues", prefix, columns)

    async def remove_namespace(self, prefix: str, database: str) -> None:
        """Delete a test's queues and exchanges (names starting with `prefix`) and its
        database, so that a lab kept for the next run holds nothing of this one."""
        async with self.client() as client:
            for kind in ("queues", "exchanges"):
                for item in await listed(client, kind, prefix, "name"):
                    gone = await client.delete(f"/{kind}/%2F/{quote(item['name'], safe='')}")
                    if gone.status_code not in (204, 404):
                        gone.raise_for_status()
        admin = await asyncpg.connect(self.dsn("postgres", "postgres"))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await admin.close()


async def listed(
    client: httpx.AsyncClient, kind: str, prefix: str, columns: str
) -> list[dict[str, Any]]:
    """Every queue or exchange (`kind`) of vhost / whose name starts with `prefix`."""
    found = await named(client, kind, f"^{re.escape(prefix)}", columns)
    return [item for item in found if item["name"].startswith(prefix)]


async def lab(*args: str) -> str:
    """Run a lab.sh command without blocking the event loop (traffic goes on meanwhile)."""
    return await asyncio.to_thread(_lab, *args)
