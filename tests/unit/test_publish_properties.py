"""The relay's message properties (infra/rabbit/publisher.py, build_properties) go on the wire as
the same bytes as those of the aio-pika Message `build_message` makes, but for an expiration that
aio-pika rounds down."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import frame
from pamqp.header import ContentHeader

from infra.rabbit.publisher import build_message, build_properties

_HEADER_VALUES = st.one_of(
    st.text(max_size=40), st.integers(-(2**31), 2**31 - 1), st.booleans(), st.none()
)
_STAMP = datetime(2026, 11, 27, 12, 0, 0, tzinfo=UTC)


def _wire(properties: Any) -> bytes:
    return frame.marshal(ContentHeader(0, 17, properties), 1)


@settings(max_examples=300)
@given(
    message_id=st.uuids(),
    message_type=st.none() | st.text(min_size=1, max_size=30),
    headers=st.dictionaries(st.text(min_size=1, max_size=20), _HEADER_VALUES, max_size=6),
    content_type=st.none() | st.sampled_from(["application/json", "text/plain"]),
    priority=st.none() | st.integers(0, 9),
    expiration_ms=st.none() | st.integers(0, 10**9),
)
def test_the_relays_properties_are_the_bytes_of_build_messages_with_an_exact_expiration(
    message_id: UUID,
    message_type: str | None,
    headers: dict[str, Any],
    content_type: str | None,
    priority: int | None,
    expiration_ms: int | None,
) -> None:
    given_: dict[str, Any] = {
        "message_id": message_id,
        "message_type": message_type,
        "headers": headers,
        "content_type": content_type,
        "timestamp": _STAMP,
        "priority": priority,
        "expiration_ms": expiration_ms,
    }
    ours = build_properties(**given_)
    theirs = build_message(b"x" * 17, **given_).properties
    exact = str(max(1, expiration_ms)) if expiration_ms else None
    assert ours.expiration == exact
    theirs.expiration = exact
    assert _wire(ours) == _wire(theirs)


def test_an_expiration_of_1001_ms_is_sent_as_1001_where_aio_pika_would_send_1000() -> None:
    fields: dict[str, Any] = {"message_id": "m", "message_type": "t", "headers": {}}
    assert build_properties(**fields, expiration_ms=1001).expiration == "1001"
    assert build_message(b"", **fields, expiration_ms=1001).properties.expiration == "1000"


def test_a_message_without_a_timestamp_is_stamped_now() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    stamped = build_properties(message_id="m", message_type="t", headers={}).timestamp
    assert stamped is not None
    assert before <= stamped <= datetime.now(UTC)
