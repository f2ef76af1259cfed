"""The relay's ear for new outbox rows: a Postgres connection that LISTENs on the outbox's
channel and sets an event on each NOTIFY. Polling covers for it while it is missing."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
import structlog

from infra.postgres.pool import connect as connect_postgres
from infra.settings import Settings

log = structlog.get_logger(__name__)

NOTIFY_CHANNEL = "pkgq_outbox"


class OutboxListener:
    def __init__(self, settings: Settings, wake: asyncio.Event) -> None:
        """`wake` is set on each NOTIFY."""
        self._settings = settings
        self._wake = wake
        self._connection: asyncpg.Connection | None = None

    async def ensure(self) -> None:
        """Listen, unless already listening; a failure is logged and left to the poll."""
        if self._connection is not None and not self._connection.is_closed():
            return
        try:
            self._connection = await connect_postgres(
                self._settings.postgres_dsn,
                server_settings=self._settings.postgres_session(),
                dead_peer_timeout=self._settings.dead_peer_timeout,
            )
            await self._connection.add_listener(NOTIFY_CHANNEL, self._on_notify)
        except Exception as exc:  # noqa: BLE001  (polling covers for a missing listener)
            log.warning("listen_failed", error=repr(exc))
            self._connection = None

    async def drop(self) -> None:
        """Stop listening (after a failed round: the next wave listens afresh)."""
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close(timeout=2)
            self._connection = None

    def _on_notify(self, *_: object) -> None:
        self._wake.set()
