"""What the ingester files for a message the main exchange's alternate exchange caught: an
`unroutable` dead letter, whatever its headers claim (tests/integration/test_unroutable.py
runs it through the real broker)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from uuid import UUID, uuid4

from consumers.ingest import UNROUTABLE, to_dead_letter
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_DEAD_REASON, H_USER_ID

EXCHANGE = "telecom"


def caught(
    headers: Mapping[str, Any],
    *,
    exchange: str = EXCHANGE,
    key: str = "",
    body: UUID | str = "x",
) -> RawDelivery:
    return RawDelivery(
        body=f'{{"user_id": "{body}"}}'.encode(),
        message_id="m-1",
        message_type="RecordUsage",
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers=headers,
        routing_key=key or "telecom.usage_record",
        publisher="billing",
        exchange=exchange,
    )


def test_a_message_from_the_main_exchange_is_filed_as_unroutable_under_its_route() -> None:
    user = uuid4()
    dead = to_dead_letter(caught({H_USER_ID: str(uuid4())}, body=user), "pkgq", EXCHANGE)
    assert (dead.source, dead.reason, dead.route, dead.consumer) == (
        "broker",
        UNROUTABLE,
        "telecom.usage_record",
        "usage_record",
    )
    assert dead.user_id == user  # the body's, not the header's
    assert "telecom.usage_record" in dead.error_message
    assert dead.body == f'{{"user_id": "{user}"}}'.encode()


def test_a_stale_partition_key_is_filed_under_the_route_it_belongs_to() -> None:
    dead = to_dead_letter(caught({}, key="telecom.usage_record.p7"), "pkgq", EXCHANGE)
    assert (dead.reason, dead.route) == (UNROUTABLE, "telecom.usage_record")
    assert "telecom.usage_record.p7" in dead.error_message


def test_forged_dead_letter_headers_do_not_change_what_an_unroutable_message_is() -> None:
    forged = {"x-death": [{"reason": "expired", "queue": "q"}], H_DEAD_REASON: "handler_error"}
    dead = to_dead_letter(caught(forged), "pkgq", EXCHANGE)
    assert (dead.source, dead.reason) == ("broker", UNROUTABLE)
    assert dead.headers["x-death"] == [{"reason": "expired", "queue": "q"}]  # kept as data


def test_a_broker_dead_letter_from_the_dead_letter_exchange_is_not_unroutable() -> None:
    dead = to_dead_letter(
        caught({"x-death": [{"reason": "expired", "queue": "q"}]}, exchange="telecom.dlx"),
        "pkgq",
        EXCHANGE,
    )
    assert dead.reason == "expired"


def test_without_the_main_exchange_named_nothing_is_taken_for_unroutable() -> None:
    dead = to_dead_letter(caught({}), "pkgq")
    assert dead.reason != UNROUTABLE


def test_headers_that_cannot_be_read_still_give_a_storable_dead_letter() -> None:
    class Unreadable(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise RuntimeError("boom")

        def __iter__(self) -> Iterator[str]:
            raise RuntimeError("boom")

        def __len__(self) -> int:
            return 1

    dead = to_dead_letter(caught(Unreadable()), "pkgq", EXCHANGE)
    assert dead.reason == "unstorable"
    assert dead.body == b'{"user_id": "x"}'
