"""A TCP proxy in the test's own event loop, between a client and a real service, that can
freeze the connections it carries: bytes stop flowing both ways but nothing is closed, as with
a node cut off from its cluster by a partition. New connections pass unfrozen (a load balancer
sending them to a healthy node), unless the proxy refuses them."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class _Link:
    frozen: asyncio.Event = field(default_factory=asyncio.Event)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


class FreezingProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._links: list[_Link] = []
        self.refusing = False
        """While set, new connections are closed at once (the service is down)."""
        self.accepted = 0

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> FreezingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    def freeze(self) -> int:
        """Freeze every connection open now; returns how many."""
        live = [link for link in self._links if not link.frozen.is_set()]
        for link in live:
            link.frozen.set()
        return len(live)

    def cut(self) -> None:
        """Close every connection open now, as a node that dies does (its peer sees a reset)."""
        for link in self._links:
            for writer in link.writers:
                writer.close()
        self._links = []

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for link in self._links:
                for writer in link.writers:
                    writer.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self.accepted += 1
        link = _Link(writers=[writer, up_writer])
        self._links.append(link)
        await asyncio.gather(
            self._pipe(reader, up_writer, link),
            self._pipe(up_reader, writer, link),
            return_exceptions=True,
        )

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link
    ) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if link.frozen.is_set():
                    await asyncio.Event().wait()  # swallowed: hold the socket open, say nothing
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()
