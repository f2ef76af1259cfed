"""Publishes sent together (infra/rabbit/wire/coalesce.py) put on the wire the bytes aiormq's own
publish puts there, one after another, large bodies split at the channel's frame size."""

from __future__ import annotations

from typing import Any

from aiormq.abc import ChannelFrame
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from infra.rabbit.publisher import build_properties
from infra.rabbit.wire.coalesce import publish_frames

FRAME_BODY = 4096 - 8


def _aiormqs_bytes(number: int, body: bytes, key: str, properties: Basic.Properties) -> bytes:
    frames: list[Any] = [
        Basic.Publish(exchange="ex", routing_key=key, mandatory=True),
        ContentHeader(0, len(body), properties),
    ]
    frames += [ContentBody(body[i : i + FRAME_BODY]) for i in range(0, len(body), FRAME_BODY)]
    return ChannelFrame.marshall(number, frames).payload


@settings(max_examples=100)
@given(
    number=st.integers(1, 2047),
    messages=st.lists(
        st.tuples(st.binary(max_size=3 * FRAME_BODY + 5), st.text(max_size=60)),
        min_size=1,
        max_size=5,
    ),
)
def test_a_coalesced_write_is_the_bytes_of_aiormqs_publishes_in_order(
    number: int, messages: list[tuple[bytes, str]]
) -> None:
    ours = b""
    theirs = b""
    for i, (body, key) in enumerate(messages):
        properties = build_properties(
            message_id=f"m{i}", message_type="usage_record", headers={"x-pkgq-attempt": 1}
        )
        ours += publish_frames(number, FRAME_BODY, "ex", key, body, properties)
        theirs += _aiormqs_bytes(number, body, key, properties)
    assert ours == theirs
