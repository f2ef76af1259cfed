"""AMQP frames cut from chunked reads (infra/rabbit/wire/frames.py) are aiormq's frames,
whatever the chunks; a broken stream is a connection error, as with aiormq's own receiver."""

from __future__ import annotations

import asyncio
from importlib.metadata import version

import aiormq.connection
import pamqp.frame
import pytest
from aiormq.abc import ChannelFrame
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import body as content
from pamqp import commands, header, heartbeat

from infra.rabbit.wire import frames
from infra.rabbit.wire.frames import (
    BufferedFrameReceiver,
    CoalescingFrameGenerator,
    InlineDeliveryChannel,
    split_frames,
)


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
        if not self._chunks:
            return b""
        assert len(self._chunks[0]) <= n, "a chunk larger than a read"
        return self._chunks.pop(0)


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
    """The frames until the stream ends (which is a connection error, as in aiormq's reader:
    a connection that closes cleanly stops at Close-Ok, before the end of its stream)."""
    receiver = BufferedFrameReceiver(_Chunks(chunks))  # type: ignore[arg-type]
    received = []
    with pytest.raises(AMQPConnectionError, match="unexpectedly closed"):  # noqa: PT012
        async for frame in receiver:
            received.append(_key(frame))
    return received


async def test_the_buffered_receiver_yields_aiormqs_frames_wherever_the_reads_cut_the_stream() -> (
    None
):
    data = _stream()
    expected = await _aiormq_frames(data)
    assert len(expected) == 7
    for cut in range(len(data) + 1):
        assert await _buffered_frames([data[:cut], data[cut:]]) == expected, cut
    assert await _buffered_frames([data[i : i + 1] for i in range(len(data))]) == expected


async def test_the_stream_ending_between_frames_is_a_connection_error_not_a_clean_end() -> None:
    data = pamqp.frame.marshal(commands.Basic.Ack(1, False), 1)
    receiver = BufferedFrameReceiver(_Chunks([data]))  # type: ignore[arg-type]
    assert _key(await receiver.__anext__())[1] == 1
    with pytest.raises(AMQPConnectionError, match=r"unexpectedly closed \(0 bytes"):
        await receiver.__anext__()


async def test_the_frames_before_a_bad_one_are_handed_over_first_then_it_raises() -> None:
    good = pamqp.frame.marshal(commands.Basic.Ack(5, True), 2)
    bad = bytearray(pamqp.frame.marshal(commands.Basic.Ack(6, True), 2))
    bad[-1] = 0x00
    receiver = BufferedFrameReceiver(_Chunks([good + good + bytes(bad)]))  # type: ignore[arg-type]
    assert [_key(await receiver.__anext__()) for _ in range(2)] == [
        _key((len(good), 2, commands.Basic.Ack(5, True)))
    ] * 2
    with pytest.raises(InvalidFrameError, match="0xCE"):
        await receiver.__anext__()


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
    with pytest.raises(AMQPConnectionError, match=r"unexpectedly closed \([1-9]"):
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
    receiver = aiormq.connection.FrameReceiver
    generator = aiormq.connection.FrameGenerator
    buffer = aiormq.connection.Connection.FRAME_BUFFER_SIZE
    channel = aiormq.connection.Channel  # type: ignore[attr-defined]
    # As aiormq has them before any install (an earlier test's connection may have made one).
    monkeypatch.setattr(aiormq.connection, "FrameReceiver", BufferedFrameReceiver.__mro__[1])
    monkeypatch.setattr(aiormq.connection, "FrameGenerator", CoalescingFrameGenerator.__mro__[1])
    monkeypatch.setattr(aiormq.connection.Connection, "FRAME_BUFFER_SIZE", 10)
    monkeypatch.setattr(aiormq.connection, "Channel", aiormq.Channel)
    monkeypatch.setattr(frames, "version", lambda _: "0.0.1")
    assert frames.install() is False
    assert aiormq.connection.FrameReceiver is not BufferedFrameReceiver
    assert aiormq.connection.FrameGenerator is not CoalescingFrameGenerator
    assert aiormq.connection.Connection.FRAME_BUFFER_SIZE == 10
    assert aiormq.connection.Channel is aiormq.Channel  # type: ignore[attr-defined]
    monkeypatch.setattr(frames, "version", version)  # the installed aiormq: 7.2.4
    assert frames.install() is True
    assert frames.install() is True
    assert aiormq.connection.FrameReceiver is BufferedFrameReceiver
    assert aiormq.connection.FrameGenerator is CoalescingFrameGenerator
    assert aiormq.connection.Connection.FRAME_BUFFER_SIZE == frames.WRITE_QUEUE
    assert aiormq.connection.Channel is InlineDeliveryChannel  # type: ignore[attr-defined]
    monkeypatch.undo()  # back to what the process had (installed or not)
    assert (aiormq.connection.FrameReceiver, aiormq.connection.FrameGenerator) == (
        receiver,
        generator,
    )
    assert buffer == aiormq.connection.Connection.FRAME_BUFFER_SIZE
    assert aiormq.connection.Channel is channel  # type: ignore[attr-defined]


def test_the_pinned_aiormq_is_one_the_receiver_was_tested_against() -> None:
    """An upgrade of aiormq must be checked against this receiver (and added to TESTED_AIORMQ)
    before it ships: otherwise consumers silently lose the cheaper reads."""
    with open("constraints.txt") as pins:
        pinned = next(line for line in pins if line.startswith("aiormq=="))
    assert pinned.strip().split("==")[1] in frames.TESTED_AIORMQ


def _frame(payload: bytes, *, close: bool = False, drain: bool = False) -> ChannelFrame:
    future = asyncio.get_running_loop().create_future() if drain else None
    return ChannelFrame(payload=payload, should_close=close, drain_future=future)


async def _generated(frames_in: list[ChannelFrame]) -> list[ChannelFrame]:
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue()
    for frame in frames_in:
        queue.put_nowait(frame)
    generator = CoalescingFrameGenerator(queue)
    out = []
    while not queue.empty():
        out.append(await generator.__anext__())
    return out


async def test_the_writer_gets_every_queued_frame_as_one_write_in_queue_order() -> None:
    (merged,) = await _generated([_frame(b"a"), _frame(b"bb"), _frame(b"ccc")])
    assert merged.payload == b"abbccc"
    assert not merged.should_close
    assert merged.drain_future is None


async def test_a_frame_whose_sender_waits_for_the_drain_ends_the_write_and_keeps_its_future() -> (
    None
):
    waited = _frame(b"b", drain=True)
    first, second = await _generated([_frame(b"a"), waited, _frame(b"c")])
    assert (first.payload, second.payload) == (b"ab", b"c")
    assert first.drain_future is waited.drain_future
    assert first.should_drain
    assert second.drain_future is None


async def test_a_closing_frame_ends_the_write_and_a_waiting_first_frame_goes_alone() -> None:
    closing = await _generated([_frame(b"a"), _frame(b"x", close=True), _frame(b"b")])
    assert [f.payload for f in closing] == [b"ax", b"b"]
    assert [f.should_close for f in closing] == [True, False]
    alone = await _generated([_frame(b"a", drain=True), _frame(b"b")])
    assert [f.payload for f in alone] == [b"a", b"b"]


async def test_a_write_stops_merging_once_it_has_write_size_bytes() -> None:
    half = frames.WRITE_SIZE // 2 + 1
    out = await _generated([_frame(bytes([n]) * half) for n in range(3)])
    assert [len(f.payload) for f in out] == [2 * half, half]
    assert b"".join(f.payload for f in out) == b"".join(bytes([n]) * half for n in range(3))


async def test_a_closed_generator_ends_the_writer_loop() -> None:
    queue: asyncio.Queue[ChannelFrame] = asyncio.Queue()
    generator = CoalescingFrameGenerator(queue)
    generator.close_event.set()
    with pytest.raises(StopAsyncIteration):
        await generator.__anext__()
