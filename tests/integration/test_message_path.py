"""The files one usage record's code runs in, from the socket to the ack.

A profiler watches every Python call while one usage record is consumed by a real consumer
(real RabbitMQ, real PostgreSQL, the user's package active), and keeps the calls made beneath
the two that carry a delivery: its hand-over in the connection's reader task
(`deliveries.Handover`), and the consumer's `_deliver`, from the processor to the ack. What
other tasks do meanwhile (heartbeats, the relay, the idle poll) is left out.

Run it with `-s` to read the walk: every project file, in the order its code first ran, with the
functions called in it. `PKGQ_WIRE_ACCELERATOR=false` walks aiormq's own frame paths instead.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any
from uuid import uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from events.models import PurchasePackage, RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.observability import MESSAGES
from infra.rabbit import wire
from infra.settings import Settings
from tests.support.deliveries import add_package, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually, fetch

ROOT = str(Path(__file__).resolve().parents[2]) + os.sep
PRODUCTION = ("domain", "events", "infra", "consumers")
"""The packages that ship: what a reader follows. devtools and tests are not on the path."""
STAGES_AT_MOST = 12
"""The files holding the path's own steps (stages), support modules aside (`SUPPORT`)."""
SUPPORT = {
    "domain/records.py": "the record decorator",
    "domain/model.py": "the domain's records (items, terms)",
    "domain/counters.py": "the domain's bigint bounds",
    "events/decoding.py": "the wire contract: decoding a body",
    "events/partitioning.py": "the wire contract: partition keys",
    "infra/transient.py": "the outage wait around every batch",
    "events/envelope.py": "the wire contract: headers",
    "events/models.py": "the wire contract: bodies",
    "events/routes.py": "the wire contract: routes",
    "events/identity.py": "the wire contract: a message's identity",
    "events/bounded_json.py": "the wire contract: bounded JSON",
    "events/outgoing.py": "the wire contract: follow-up events",
    "events/versions.py": "the wire contract: schema versions",
    "infra/log_context.py": "logging",
    "infra/logging.py": "logging",
    "infra/tracing.py": "tracing",
    "infra/observability.py": "metrics",
    "infra/faults.py": "fault injection points for tests",
    "infra/postgres/pool.py": "the connection pool",
    "infra/postgres/compound.py": "statements joined into one round trip",
    "infra/rabbit/wire/frames.py": "the optional wire accelerator (PKGQ_WIRE_ACCELERATOR)",
    "infra/rabbit/wire/frame_decode.py": "the optional wire accelerator",
}


def _relative(path: str) -> str | None:
    if not path.startswith(ROOT):
        return None
    rel = path[len(ROOT) :]
    return rel if rel.split(os.sep, 1)[0] in PRODUCTION else None


ENTRIES = {
    ("infra/rabbit/deliveries.py", "__call__"),  # the hand-over, in the reader task
    ("infra/rabbit/consumer.py", "_deliver"),  # a batch, from the processor to the ack
}
"""The calls that carry a delivery: whatever runs beneath them is on its path."""
IDLE = ("infra/rabbit/subscription.py", "_run_idle")
"""The consumer's idle work (the parked messages' poll), which is not."""


class Walk:
    """Calls into project files made beneath one of ENTRIES (and not beneath IDLE), in
    first-call order."""

    def __init__(self) -> None:
        self.order: dict[tuple[str, str], int] = {}

    def __call__(self, frame: FrameType, event: str, _: Any) -> None:
        if event != "call":
            return
        rel = _relative(frame.f_code.co_filename)
        if rel is None:
            return
        call = (rel, frame.f_code.co_name)
        if call in self.order:
            return
        above: FrameType | None = frame
        carried = False
        while above is not None:
            at = (_relative(above.f_code.co_filename) or "", above.f_code.co_name)
            if at == IDLE:
                return
            carried = carried or at in ENTRIES
            above = above.f_back
        if carried:
            self.order[call] = len(self.order)

    def path(self) -> dict[str, list[str]]:
        """The files on the delivery's path, each with its functions, in first-call order."""
        files: dict[str, list[str]] = {}
        for rel, name in sorted(self.order, key=self.order.__getitem__):
            files.setdefault(rel, []).append(name)
        return files


async def test_one_usage_record_runs_in_few_stage_files_from_socket_to_ack(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    in_process: StartApp,
) -> None:
    app = in_process(settings, pool, amqp)
    await app.start_consumers()
    await app.start_relay()
    user = uuid4()
    package = await add_package(pool, 10_000, timedelta(days=30))
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def active() -> bool:
        rows = await fetch(
            pool,
            "SELECT 1 FROM telecom.package_queue WHERE user_id = $1 AND status = 'active'",
            user,
        )
        return bool(rows)

    await eventually(active, within=20)
    await asyncio.sleep(1.0)  # the purchase's follow-ups are done with: only the record moves
    acked = MESSAGES.labels(route=USAGE_RECORD.name, outcome="acked")
    before = acked._value.get()
    walk = Walk()
    sys.setprofile(walk)
    try:
        await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=user, upload=10, download=0))

        async def counted() -> bool:
            return bool(acked._value.get() > before)

        await eventually(counted, within=20)
    finally:
        sys.setprofile(None)
    await app.close()

    files = walk.path()
    stages = [rel for rel in files if rel not in SUPPORT]
    print(f"\n{len(files)} project files on the path, {len(stages)} stage files:")
    for rel, names in files.items():
        kind = SUPPORT.get(rel, "stage")
        print(f"  {rel:45} [{kind}] {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}")
    assert "consumers/handlers/usage_record.py" in files, "the walk missed the handler"
    assert wire.installed() == settings.wire_accelerator
    assert len(stages) <= STAGES_AT_MOST, f"{len(stages)} stage files: {stages}"
