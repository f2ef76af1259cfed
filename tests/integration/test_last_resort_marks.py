"""The last-resort copy (infra/rabbit/last_resort.py) is published as pkgq's own AMQP user, so
the dead-letter ingester believes what it carries: an outsider's pkgq marks (PKGQ_MARKS: job
marks, failure and replay history, first publisher) must come off it, while pkgq's own stay; the
copy names the message's first publisher itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from aio_pika.abc import AbstractRobustConnection

from events.decoding import RawDelivery
from events.envelope import H_DEAD_REASON, H_PUBLISHER, H_SCHEMA_VERSION, PKGQ_MARKS, UNVERIFIED
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit.connection import connect
from infra.rabbit.consumer import Decided
from infra.rabbit.publisher import Publisher, build_message
from infra.rabbit.route_consumer import route_consumer
from infra.rabbit.tap import Tap, Tapped
from infra.settings import Settings

FORGED: dict[str, Any] = {name: f"forged {name}" for name in PKGQ_MARKS}


async def _broken(raws: Sequence[RawDelivery]) -> list[Decided]:
    raise RuntimeError("a bug in the failure path")  # every delivery goes to the last resort


async def _publish(amqp: AbstractRobustConnection, settings: Settings, user_id: str | None) -> str:
    """A usage record carrying every pkgq mark, published as `user_id` (None: no user_id)."""
    message_id = str(uuid4())
    body = RecordUsage(user_id=uuid4(), upload=1, download=1).model_dump_json().encode()
    headers = {H_SCHEMA_VERSION: USAGE_RECORD.schema_version, "x-senders-own": "kept", **FORGED}
    publisher = await Publisher.open(amqp, settings.exchange, user_id=user_id)
    try:
        message = build_message(
            body, message_id=message_id, message_type=USAGE_RECORD.message_type, headers=headers
        )
        await publisher.publish(message, USAGE_RECORD.name)
    finally:
        await publisher.close()
    return message_id


async def test_an_outsiders_forged_pkgq_marks_do_not_survive_into_the_last_resort_copy(
    settings: Settings, amqp: AbstractRobustConnection, tap: Tap
) -> None:
    connection = await connect(settings.amqp_url, f"pkgq-test-consumer-{uuid4().hex[:8]}")
    # As consumers/runner.py opens it: the copy is stamped with pkgq's AMQP user.
    dead_letters = await Publisher.open(connection, settings.dlx, user_id=settings.amqp_user)
    consumer = route_consumer(USAGE_RECORD, settings, connection, _broken, dead_letters)
    await consumer.start()
    outsiders = await _publish(amqp, settings, None)
    own = await _publish(amqp, settings, settings.amqp_user)

    def copied(seen: list[Tapped]) -> bool:
        return {t.message_id for t in seen if t.exchange == settings.dlx} >= {outsiders, own}

    try:
        await tap.wait_for(copied, within=15)
    finally:
        await consumer.stop()
        await connection.close()
    copies = {t.message_id: t for t in tap.seen if t.exchange == settings.dlx}
    outsiders_copy, own_copy = copies[outsiders], copies[own]
    assert outsiders_copy.publisher == settings.amqp_user  # what the ingester would believe
    assert outsiders_copy.headers[H_DEAD_REASON] == "handler_error"
    assert outsiders_copy.headers["x-senders-own"] == "kept"  # only the marks come off
    # Its marks come off; pkgq's own says who published it first (no user_id: nobody vouched)
    assert {k: v for k, v in outsiders_copy.headers.items() if k in PKGQ_MARKS} == {
        H_PUBLISHER: UNVERIFIED
    }
    # pkgq's own message keeps them: the strip is for outsiders only
    assert {k: v for k, v in own_copy.headers.items() if k in PKGQ_MARKS} == FORGED
