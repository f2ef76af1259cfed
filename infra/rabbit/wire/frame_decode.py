"""The three frames of a delivery decoded without pamqp's generic decoder, to the same objects.

A consumer draining a backlog spent about a fifth of its CPU in pamqp's `frame.unmarshal`: each
field is decoded by a lookup of its type by name and a copy of the rest of the frame, about 45
µs for a delivery's Basic.Deliver, content header and body here. `decoded` reads the same bytes
with precompiled structs and offsets into the one buffer, and builds the same pamqp objects with
the same attribute values that pamqp's own unmarshalling leaves (objects made empty, their
fields then set, with no validation: what pamqp does).

It takes only what it can read exactly as pamqp would, and returns None for anything else, which
pamqp then decodes as before (its result, or its error, for that frame): any frame but these
three, a content header of another class or with a second flag word, a header table holding a
type other than the plain ones below (a nested table is fine; an array, a decimal, a float, a
byte array or an unnamed void goes to pamqp), a string or table running past its frame, text
that is not UTF-8. tests/unit/test_frame_decode.py checks it against pamqp on generated frames.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from pamqp import body, commands, header

TESTED_PAMQP = ("4.0.1",)
"""The pamqp versions whose objects (Basic.Deliver's and Basic.Properties' slots, their flags)
this builds were checked against; with another, infra/rabbit/wire/frames.install leaves it
unused."""
_FRAME = struct.Struct(">BHI")
_METHOD_INDEX = struct.Struct(">I")
_LONGLONG = struct.Struct(">q")
_HEADER_START = struct.Struct(">HHQH")
_LONG = struct.Struct(">I")
_TIMESTAMP = struct.Struct(">Q")

_DELIVER = commands.Basic.Deliver
_DELIVER_INDEX = _DELIVER.index
_PROPERTIES = commands.Basic.Properties
_BASIC_CLASS = _PROPERTIES.frame_id
_SHORTSTR = "shortstr"
_FIELDS: tuple[tuple[str, int, str], ...] = tuple(
    (name, _PROPERTIES.flags[name], getattr(_PROPERTIES, "_" + name))
    for name in _PROPERTIES.__slots__
)
_DEFAULTS: dict[str, Any] = {name: getattr(_PROPERTIES(), name) for name in _PROPERTIES.__slots__}
_SCALARS: dict[int, tuple[struct.Struct, bool]] = {
    ord("I"): (struct.Struct(">l"), False),
    ord("i"): (struct.Struct(">L"), False),
    ord("l"): (_LONGLONG, False),
    ord("L"): (_LONGLONG, False),
    ord("s"): (struct.Struct(">h"), False),
    ord("u"): (struct.Struct(">H"), False),
    ord("b"): (struct.Struct(">b"), False),
    ord("B"): (struct.Struct(">B"), False),
    ord("t"): (struct.Struct(">B"), True),
}
"""Header table types read by one struct: (its struct, whether the value is a bool)."""
MAX_DEPTH = 32
"""Tables nested deeper than this are left to pamqp: its decoder recurses twice per level, so
it runs out of stack (RecursionError) at about half the depth a single recursion would, and
a frame must fail, or not, as it does with pamqp."""


class _UnsureError(Exception):
    """Not a frame this module reads exactly as pamqp: pamqp decodes it."""


def decoded(buffer: bytearray, start: int, end: int) -> tuple[int, int, Any] | None:
    """The frame in buffer[start:end] (whole, ending in 0xCE) as pamqp's `frame.unmarshal`
    returns it: (bytes used, channel, frame); None when pamqp should decode it."""
    kind, channel, size = _FRAME.unpack_from(buffer, start)
    if not size:
        return None  # pamqp refuses a frame of no size (a heartbeat is its own type)
    payload = start + 7
    stop = payload + size
    try:
        if kind == 3:
            return end - start, channel, body.ContentBody(bytes(buffer[payload:stop]))
        if kind == 1:
            return end - start, channel, _deliver(buffer, payload, stop)
        if kind == 2:
            return end - start, channel, _content_header(buffer, payload, stop)
    except (_UnsureError, struct.error, UnicodeDecodeError, ValueError, OverflowError, OSError):
        return None
    return None


def _deliver(buffer: bytearray, at: int, stop: int) -> Any:
    if stop - at < 4 or _METHOD_INDEX.unpack_from(buffer, at)[0] != _DELIVER_INDEX:
        raise _UnsureError
    at += 4
    consumer_tag, at = _shortstr(buffer, at, stop)
    if at + 9 > stop:
        raise _UnsureError
    (delivery_tag,) = _LONGLONG.unpack_from(buffer, at)
    redelivered = bool(buffer[at + 8] & 1)
    exchange, at = _shortstr(buffer, at + 9, stop)
    routing_key, _ = _shortstr(buffer, at, stop)
    frame = _DELIVER.__new__(_DELIVER)
    frame.consumer_tag = consumer_tag
    frame.delivery_tag = delivery_tag
    frame.redelivered = redelivered
    frame.exchange = exchange
    frame.routing_key = routing_key
    return frame


def _content_header(buffer: bytearray, at: int, stop: int) -> Any:
    if stop - at < 14:
        raise _UnsureError
    class_id, weight, body_size, flags = _HEADER_START.unpack_from(buffer, at)
    if class_id != _BASIC_CLASS or flags & 1:
        raise _UnsureError  # another class's properties, or a second flag word
    at += 14
    properties = _PROPERTIES.__new__(_PROPERTIES)
    value: Any
    for name, flag, kind in _FIELDS:
        if not flags & flag:
            value = _DEFAULTS[name]
        elif kind == _SHORTSTR:
            value, at = _shortstr(buffer, at, stop)
        elif kind == "octet":
            if at >= stop:
                raise _UnsureError
            value = buffer[at]
            at += 1
        elif kind == "table":
            value, at = _table(buffer, at, stop)
        elif kind == "timestamp":
            value, at = _timestamp(buffer, at, stop)
        else:
            raise _UnsureError
        setattr(properties, name, value)
    frame = header.ContentHeader.__new__(header.ContentHeader)
    frame.class_id = class_id
    frame.weight = weight
    frame.body_size = body_size
    frame.properties = properties
    return frame


def _shortstr(buffer: bytearray, at: int, stop: int) -> tuple[str, int]:
    if at >= stop:
        raise _UnsureError
    end = at + 1 + buffer[at]
    if end > stop:
        raise _UnsureError
    return buffer[at + 1 : end].decode("utf-8"), end


def _timestamp(buffer: bytearray, at: int, stop: int) -> tuple[datetime.datetime, int]:
    if at + 8 > stop:
        raise _UnsureError
    (seconds,) = _TIMESTAMP.unpack_from(buffer, at)
    if seconds > 0xFFFFFFFF:  # pamqp's reading: anything beyond 2106 is milliseconds
        seconds /= 1000.0
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC), at + 8


def _table(buffer: bytearray, at: int, stop: int, depth: int = 0) -> tuple[dict[str, Any], int]:
    if at + 4 > stop or depth > MAX_DEPTH:
        raise _UnsureError
    end = at + 4 + _LONG.unpack_from(buffer, at)[0]
    if end > stop:
        raise _UnsureError
    at += 4
    table: dict[str, Any] = {}
    while at < end:
        key_end = at + 1 + buffer[at]
        if key_end >= end:
            raise _UnsureError
        key = buffer[at + 1 : key_end].decode("utf-8")
        kind = buffer[key_end]
        at = key_end + 1
        value: Any
        if kind == 0x53:  # S: a long string
            if at + 4 > end:
                raise _UnsureError
            value_end = at + 4 + _LONG.unpack_from(buffer, at)[0]
            if value_end > end:
                raise _UnsureError
            value = buffer[at + 4 : value_end].decode("utf-8")
            at = value_end
        elif kind in _SCALARS:
            reader, is_bool = _SCALARS[kind]
            if at + reader.size > end:
                raise _UnsureError
            value = reader.unpack_from(buffer, at)[0]
            value = bool(value) if is_bool else value
            at += reader.size
        elif kind == 0x54:  # T: a timestamp
            value, at = _timestamp(buffer, at, end)
        elif kind == 0x46:  # F: a nested table
            value, at = _table(buffer, at, end, depth + 1)
        elif kind == 0x56:  # V: void
            value = None
        else:
            raise _UnsureError
        table[key] = value
    return table, end
