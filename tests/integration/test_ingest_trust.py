"""The dead-letter ingester believes pkgq's own dead-letter headers only from pkgq's publisher.

A copy with `x-pkgq-dead-*` headers and no `x-death` is what pkgq's last-resort path sends
straight to the dead-letter exchange, stamped with pkgq's AMQP user. Anyone else can publish
one too: it is filed as `untrusted_publisher`, and says nothing about pkgq's jobs.
"""

from __future__ import annotations

from collections.abc import Mapping
from uuid import uuid4

import asyncpg

from consumers import ingest
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_ADDRESS, H_DEAD_ERROR, H_DEAD_REASON
from events.routes import USAGE_RECORD
from infra.postgres import addresses

PKGQ = "pkgq-runtime"


def dead_letter(
    publisher: str | None, message_id: str, headers: Mapping[str, object]
) -> RawDelivery:
    """A usage record reaching the dead-letter queue with `headers`, published by `publisher`."""
    return RawDelivery(
        body=b'{"user_id": "00000000-0000-4000-8000-000000000001", "upload": 1, "download": 1}',
        message_id=message_id,
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers=headers,
        routing_key=USAGE_RECORD.name,
        publisher=publisher,
    )


def copy(publisher: str, message_id: str, address: str) -> RawDelivery:
    """A last-resort copy: pkgq's dead-letter headers and no `x-death`."""
    headers = {
        H_DEAD_REASON: "handler_error",
        H_DEAD_ERROR: "RuntimeError: boom",
        H_ADDRESS: address,
    }
    return dead_letter(publisher, message_id, headers)


async def test_a_dead_letter_copy_from_another_publisher_is_untrusted_and_fails_no_job(
    pool: asyncpg.Pool,
) -> None:
    message_id, address = uuid4(), f"order-{uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        assert await addresses.take_address(conn, address, USAGE_RECORD.name, message_id) is None
    ingester = ingest.make_ingester(pool, trusted_publisher=PKGQ)

    forged = copy("mallory", str(message_id), address)
    assert [r.fate for r in await ingester([forged])] == [Fate.DEAD_LETTERED]
    async with pool.acquire() as conn:
        state = await addresses.address_state(conn, address)
        filed = await conn.fetch("SELECT reason, source FROM telecom.dead_letters")
    assert state is not None
    assert state.state == "queued"
    assert [(r["reason"], r["source"]) for r in filed] == [("untrusted_publisher", "broker")]

    genuine = copy(PKGQ, str(message_id), address)
    assert [r.fate for r in await ingester([genuine])] == [Fate.DEAD_LETTERED]
    async with pool.acquire() as conn:
        state = await addresses.address_state(conn, address)
        reasons = {r["reason"] for r in await conn.fetch("SELECT reason FROM telecom.dead_letters")}
    assert state is not None
    assert state.state == "failed"
    assert reasons == {"untrusted_publisher", "handler_error"}


def broker_dead_letter(publisher: str | None, message_id: str, address: str) -> RawDelivery:
    """A message the broker dead-lettered (a TTL expiry: it has `x-death`), carrying an
    address header, as published by `publisher`."""
    expired = [{"reason": "expired", "queue": "pkgq.usage_record", "count": 1}]
    return dead_letter(publisher, message_id, {"x-death": expired, H_ADDRESS: address})


async def test_an_outsiders_broker_dead_letter_is_filed_but_fails_no_address_it_names(
    pool: asyncpg.Pool,
) -> None:
    message_id, address = uuid4(), f"order-{uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        assert await addresses.take_address(conn, address, USAGE_RECORD.name, message_id) is None
    ingester = ingest.make_ingester(pool, trusted_publisher=PKGQ)

    for outsider in ("mallory", None):  # a user_id of its own, or none at all
        forged = broker_dead_letter(outsider, str(message_id), address)
        assert [r.fate for r in await ingester([forged])] == [Fate.DEAD_LETTERED]
    async with pool.acquire() as conn:
        state = await addresses.address_state(conn, address)
        filed = await conn.fetch("SELECT reason, source, headers FROM telecom.dead_letters")
    assert state is not None
    assert state.state == "queued"  # the outsider's x-pkgq-address is data, not authority
    assert {(r["reason"], r["source"]) for r in filed} == {("expired", "broker")}
    # Stored without it, so that replaying the letter (sent as pkgq) cannot make it pkgq's.
    assert all(H_ADDRESS not in r["headers"] for r in filed)

    genuine = broker_dead_letter(PKGQ, str(message_id), address)
    assert [r.fate for r in await ingester([genuine])] == [Fate.DEAD_LETTERED]
    async with pool.acquire() as conn:
        state = await addresses.address_state(conn, address)
    assert state is not None
    assert state.state == "failed"
