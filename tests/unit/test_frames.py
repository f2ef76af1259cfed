"""AMQP frames cut from chunked reads (infra/rabbit/frames.py) are aiormq's frames, whatever the
chunks; a broken stream is a connection error, as with aiormq's own receiver."""

from __future__ import annotations

import asyncio

import aiormq.connection
import pamqp.frame
import pytest
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import body as content
from pamqp import commands, header, heartbeat

from infra.rabbit import frames
from infra.rabbit.frames import BufferedFrameReceiver, split_frames


def _stream() -> bytes:
    """A delivery with nested headers and a body in two frames, a heartbeat, an ack, a close."""
    properties = commands.Basic.Properties(
        content_type="application/json",
        message_id="m-1",
        headers={"x-user-id": "u", "nested": {"deep": [1, 2, {"k": "v"}]}, "n": 7},
        delivery_mode=2,
    )
    parts: list[tuple[int, object]] = [
        (1, commands.Basic.Deliver("ctag", 1, False, "telecom", "telecom.usage_record")),
        (1, header.ContentHeader(0, 10, properties)),
        (1, content.ContentBody(b"0123")),
        (1, content.ContentBody(b"456789")),
        (0, heartbeat.Heartbeat()),
        (2, commands.Basic.Ack(5, True)),
        (1, commands.Channel.Close(404, "NOT_FOUND", 0, 0)),
    ]
    return b"".join(pamqp.frame.marshal(frame, channel) for channel, frame in parts)  # type: ignore[arg-type]


def _key(received: aiormq.connection.ReceivedFrame) -> tuple[int, int, bytes]:
    consumed, channel, frame = received
    return consumed, channel, pamqp.frame.marshal(frame, channel)


class _Chunks:
    """A socket's reads: the given chunks, one per read, then the end of the stream."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = [c for c in chunks if c]  # a socket's read is empty only at the end

    async def read(self, n: int) -> bytes:
        await asyncio.sleep(0)
        return self._chunks.pop(0)[:n] if self._chunks else b""


async def _aiormq_frames(data: bytes) -> list[tuple[int, int, bytes]]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    receiver = aiormq.connection.FrameReceiver(reader)
    received = []
    while not reader.at_eof():
        received.append(_key(await receiver.get_frame()))
    return received


async def _buffered_frames(chunks: list[bytes]) -> list[tuple[int, int, bytes]]:
    receiver = BufferedFrameReceiver(_Chunks(chunks))  # type: ignore[arg-type]
    return [_key(frame) async for frame in receiver]


async def test_the_buffered_receiver_yields_aiormqs_frames_wherever_the_reads_cut_the_stream() -> (
    None
):
    data = _stream()
    expected = await _aiormq_frames(data)
    assert len(expected) == 7
    for cut in range(len(data) + 1):
        assert await _buffered_frames([data[:cut], data[cut:]]) == expected, cut
    assert await _buffered_frames([data[i : i + 1] for i in range(len(data))]) == expected


def test_split_frames_leaves_a_partial_frame_in_the_buffer() -> None:
    data = _stream()
    pending = bytearray(data[:-3])
    decoded = split_frames(pending)
    assert len(decoded) == 6
    assert bytes(pending) == data[len(data) - len(pending) - 3 : -3]
    assert pending[0] == 1  # a method frame's type byte: the close, waiting for its end


async def test_a_stream_that_ends_inside_a_frame_is_a_connection_error() -> None:
    data = _stream()
    receiver = BufferedFrameReceiver(_Chunks([data[:-5]]))  # type: ignore[arg-type]
    with pytest.raises(AMQPConnectionError, match="unexpectedly closed"):
        async for _ in receiver:
            pass


async def test_a_frame_without_its_end_byte_is_an_invalid_frame() -> None:
    data = bytearray(pamqp.frame.marshal(commands.Basic.Ack(1, False), 1))
    data[-1] = 0x00
    receiver = BufferedFrameReceiver(_Chunks([bytes(data)]))  # type: ignore[arg-type]
    with pytest.raises(InvalidFrameError, match="0xCE"):
        await receiver.__anext__()


async def test_a_socket_error_while_reading_is_a_connection_error() -> None:
    class Reset:
        async def read(self, n: int) -> bytes:
            raise ConnectionResetError("reset by peer")

    receiver = BufferedFrameReceiver(Reset())  # type: ignore[arg-type]
    with pytest.raises(AMQPConnectionError, match="reset by peer"):
        await receiver.__anext__()


def test_install_replaces_aiormqs_receiver_only_for_a_tested_aiormq(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = aiormq.connection.FrameReceiver
    monkeypatch.setattr(aiormq.connection, "FrameReceiver", original)
    if original is BufferedFrameReceiver:  # installed by an earlier test's connection
        monkeypatch.setattr(aiormq.connection, "FrameReceiver", original.__mro__[1])
    monkeypatch.setattr(frames, "version", lambda _: "0.0.1")
    assert frames.install() is False
    assert aiormq.connection.FrameReceiver is not BufferedFrameReceiver
    monkeypatch.undo()
    monkeypatch.setattr(aiormq.connection, "FrameReceiver", original)
    assert frames.install() is True
    assert frames.install() is True
    assert aiormq.connection.FrameReceiver is BufferedFrameReceiver


def test_the_pinned_aiormq_is_one_the_receiver_was_tested_against() -> None:
    """An upgrade of aiormq must be checked against this receiver (and added to TESTED_AIORMQ)
    before it ships: otherwise consumers silently lose the cheaper reads."""
    with open("constraints.txt") as pins:
        pinned = next(line for line in pins if line.startswith("aiormq=="))
    assert pinned.strip().split("==")[1] in frames.TESTED_AIORMQ
