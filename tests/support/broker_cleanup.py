"""Deleting what a test declared on the broker, after it, on one kept connection.

A test's namespace is its database's name; `declare_all` declares its dead-letter exchange
before anything else, so a namespace without one holds nothing the test's settings name (a
test that declared only under other names, or deleted that exchange and kept the rest, is swept
at the session's end: conftest's `broker_leftovers`). About half the tests never touch
the broker: for them the clean-up is one passive declare instead of every route's deletes, and
no test pays for a connection of its own (tens of milliseconds of CPU on each side)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import ChannelNotFoundEntity

from infra.rabbit.topology import delete_all
from infra.settings import Settings


class BrokerCleanup:
    def __init__(self, url: str, settings_of: Callable[[str], Settings]) -> None:
        """`settings_of(namespace)`: the settings a test with that namespace had."""
        self._url = url
        self._settings_of = settings_of
        self._connection: AbstractConnection | None = None

    async def __call__(self, namespace: str) -> None:
        """Delete the namespace's queues and exchanges, if it declared any."""
        settings = self._settings_of(namespace)
        try:
            await self._clean(settings)
        except Exception:  # noqa: BLE001  (a second failure is raised)
            # The broker restarted (a restart test) or the connection broke: once more, anew.
            with contextlib.suppress(Exception):
                await self.close()
            self._connection = None
            await asyncio.sleep(1)
            await self._clean(settings)

    async def _clean(self, settings: Settings) -> None:
        if self._connection is None or self._connection.is_closed:
            self._connection = await aio_pika.connect(
                self._url, client_properties={"connection_name": "pkgq-test-cleanup"}, timeout=5
            )
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            try:
                await channel.get_exchange(settings.dlx, ensure=True)
            except ChannelNotFoundEntity:
                return  # never declared (the broker closed the channel)
            await delete_all(channel, settings)
        finally:
            if not channel.is_closed:
                await channel.close()

    async def close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            if not connection.is_closed:
                await connection.close()
