"""Each test's own database and broker names, made and removed off the test's path.

A CREATE DATABASE from the template takes about 0.4 s here and its DROP 0.2 s; removing a
test's exchange and queues, a broker round trip or two more. A test would wait for all of it.
Instead, one thread per pytest worker (with an event loop of its own) makes the next test's
database while the current test runs, and drops each used database and deletes its broker
names after its test. The thread takes its work in order, so the database a test waits for
is never queued behind another test's clean-up that was asked for later.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar
from uuid import uuid4

import asyncpg

T = TypeVar("T")


class TestDatabases:
    __test__ = False  # not a test class, whatever its name says

    def __init__(
        self,
        admin_dsn: str,
        create_sql: Callable[[str], str],
        clean_up_broker: Callable[[str], Awaitable[None]],
    ) -> None:
        """`create_sql(name)`: the statement that makes a database called `name`;
        `clean_up_broker(name)`: deletes what a test declared under that namespace."""
        self._admin_dsn = admin_dsn
        self._create_sql = create_sql
        self._clean_up_broker = clean_up_broker
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="pkgq-test-databases")
        self._next: Future[None] | None = None
        self._next_name: str | None = None
        self._removals: list[Future[None]] = []

    def take(self) -> str:
        """A fresh database's name (made ahead, or now), and the next one started. One made
        ahead can have failed (a restart test of this worker stopped Postgres meanwhile): then
        it is made now."""
        name = self._next_name or self._start()
        try:
            assert self._next is not None
            self._next.result()
        except Exception:  # noqa: BLE001  (see above; a second failure is the test's error)
            self.give_back(name)  # in case it was made before the connection broke
            name = self._start()
            assert self._next is not None
            self._next.result()
        self._start()
        return name

    def _start(self) -> str:
        """Start making the next database (its name is known at once)."""
        self._next_name = f"pkgq_t_{uuid4().hex[:12]}"
        name = self._next_name
        self._next = self._thread.submit(self._run, lambda: self._create(name))
        return name

    def give_back(self, name: str) -> None:
        """Drop the database and delete the broker names after the test (not waited for)."""
        self._removals.append(self._thread.submit(self._run, lambda: self._remove(name)))

    def close(self) -> None:
        """Drop the database made ahead (made or not), and wait for every clean-up asked for
        (a failed one is a warning: the session's end removes the broker names again, and a
        database left behind keeps its roles, which the session warns about too)."""
        if self._next is not None and self._next_name is not None:
            self._next.exception()  # made or failed: either way it is over
            self.give_back(self._next_name)
            self._next = None
            self._next_name = None
        self._thread.shutdown(wait=True)
        for removal in self._removals:
            if removal.exception() is not None:
                warnings.warn(f"a test's clean-up failed: {removal.exception()!r}", stacklevel=1)

    @staticmethod
    def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run(work())

    async def _create(self, name: str) -> None:
        admin = await asyncpg.connect(self._admin_dsn)
        try:
            await admin.execute(self._create_sql(name))
        finally:
            await admin.close()

    async def _remove(self, name: str) -> None:
        admin = await asyncpg.connect(self._admin_dsn)
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await admin.close()
        await self._clean_up_broker(name)
