"""A delivery's frames decoded by infra/rabbit/wire/frame_decode.py are what pamqp
decodes from the same bytes, attribute for attribute; what it cannot read exactly as pamqp
(other frames, other
header types, damaged bytes) it leaves to pamqp."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal
from importlib.metadata import version
from typing import Any

import aiormq
import aiormq.connection
import pamqp.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body, commands, header, heartbeat
from pamqp.exceptions import PAMQPException

from infra.rabbit.wire import frame_decode, frames
from infra.rabbit.wire.frames import split_frames

_SHORT = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
_PLAIN_VALUES = st.one_of(
    st.text(max_size=30),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.none(),
    st.datetimes(
        min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1)
    ).map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)),
)
_OTHER_VALUES = st.one_of(
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    st.binary(max_size=10).map(bytearray),
    st.lists(st.integers(min_value=0, max_value=9), max_size=3),
    st.just(Decimal("1.5")),
)
_KEYS = st.text(min_size=1, max_size=12).filter(lambda s: len(s.encode()) <= 255)


def _tables(values: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.recursive(
        st.dictionaries(_KEYS, values, max_size=5),
        lambda inner: st.dictionaries(_KEYS, st.one_of(values, inner), max_size=4),
        max_leaves=12,
    )


_PROPERTIES = st.builds(
    commands.Basic.Properties,
    content_type=st.none() | _SHORT,
    content_encoding=st.none() | _SHORT,
    headers=st.none() | _tables(_PLAIN_VALUES) | _tables(st.one_of(_PLAIN_VALUES, _OTHER_VALUES)),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(min_value=0, max_value=9),
    correlation_id=st.none() | _SHORT,
    reply_to=st.none() | _SHORT,
    expiration=st.none() | st.integers(min_value=0, max_value=10**9).map(str),
    message_id=st.none() | _SHORT,
    timestamp=st.none()
    | st.datetimes(
        min_value=datetime.datetime(1971, 1, 1), max_value=datetime.datetime(2100, 1, 1)
    ).map(lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC)),
    message_type=st.none() | _SHORT,
    user_id=st.none() | _SHORT,
    app_id=st.none() | _SHORT,
)
_DELIVER = st.builds(
    commands.Basic.Deliver,
    consumer_tag=_SHORT,
    delivery_tag=st.integers(min_value=0, max_value=2**63 - 1),
    redelivered=st.booleans(),
    exchange=st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True),
    routing_key=_SHORT,
)


def _fields(frame: Any) -> Any:
    """Everything a frame object holds, for comparison."""
    if isinstance(frame, header.ContentHeader):
        props = frame.properties
        return (
            "header",
            frame.class_id,
            frame.weight,
            frame.body_size,
            {name: getattr(props, name) for name in commands.Basic.Properties.__slots__},
        )
    if isinstance(frame, body.ContentBody):
        return ("body", frame.value)
    return (type(frame).__name__, {name: getattr(frame, name) for name in frame.__slots__})


def _both(data: bytes) -> tuple[Any, Any]:
    """What frame_decode makes of a whole frame (None: left to pamqp), and what pamqp makes of
    it (the exception's type when it refuses it)."""
    ours = frame_decode.decoded(bytearray(data), 0, len(data))
    try:
        theirs: Any = pamqp.frame.unmarshal(data)
    except (PAMQPException, ValueError) as exc:
        theirs = type(exc)
    return ours, theirs


def _same(data: bytes) -> bool:
    """frame_decode left the frame to pamqp, or made exactly what pamqp makes of it."""
    ours, theirs = _both(data)
    if ours is None:
        return True
    assert not isinstance(theirs, type), f"pamqp refuses what frame_decode took: {theirs}"
    assert (ours[0], ours[1], _fields(ours[2])) == (theirs[0], theirs[1], _fields(theirs[2]))
    return True


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_DELIVER, st.integers(min_value=0, max_value=65535))
def test_a_basic_deliver_is_decoded_as_pamqp_decodes_it(
    deliver: commands.Basic.Deliver, channel: int
) -> None:
    data = pamqp.frame.marshal(deliver, channel)
    ours, _ = _both(data)
    assert ours is not None
    assert _same(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_PROPERTIES, st.integers(min_value=0, max_value=2**40))
def test_a_content_header_is_decoded_as_pamqp_decodes_it_or_left_to_pamqp(
    properties: commands.Basic.Properties, size: int
) -> None:
    data = pamqp.frame.marshal(header.ContentHeader(0, size, properties), 1)
    assert _same(data)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(_tables(_PLAIN_VALUES))
def test_a_header_table_of_plain_values_and_nested_tables_is_never_left_to_pamqp(
    headers: dict[str, Any],
) -> None:
    properties = commands.Basic.Properties(headers=headers, message_id="m", delivery_mode=2)
    data = pamqp.frame.marshal(header.ContentHeader(0, 3, properties), 1)
    ours, _ = _both(data)
    assert ours is not None
    assert _same(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(_DELIVER, st.builds(header.ContentHeader, st.just(0), st.just(9), _PROPERTIES)),
    st.data(),
)
def test_damaged_bytes_are_either_decoded_as_pamqp_does_or_left_to_it(
    frame: Any, data: st.DataObject
) -> None:
    good = bytearray(pamqp.frame.marshal(frame, 1))
    # Damage the payload only: the frame's own size and end byte are checked before decoding.
    at = data.draw(st.integers(min_value=7, max_value=len(good) - 2))
    good[at] = data.draw(st.integers(min_value=0, max_value=255))
    assert _same(bytes(good))


def test_pkgqs_own_delivery_takes_the_fast_path_for_all_three_frames() -> None:
    properties = commands.Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        priority=0,
        message_id="0b8f0c3e-1f7e-4a5e-9d7c-111111111111",
        timestamp=datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.UTC),
        message_type="telecom.usage_record",
        user_id="pkgq",
        app_id="pkgq",
        headers={
            "x-schema-version": 2,
            "x-user-id": "u-1",
            "x-seq": 17,
            "traceparent": "00-a-b-01",
        },
    )
    frames: list[Any] = [
        commands.Basic.Deliver("ctag", 7, True, "telecom", "telecom.usage_record"),
        header.ContentHeader(0, 5, properties),
        body.ContentBody(b"12345"),
    ]
    for frame in frames:
        data = pamqp.frame.marshal(frame, 3)
        ours, _ = _both(data)
        assert ours is not None, type(frame).__name__
        assert _same(data)


@pytest.mark.parametrize(
    "frame",
    [
        heartbeat.Heartbeat(),
        commands.Basic.Ack(5, True),
        commands.Channel.Close(404, "NOT_FOUND", 0, 0),
        header.ContentHeader(0, 1, commands.Basic.Properties(headers={"a": [1, 2]})),
    ],
    ids=["heartbeat", "ack", "close", "array-in-headers"],
)
def test_other_frames_are_left_to_pamqp(frame: Any) -> None:
    data = pamqp.frame.marshal(frame, 1)
    assert frame_decode.decoded(bytearray(data), 0, len(data)) is None


def _nested_header_frame(depth: int) -> bytes:
    """A content header whose headers table is {"k": {"k": ... {"k": 1}}}, `depth` tables
    inside the outer one, built by hand (pamqp's encoder recurses too deep to make it)."""
    table = b"\x01kb\x01"  # "k": short-short int 1
    table = struct.pack(">I", len(table)) + table
    for _ in range(depth):
        entry = b"\x01kF" + table
        table = struct.pack(">I", len(entry)) + entry
    payload = struct.pack(">HHQH", 60, 0, 1, 0x2000) + table
    return struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"


def test_a_header_table_nested_past_the_depth_limit_is_left_to_pamqp() -> None:
    """pamqp runs out of stack on a table nested about 500 deep under the default recursion
    limit (its decoder makes two calls per level); such a frame must fare as it does with
    pamqp, so it is left to pamqp, not decoded here."""
    shallow = _nested_header_frame(frame_decode.MAX_DEPTH)
    assert frame_decode.decoded(bytearray(shallow), 0, len(shallow)) is not None
    assert _same(shallow)
    # Whether pamqp then decodes it or runs out of stack depends on the recursion limit and
    # on how deep the caller's stack already is: its outcome, either way, is the frame's.
    deep = _nested_header_frame(600)
    assert frame_decode.decoded(bytearray(deep), 0, len(deep)) is None


def test_split_frames_hands_over_the_same_frames_with_or_without_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    properties = commands.Basic.Properties(headers={"x-user-id": "u", "n": 7}, message_id="m")
    stream = b"".join(
        pamqp.frame.marshal(frame, 1)
        for frame in (
            commands.Basic.Deliver("ctag", 1, False, "telecom", "telecom.usage_record"),
            header.ContentHeader(0, 4, properties),
            body.ContentBody(b"0123"),
            commands.Basic.Ack(5, True),
        )
    )
    fast = [(n, c, _fields(f)) for n, c, f in split_frames(bytearray(stream))]
    monkeypatch.setattr("infra.rabbit.wire.frames._fast", None)
    slow = [(n, c, _fields(f)) for n, c, f in split_frames(bytearray(stream))]
    assert fast == slow
    assert len(fast) == 4


def test_the_pinned_pamqp_is_one_frame_decode_was_checked_against() -> None:
    """An upgrade of pamqp must be checked against frame_decode (and added to TESTED_PAMQP)
    before it ships: otherwise consumers silently lose the cheaper decoding."""
    with open("constraints.txt") as pins:
        pinned = next(line for line in pins if line.startswith("pamqp=="))
    assert pinned.strip().split("==")[1] in frame_decode.TESTED_PAMQP


def test_install_leaves_every_frame_to_pamqp_with_a_pamqp_it_was_not_checked_against(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # aiormq as before any install (restored after the test, as test_frames does).
    connection = aiormq.connection
    monkeypatch.setattr(connection, "FrameReceiver", frames.BufferedFrameReceiver.__mro__[1])
    monkeypatch.setattr(connection, "FrameGenerator", frames.CoalescingFrameGenerator.__mro__[1])
    monkeypatch.setattr(connection.Connection, "FRAME_BUFFER_SIZE", 10)
    monkeypatch.setattr(connection, "Channel", aiormq.Channel)
    monkeypatch.setattr(frames, "_fast", frame_decode.decoded)
    monkeypatch.setattr(
        frames, "version", lambda name: "9.9.9" if name == "pamqp" else version(name)
    )
    assert frames.install() is True  # the rest is installed: it depends on aiormq only
    assert frames._fast is None
