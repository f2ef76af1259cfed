"""Who published, kept, on the real broker: a dead letter keeps the publisher RabbitMQ
verified, so an operator's replay cannot launder an outsider's lifecycle event into pkgq's own,
from the CLI or from the console; and pkgq's copy of an outsider's message is buried by its
consumer whatever sent it."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.cli import exit_codes
from events.envelope import H_PUBLISHER, H_SCHEMA_VERSION, H_SEQ, H_USER_ID
from events.models import PackageActivateEvent, PurchasePackage, RecordUsage
from events.routes import PACKAGE_ACTIVATE, PACKAGE_PURCHASE, UNTRUSTED_PUBLISHER, USAGE_RECORD
from infra.postgres import access, outbox
from infra.rabbit.connection import connect
from infra.settings import Settings
from tests.support.broker_users import broker_user, set_permissions, url_for
from tests.support.dead_letters import buried_id
from tests.support.deliveries import add_package, publish_as_outsider, send
from tests.support.in_process import StartApp
from tests.support.observing import eventually, fetch
from tests.support.processes import cli
from tests.web.client import client, csrf_of, form_value, sign_in

FROZEN_SEQ = 2**52
"""The forgery's x-seq, as in the case this test was written for: applied, it would make later
revokes look stale (a replay keeps an x-seq below 2**53; on 77667a3 the replayed forgery grants
the victim access at this seq)."""


def never_replayed(dead_id: int, outsider: str) -> str:
    return (
        f"not replayed {dead_id}: published by {outsider!r}, not pkgq: "
        f"{PACKAGE_ACTIVATE.name} is published by pkgq only; it is never replayed"
    )


@pytest.fixture
async def outsider(settings: Settings) -> AsyncIterator[tuple[str, AbstractRobustConnection]]:
    """A broker user other than pkgq's that may publish anything on the exchange: a broker
    provisioned without topic permissions, where pkgq's own checks are all that stand."""
    name = f"pkgq-t-{uuid4().hex[:10]}-mallory"
    async with broker_user(name) as password:
        await set_permissions(name, "^$", ".*", "^$")
        connection = await connect(url_for(settings, name, password), "pkgq-test-mallory")
        yield name, connection
        await connection.close()


async def access_row(pool: asyncpg.Pool, user: UUID) -> dict[str, Any] | None:
    async with pool.acquire() as conn:
        row = await access.get_access(conn, user)
    return None if row is None else dict(row)


async def granted(pool: asyncpg.Pool, user: UUID) -> bool:
    row = await access_row(pool, user)
    return row is not None and bool(row["granted"])


@dataclass
class Forgery:
    """An outsider's activation of the victim's used-up item, expired by the broker before any
    consumer took it and filed by the dead-letter ingester."""

    settings: Settings
    pool: asyncpg.Pool
    amqp: AbstractRobustConnection
    victim: UUID
    message_id: str
    dead_id: int
    outsider: str
    before: dict[str, Any] | None
    package: int

    async def never_applied(self, in_process: StartApp) -> None:
        """With every consumer and the relay running again, a genuine purchase goes all the
        way to access, and the forgery has done nothing: not sent, not applied, still buried."""
        app = in_process(self.settings, self.pool, self.amqp)
        await app.start_consumers()
        await app.start_relay()
        bystander = uuid4()
        purchase = PurchasePackage(user_id=bystander, package_id=self.package)
        await send(self.settings, self.amqp, PACKAGE_PURCHASE, purchase)
        await eventually(lambda: granted(self.pool, bystander))
        await app.close()
        assert await access_row(self.pool, self.victim) == self.before
        mid = UUID(self.message_id)
        assert (
            await fetch(self.pool, "SELECT 1 FROM telecom.outbox WHERE message_id = $1", mid) == []
        )
        assert await fetch(self.pool, "SELECT 1 FROM telecom.inbox WHERE sent_as = $1", mid) == []
        (letter,) = await fetch(
            self.pool,
            "SELECT status::text AS status, publisher FROM telecom.dead_letters WHERE id = $1",
            self.dead_id,
        )
        assert letter == {"status": "buried", "publisher": self.outsider}


@pytest.fixture
async def forgery(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    outsider: tuple[str, AbstractRobustConnection],
) -> Forgery:
    package = await add_package(pool, 1000)
    victim = uuid4()
    app = in_process(settings, pool, amqp)
    await app.start_consumers()
    await app.start_relay()
    await send(
        settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=victim, package_id=package)
    )
    await eventually(lambda: granted(pool, victim))
    await send(settings, amqp, USAGE_RECORD, RecordUsage(user_id=victim, upload=1000, download=0))

    async def revoked() -> bool:
        row = await access_row(pool, victim)
        return row is not None and not row["granted"]

    await eventually(revoked)
    await app.close()
    (item,) = await fetch(pool, "SELECT id FROM telecom.package_queue WHERE user_id = $1", victim)

    # Nothing consumes the activate queue now; the dead-letter ingester runs.
    ingest_only = in_process(settings, pool, amqp)
    await ingest_only.start_consumers([], ingest=True)
    name, connection = outsider
    forged = PackageActivateEvent(
        user_id=victim, item_id=item["id"], package_id=package, activated_at=0
    )
    message_id = await publish_as_outsider(
        connection,
        settings,
        PACKAGE_ACTIVATE,
        forged,
        seq=FROZEN_SEQ,
        user_id=name,
        expiration=timedelta(milliseconds=1),
    )
    dead_id = await buried_id(pool, message_id)
    await ingest_only.close()
    (filed,) = await fetch(
        pool, "SELECT source, reason, publisher FROM telecom.dead_letters WHERE id = $1", dead_id
    )
    assert filed == {"source": "broker", "reason": "expired", "publisher": name}
    return Forgery(
        settings,
        pool,
        amqp,
        victim,
        message_id,
        dead_id,
        name,
        await access_row(pool, victim),
        package,
    )


async def test_an_outsiders_activation_the_broker_expired_is_never_replayed_from_the_cli(
    forgery: Forgery, in_process: StartApp
) -> None:
    line = never_replayed(forgery.dead_id, forgery.outsider)
    for args in (
        ("dlq", "replay", "--id", str(forgery.dead_id)),
        ("dlq", "dig", str(forgery.dead_id)),
        ("dlq", "dig", "--force", str(forgery.dead_id)),
        ("dlq", "plow", "5"),
    ):
        refused = await cli(forgery.settings, *args)
        assert refused.returncode == exit_codes.FAILED, (args, refused.stdout, refused.stderr)
        assert line in " ".join(refused.stdout.split()), (args, refused.stdout)
    await forgery.never_applied(in_process)


async def test_an_outsiders_activation_the_broker_expired_is_never_replayed_from_the_console(
    forgery: Forgery, in_process: StartApp
) -> None:
    dead_id = forgery.dead_id
    line = never_replayed(dead_id, forgery.outsider).removeprefix(f"not replayed {dead_id}: ")
    async with client(forgery.settings, forgery.pool) as http:
        assert (await sign_in(http)).status_code == 303
        shown = html.unescape((await http.get(f"/dead-letters/{dead_id}")).text)
        assert f"<code>{forgery.outsider}</code> (as the broker verified it)" in shown

        confirm = await http.get(f"/dead-letters/confirm?action=replay&id={dead_id}")
        assert form_value(confirm.text, "ids") == str(dead_id)
        done = await http.post(
            "/dead-letters/act",
            data={"csrf": csrf_of(confirm.text), "action": "replay", "ids": str(dead_id)},
        )
        assert done.status_code == 303
        page = html.unescape((await http.get(done.headers["location"])).text)
        assert f"replayed 0 dead letter(s) through the outbox; not replayed: {dead_id}: {line}" in (
            " ".join(page.split())
        )

        # Edit and replay: a valid body, the outsider's message still.
        edit = await http.get(f"/dead-letters/{dead_id}/edit")
        (body,) = await fetch(
            forgery.pool, "SELECT body FROM telecom.dead_letters WHERE id = $1", dead_id
        )
        edited = await http.post(
            f"/dead-letters/{dead_id}/edit-replay",
            data={"csrf": csrf_of(edit.text), "body": bytes(body["body"]).decode()},
        )
        assert edited.status_code == 422
        assert line in " ".join(html.unescape(edited.text).split())
    await forgery.never_applied(in_process)


async def test_pkgqs_copy_of_an_outsiders_activation_is_buried_by_its_consumer_however_it_came(
    forgery: Forgery, in_process: StartApp
) -> None:
    """What the old replay would have sent (the relay publishes it as pkgq), naming its first
    publisher as a replay now does: the consumer's trust gate buries it."""
    (letter,) = await fetch(
        forgery.pool, "SELECT body FROM telecom.dead_letters WHERE id = $1", forgery.dead_id
    )
    copy = uuid4()
    async with forgery.pool.acquire() as conn, conn.transaction():
        await outbox.enqueue(
            conn,
            [
                outbox.OutboxMessage(
                    route=PACKAGE_ACTIVATE.name,
                    message_type=PACKAGE_ACTIVATE.message_type,
                    schema_version=1,
                    body=bytes(letter["body"]),
                    user_id=forgery.victim,
                    seq=FROZEN_SEQ,
                    message_id=copy,
                    headers={
                        H_SCHEMA_VERSION: 1,
                        H_USER_ID: str(forgery.victim),
                        H_SEQ: FROZEN_SEQ,
                        H_PUBLISHER: forgery.outsider,
                    },
                )
            ],
        )
    app = in_process(forgery.settings, forgery.pool, forgery.amqp)
    await app.start_consumers([PACKAGE_ACTIVATE])
    await app.start_relay()
    copy_id = await buried_id(forgery.pool, copy)
    await app.close()
    (filed,) = await fetch(
        forgery.pool,
        "SELECT reason, publisher, error_message FROM telecom.dead_letters WHERE id = $1",
        copy_id,
    )
    assert (filed["reason"], filed["publisher"]) == (UNTRUSTED_PUBLISHER, forgery.outsider)
    assert f"pkgq sent it again for {forgery.outsider!r}" in filed["error_message"]
    await forgery.never_applied(in_process)
