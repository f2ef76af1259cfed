"""AMQP frames read and written in chunks, deliveries handed over inline: aiormq, made cheaper.

Reading. aiormq (7.2) reads every frame with three `readexactly` calls under a lock into a
BytesIO, and a delivery is three frames (method, content header, body). On a consumer draining
a backlog that was about a quarter of `pkgq run`'s CPU (py-spy). `BufferedFrameReceiver` reads
what the socket has (up to READ_SIZE bytes) and cuts every whole frame out of it, decoding each
to the pamqp objects aiormq expects (a delivery's three frames by infra/rabbit/wire/frame_decode.py,
at about a third of pamqp's cost; any other frame by pamqp itself); a partial frame waits in the
buffer for the next read.

Only the connection's frame loop (the `async for` in aiormq's reader task) goes through the
buffer. The handshake before it (protocol header, Connection.Start .. OpenOk) calls
`get_frame`, which stays aiormq's own exact reads, so nothing is read ahead of the loop and the
handshake's errors (a refused protocol, a closed socket) are aiormq's as before.

Writing. aiormq's writer task writes each queued ChannelFrame (a publish: its method, header
and body frames) with its own `write`, which on a loopback socket is a send call each, the
broker's receiving side included: about a fifth of the relay's CPU. `CoalescingFrameGenerator`
hands the writer everything queued at that moment as one ChannelFrame (until about WRITE_SIZE),
in queue order; a frame that closes the connection or whose sender waits for the drain ends the
run, and the merged frame carries its flag, so the writer drains and tells it as before. The
writer's queue holds up to WRITE_QUEUE frames instead of aiormq's ten, so that a relay round's
publishes are queued together rather than one per wake-up of the writer. Measured on 10,000
concurrent confirmed publishes: 104 -> 85 CPU µs per message in the publisher, and 87 -> 63 in
RabbitMQ (fewer, larger reads).

Delivering. aiormq's channel starts a Task for every delivery to run the consumer's callback
(about 8% of a draining consumer's CPU). A callback marked `called_inline` (pkgq's
consumers put the delivery into their buffer and have it taken ahead of its batch: decoded,
without any I/O) is called by `InlineDeliveryChannel` in the
channel's reader task itself, in delivery order; any other callback gets its Task as before,
and without the channel class installed it is called from that Task.

`install()` makes aiormq build its connections and channels with all of these; `connect` calls
it, once per process (infra/rabbit/connection.py). The pinned aiormq is the one they were
written and tested against (tests/unit/test_frames.py: the same bytes as aiormq's own receiver,
cut at every offset; the same bytes written in the same order; tests/integration/
test_frame_reads.py against the broker); a different aiormq keeps its own and says so.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from importlib.metadata import version

import aiormq
import aiormq.abc
import aiormq.connection
import pamqp.frame
import structlog
from aiormq.abc import ChannelFrame
from aiormq.exceptions import AMQPConnectionError
from pamqp import commands as spec
from pamqp.exceptions import PAMQPException

from infra.rabbit.wire import frame_decode

log = structlog.get_logger(__name__)

READ_SIZE = 2**16
"""Bytes asked of the socket at once (what the stream has buffered, up to this)."""
WRITE_SIZE = 2**18
"""Bytes of queued frames after which a write stops merging (it may pass this by one frame)."""
WRITE_QUEUE = 1024
"""ChannelFrames a connection queues for its writer before a publish waits (aiormq's
Connection.FRAME_BUFFER_SIZE, 10 by default). A publish waits for room holding its channel's
lock, so once the queue is full the channel's publishes go one per wake-up of the writer, one
write each: the queue holds more than a relay round's publishes (PKGQ_RELAY_BATCH_SIZE, 200 by
default), whose frames are already in memory as the round's rows."""
TESTED_AIORMQ = ("7.2.4",)
"""The aiormq versions whose internals these replace were checked against: FrameReceiver (the
handshake's get_frame, the reader task's `async for` of (bytes, channel, frame)),
FrameGenerator (the writer task's ChannelFrames, their drain and close), Connection's
FRAME_BUFFER_SIZE and Channel's `_on_deliver_frame`."""
_fast: Callable[[bytearray, int, int], aiormq.connection.ReceivedFrame | None] | None = (
    frame_decode.decoded
)
"""A delivery's frames decoded without pamqp's decoder; None (pamqp for every frame) when the
installed pamqp is not one frame_decode was checked against (see `install`)."""
_HEADER = struct.Struct(">BHI")
_FRAME_END = 0xCE


class BufferedFrameReceiver(aiormq.connection.FrameReceiver):
    """aiormq's FrameReceiver whose iteration parses whole frames from chunked reads."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        super().__init__(reader)
        self._pending: bytearray = bytearray()
        self._frames: deque[aiormq.connection.ReceivedFrame] = deque()

    async def __anext__(self) -> aiormq.connection.ReceivedFrame:
        while not self._frames:
            await self._fill()
        return self._frames.popleft()

    async def _fill(self) -> None:
        """Queue the whole frames in the buffer (a bad frame left there by the last call
        raises now), else read once and queue those. The end of the stream is always
        AMQPConnectionError, as when aiormq's own reader meets it inside `readexactly`: a
        connection that closes cleanly ends with Close-Ok, where aiormq's reader stops by
        itself, so an end of stream means the broker or the network went away (the futures
        waiting on the connection fail with that error, which pkgq counts as an outage)."""
        if self._pending:
            self._frames.extend(split_frames(self._pending))
            if self._frames:
                return
        try:
            chunk = await self.reader.read(READ_SIZE)
        except (ConnectionError, OSError) as exc:
            raise AMQPConnectionError(f"Server communication error: {exc!r}") from exc
        if not chunk:
            raise AMQPConnectionError(
                "Server connection unexpectedly closed "
                f"({len(self._pending)} bytes of a frame were read)"
            )
        self.started = True
        self._pending += chunk
        self._frames.extend(split_frames(self._pending))


def split_frames(pending: bytearray) -> list[aiormq.connection.ReceivedFrame]:
    """Decode and remove every whole frame at the start of `pending`; a partial one stays.
    A frame that does not decode raises InvalidFrameError when it is the first; after good
    frames, those are returned and it stays at the start, to raise on the next call (so the
    frames before it are handled first, as aiormq's one-frame-at-a-time reader would)."""
    frames: list[aiormq.connection.ReceivedFrame] = []
    offset = 0
    size = len(pending)
    while size - offset >= _HEADER.size:
        _, _, length = _HEADER.unpack_from(pending, offset)
        end = offset + _HEADER.size + length + 1
        if end > size:
            break
        try:
            frames.append(_decoded(pending, offset, end))
        except aiormq.exceptions.InvalidFrameError:
            if frames:
                break
            raise
        offset = end
    del pending[:offset]
    return frames


def _decoded(pending: bytearray, start: int, end: int) -> aiormq.connection.ReceivedFrame:
    """The frame in pending[start:end]: a delivery's three frames by frame_decode, any other by
    pamqp, as aiormq does (InvalidFrameError if it is not one)."""
    if pending[end - 1] != _FRAME_END:
        raise aiormq.exceptions.InvalidFrameError("a frame does not end with 0xCE")
    frame = _fast(pending, start, end) if _fast is not None else None
    if frame is not None:
        return frame
    try:
        return pamqp.frame.unmarshal(bytes(pending[start:end]))
    except PAMQPException as exc:
        raise aiormq.exceptions.InvalidFrameError(str(exc)) from exc


class InlineDeliveryChannel(aiormq.Channel):
    """aiormq's Channel that calls a consumer callback marked `called_inline` (pkgq's
    infra/rabbit/deliveries.Handover) in its reader task, without a Task of its own."""

    async def _on_deliver_frame(self, frame: spec.Basic.Deliver) -> None:
        tag = frame.consumer_tag
        consumer = self.consumers.get(tag) if tag is not None else None
        # basic_consume keeps a synchronous callback wrapped (aiormq.tools.awaitable).
        inline = getattr(consumer, "__wrapped__", None)
        if not getattr(inline, "called_inline", False):
            await super()._on_deliver_frame(frame)
            return
        header = await self._Channel__get_content_header()  # type: ignore[attr-defined]
        inline(await self._read_content(frame, header))  # type: ignore[misc]


class CoalescingFrameGenerator(aiormq.connection.FrameGenerator):
    """aiormq's FrameGenerator (what its writer task iterates) handing over every frame queued
    at the moment as one."""

    async def __anext__(self) -> ChannelFrame:
        if self.close_event.is_set():
            raise StopAsyncIteration
        queue = self.queue
        last: ChannelFrame = await queue.get()
        queue.task_done()
        if _ends_run(last) or queue.empty():
            return last
        parts = [last.payload]
        size = len(last.payload)
        while size < WRITE_SIZE and not queue.empty():
            last = queue.get_nowait()
            queue.task_done()
            parts.append(last.payload)
            size += len(last.payload)
            if _ends_run(last):
                break
        return ChannelFrame(
            payload=b"".join(parts), should_close=last.should_close, drain_future=last.drain_future
        )


def _ends_run(frame: ChannelFrame) -> bool:
    """A frame after which nothing is merged: it closes the connection, or its sender waits
    until it is written (the writer drains and tells it)."""
    return frame.should_close or frame.drain_future is not None


def install() -> bool:
    """Have aiormq read frames with BufferedFrameReceiver, hand its writer frames through
    CoalescingFrameGenerator with a WRITE_QUEUE-frame queue, and make InlineDeliveryChannels
    (idempotent: all four or none). False, with a warning, when the installed aiormq is not
    one they were tested against."""
    current = aiormq.connection.FrameReceiver
    if current is BufferedFrameReceiver:
        return True
    installed = version("aiormq")
    if installed not in TESTED_AIORMQ:
        log.warning(
            "frame_receiver_not_installed",
            aiormq=installed,
            tested=list(TESTED_AIORMQ),
        )
        return False
    global _fast  # set once, at install, like the classes below
    if version("pamqp") not in frame_decode.TESTED_PAMQP:
        log.warning(
            "frame_decode_not_used", pamqp=version("pamqp"), tested=list(frame_decode.TESTED_PAMQP)
        )
        _fast = None
    aiormq.connection.FrameReceiver = BufferedFrameReceiver  # type: ignore[misc]
    aiormq.connection.FrameGenerator = CoalescingFrameGenerator  # type: ignore[misc]
    aiormq.connection.Connection.FRAME_BUFFER_SIZE = WRITE_QUEUE
    aiormq.connection.Channel = InlineDeliveryChannel  # type: ignore[attr-defined]
    return True
