"""Who published a message, kept: the first publisher a delivery is stamped with (decode.py), what
its consumer's trust gate makes of a copy pkgq sent again, and what the dead-letter ingester files
as a dead letter's publisher (consumers/ingest.py). pkgq's own header (H_PUBLISHER) is believed
from pkgq's AMQP user only."""

from __future__ import annotations

import dataclasses
from typing import Any
from uuid import uuid4

import pytest

from consumers.delivery.decode import check_publisher, decode_all, stamped
from consumers.ingest import to_dead_letter
from events.decoding import BadMessageError, RawDelivery
from events.envelope import H_DEAD_ERROR, H_DEAD_REASON, H_PUBLISHER, UNVERIFIED, publisher_of
from events.models import PackageActivateEvent, RecordUsage
from events.routes import PACKAGE_ACTIVATE, UNTRUSTED_PUBLISHER, USAGE_RECORD
from tests.support.deliveries import raw_for

PKGQ = "pkgq-runtime"


def activation(publisher: str | None, **headers: Any) -> RawDelivery:
    body = PackageActivateEvent(user_id=uuid4(), item_id=1, package_id=1, activated_at=0)
    raw = raw_for(PACKAGE_ACTIVATE, body)
    return dataclasses.replace(raw, publisher=publisher, headers={**raw.headers, **headers})


def usage(publisher: str | None, **headers: Any) -> RawDelivery:
    raw = raw_for(USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=1))
    return dataclasses.replace(raw, publisher=publisher, headers={**raw.headers, **headers})


def test_the_first_publisher_is_pkgqs_header_else_the_user_id_else_unverified() -> None:
    assert publisher_of({H_PUBLISHER: "shop"}, PKGQ) == "shop"
    assert publisher_of({}, "shop") == "shop"
    assert publisher_of({}, None) == UNVERIFIED
    assert publisher_of({H_PUBLISHER: b"billing"}, PKGQ) == "billing"  # as AMQP may hand it
    assert publisher_of({H_PUBLISHER: {"a": 1}}, "shop") == "shop"  # not text: not a publisher


@pytest.mark.parametrize(
    ("publisher", "header", "first"),
    [
        ("shop", None, "shop"),
        (None, None, UNVERIFIED),
        (PKGQ, None, PKGQ),  # pkgq's own event
        (PKGQ, "shop", "shop"),  # pkgq's retry or replay of the shop's command
        ("mallory", PKGQ, "mallory"),  # an outsider's claim to be pkgq's copy
        ("mallory", "shop", "mallory"),
    ],
)
def test_a_delivery_is_stamped_with_its_first_publisher_believing_pkgqs_header_only(
    publisher: str | None, header: str | None, first: str
) -> None:
    raw = usage(publisher, **({H_PUBLISHER: header} if header else {}))
    assert stamped(raw, PKGQ).headers[H_PUBLISHER] == first
    (ready,), _ = decode_all(USAGE_RECORD, [raw], max_body_bytes=2**20, trusted_publisher=PKGQ)
    assert ready.raw.headers[H_PUBLISHER] == first  # what its retry, parking and burial keep
    assert ready.decoded.envelope.publisher == first  # what the audit and its events say


@pytest.mark.parametrize("first", ["mallory", UNVERIFIED])
def test_pkgqs_copy_of_someone_elses_message_on_a_pkgq_only_route_is_untrusted(
    first: str,
) -> None:
    """A replay (or any copy pkgq sent again) of a message pkgq did not publish first: the
    broker shows pkgq as its publisher, and the gate still refuses it."""
    raw = activation(PKGQ, **{H_PUBLISHER: first})
    with pytest.raises(BadMessageError) as refused:
        check_publisher(PACKAGE_ACTIVATE, raw, PKGQ)
    assert refused.value.reason == UNTRUSTED_PUBLISHER
    assert f"pkgq sent it again for {first!r}, who published it first" in refused.value.detail
    ready, bad = decode_all(PACKAGE_ACTIVATE, [raw], max_body_bytes=2**20, trusted_publisher=PKGQ)
    assert ready == []
    assert [b.problem.reason for b in bad] == [UNTRUSTED_PUBLISHER]
    assert bad[0].raw.headers[H_PUBLISHER] == first  # its dead letter says whose it is


def test_pkgqs_own_event_and_pkgqs_copy_of_it_pass_the_gate() -> None:
    for raw in (activation(PKGQ), activation(PKGQ, **{H_PUBLISHER: PKGQ})):
        check_publisher(PACKAGE_ACTIVATE, raw, PKGQ)
        (ready,), bad = decode_all(
            PACKAGE_ACTIVATE, [raw], max_body_bytes=2**20, trusted_publisher=PKGQ
        )
        assert bad == []
        assert ready.decoded.envelope.publisher == PKGQ


def test_a_copy_of_a_command_passes_the_gate_whoever_published_it_first() -> None:
    check_publisher(USAGE_RECORD, usage(PKGQ, **{H_PUBLISHER: "mallory"}), PKGQ)


def broker_expired(publisher: str | None, **headers: Any) -> RawDelivery:
    """What the ingester receives for a message the broker expired from pkgq's activate queue:
    RabbitMQ keeps its properties (its user_id too) and adds x-death."""
    death = {"reason": "expired", "queue": "pkgq.package_activate", "count": 1}
    return dataclasses.replace(
        activation(publisher, **headers),
        routing_key=PACKAGE_ACTIVATE.name,
        headers={**activation(None).headers, **headers, "x-death": [death]},
    )


@pytest.mark.parametrize(
    ("publisher", "headers", "filed"),
    [
        ("mallory", {}, "mallory"),
        (None, {}, UNVERIFIED),
        ("mallory", {H_PUBLISHER: PKGQ}, "mallory"),  # its claim to be pkgq's is not believed
        (PKGQ, {}, PKGQ),  # pkgq's own event, expired
        (PKGQ, {H_PUBLISHER: "shop"}, "shop"),  # pkgq's expired retry of the shop's command
    ],
)
def test_a_broker_dead_letter_is_filed_under_the_publisher_the_broker_verified(
    publisher: str | None, headers: dict[str, Any], filed: str
) -> None:
    dead = to_dead_letter(broker_expired(publisher, **headers), PKGQ)
    assert (dead.source, dead.reason) == ("broker", "expired")
    assert dead.publisher == filed


@pytest.mark.parametrize(("copy_of", "filed"), [("shop", "shop"), (UNVERIFIED, UNVERIFIED)])
def test_pkgqs_last_resort_copy_is_filed_under_the_first_publisher_it_names(
    copy_of: str, filed: str
) -> None:
    copy = usage(
        PKGQ,
        **{H_DEAD_REASON: "handler_error", H_DEAD_ERROR: "RuntimeError: x", H_PUBLISHER: copy_of},
    )
    dead = to_dead_letter(dataclasses.replace(copy, routing_key=USAGE_RECORD.name), PKGQ)
    assert (dead.source, dead.reason, dead.publisher) == ("consumer", "handler_error", filed)


def test_an_outsiders_lookalike_last_resort_copy_is_filed_under_the_outsider() -> None:
    forged = usage(
        "mallory",
        **{H_DEAD_REASON: "handler_error", H_DEAD_ERROR: "RuntimeError: x", H_PUBLISHER: PKGQ},
    )
    dead = to_dead_letter(dataclasses.replace(forged, routing_key=USAGE_RECORD.name), PKGQ)
    assert (dead.reason, dead.publisher) == (UNTRUSTED_PUBLISHER, "mallory")
