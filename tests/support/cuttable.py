"""A forwarder to the broker in the test's own event loop, whose connections a test can stop
answering and then cut at a moment it chooses (a reset with a call in flight): what
tests/support/netproxy.py does from outside, without a namespace, for a single client."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit, urlunsplit

QUEUE_DECLARE = b"\x00\x32\x00\x0a"
"""An AMQP method frame's class and method ids: Queue.Declare."""


class Cuttable:
    """A forwarder to the broker in the test's own event loop. `hold()`: from then on nothing
    passes either way (what the client sends is kept in `held`, nothing answers it); `cut()`:
    every connection it forwarded is aborted, as a reset is, and traffic passes again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._writers: list[asyncio.StreamWriter] = []
        self._holding = False
        self.held: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Cuttable:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()

    def url(self, amqp_url: str) -> str:
        parts = urlsplit(amqp_url)
        credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{credentials}127.0.0.1:{self.port}"))

    def hold(self) -> None:
        self._holding = True

    def cut(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()
        self._holding = False

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
        except OSError:  # the broker itself is away: so is this connection
            client_w.transport.abort()
            return
        self._writers += [client_w, server_w]
        await asyncio.gather(
            self._pipe(client_r, server_w, upstream=True),
            self._pipe(server_r, client_w, upstream=False),
            return_exceptions=True,
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        while chunk := await reader.read(65536):
            if self._holding:
                if upstream:
                    self.held.append(chunk)
                continue
            writer.write(chunk)
            await writer.drain()
        writer.close()
