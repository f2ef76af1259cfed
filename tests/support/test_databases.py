"""Each test's own database and broker names, made and removed off the test's path.

A CREATE DATABASE from the template takes about 0.4 s here and its DROP 0.2 s; removing a
test's exchange and queues, a broker round trip or two more. A test would wait for all of it.
Instead, one thread per pytest worker (with an event loop of its own, which keeps one
connection to the server's `postgres` database and whatever the broker clean-up keeps) makes
the next test's database while the current test runs, and deletes each used database's broker
names after its test. The thread takes its work in order, so the database a test waits for is
never queued behind another test's clean-up that was asked for later.

A used database is reset and renamed for a later test rather than dropped, when it can be made
exactly as a fresh copy (tests/support/db_state.py: its schema, grants, sequences, planner
statistics and rows all compared with this worker's first database); otherwise it is dropped.
Making and dropping one cost PostgreSQL about 0.13 CPU s, and each DROP DATABASE forces a
checkpoint: 63 requested checkpoints in a whole run with this, against 1,878 counted in
less than one run without. PKGQ_TEST_DB_RECYCLE=0 drops every one.
"""

from __future__ import annotations

import asyncio
import functools
import os
import queue
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar
from uuid import uuid4

import asyncpg

from tests.support import db_state

T = TypeVar("T")


TERMINATE_LEFTOVERS = (
    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)
"""Ends what a test left connected to its database before the reset, waiting 5 s at most for
each (a backend that outlives it makes the database dropped instead of reset)."""


class TestDatabases:
    __test__ = False  # not a test class, whatever its name says

    def __init__(
        self,
        admin_dsn: str,
        create_sql: Callable[[str], str],
        clean_up_broker: Callable[[str], Awaitable[None]],
        close_broker: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`create_sql(name)`: the statement that makes a database called `name`;
        `clean_up_broker(name)`: deletes what a test declared under that namespace;
        `close_broker()`: lets go of what `clean_up_broker` kept open (at `close`). Both run
        on this maker's own event loop."""
        self._admin_dsn = admin_dsn
        self._create_sql = create_sql
        self._clean_up_broker = clean_up_broker
        self._close_broker = close_broker
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pkgq-test-databases", daemon=True
        )
        self._thread.start()
        self._turn: asyncio.Lock | None = None
        """Held by each piece of work in turn (FIFO): the work runs in the order asked for."""
        self._admin_conn: asyncpg.Connection | None = None
        self._next: Future[None] | None = None
        self._next_name: str | None = None
        self._removals: list[Future[None]] = []
        self._recycle = os.environ.get("PKGQ_TEST_DB_RECYCLE", "1") != "0"
        self._reference: db_state.Reference | None = None
        self._free: queue.SimpleQueue[str] = queue.SimpleQueue()
        """Used databases reset to the reference and renamed, ready for a test."""
        self.recycled = 0

    def take(self) -> str:
        """A database as fresh as a new copy: a used one reset (see the module), else one made
        ahead (or now), and then the next one started. One made ahead can have failed (a
        restart test of this worker stopped Postgres meanwhile): then it is made now."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
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
        self._next = self._submit(lambda: self._create(name))
        return name

    def give_back(self, name: str) -> None:
        """Delete the broker names after the test and reset the database for another test, or
        drop it (not waited for)."""
        self._removals.append(self._submit(lambda: self._remove(name)))

    def close(self) -> None:
        """Drop the database made ahead (made or not), and wait for every clean-up asked for
        (a failed one is a warning: the session's end removes the broker names again, and a
        database left behind keeps its roles, which the session warns about too)."""
        if self._next is not None and self._next_name is not None:
            self._next.exception()  # made or failed: either way it is over
            ahead = self._next_name
            self._removals.append(self._submit(lambda: self._drop(ahead)))
            self._next = None
            self._next_name = None
        self._recycle = False
        for removal in list(self._removals):
            removal.exception()  # every reset done: nothing more goes to the free ones
        while True:
            try:
                name = self._free.get_nowait()
            except queue.Empty:
                break
            self._removals.append(self._submit(functools.partial(self._drop, name)))
        self._submit(self._let_go).exception()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        for removal in self._removals:
            if removal.exception() is not None:
                warnings.warn(f"a test's clean-up failed: {removal.exception()!r}", stacklevel=1)

    def _submit(self, work: Callable[[], Coroutine[Any, Any, T]]) -> Future[T]:
        """Run `work()` on this maker's loop, after the work asked for before it."""

        async def in_turn() -> T:
            if self._turn is None:
                self._turn = asyncio.Lock()
            async with self._turn:
                return await work()

        return asyncio.run_coroutine_threadsafe(in_turn(), self._loop)

    async def _let_go(self) -> None:
        try:
            if self._admin_conn is not None:
                conn, self._admin_conn = self._admin_conn, None
                try:
                    await conn.close(timeout=5)
                except Exception:
                    conn.terminate()
                    raise
        finally:
            if self._close_broker is not None:
                await self._close_broker()

    async def _create(self, name: str) -> None:
        await self._admin(self._create_sql(name))
        if self._recycle and self._reference is None:
            conn = await asyncpg.connect(self._dsn_of(name))
            try:
                self._reference = await db_state.reference(conn)
            finally:
                await conn.close()

    async def _remove(self, name: str) -> None:
        try:
            await self._clean_up_broker(name)
        finally:
            # Reset for another test, or dropped, whatever became of the broker's names.
            if self._recycle and self._reference is not None:
                await self._reset_or_drop(name, self._reference)
            else:
                await self._drop(name)

    async def _drop(self, name: str) -> None:
        await self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def _dsn_of(self, name: str) -> str:
        return self._admin_dsn.rsplit("/", 1)[0] + "/" + name

    async def _reset_or_drop(self, name: str, reference: db_state.Reference) -> None:
        """`name` reset and renamed (a fresh name: new broker names too) and put with the free
        ones, or, if it cannot be made exactly as the reference, dropped under whichever of
        the two names it has by then."""
        fresh = f"pkgq_t_{uuid4().hex[:12]}"
        current = name
        try:
            # No one but a superuser (the suite's fixtures, closed by now) connects meanwhile:
            # not a process the test left behind, which the rename then locks out for good.
            await self._admin(f"ALTER DATABASE {name} CONNECTION LIMIT 0")
            conn = await asyncpg.connect(self._dsn_of(name))
            try:
                # From here on no one connects, a superuser (a pool the test leaked) neither
                # (set from another database: not allowed on one's own).
                await self._admin(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
                await conn.execute("SET lock_timeout = '5s'")
                # What the test left connected goes first, waited for (5 s at most).
                await conn.execute(TERMINATE_LEFTOVERS)
                await db_state.reset(conn, reference)
                # Compared on this connection, whose caches the reset warmed (a new one would
                # read the catalogs afresh), and only if nothing else is still connected (a
                # backend that outlived its termination could change it after the digest).
                # Connections are let in again below, after the rename.
                same = await db_state.matches(conn, reference) and not await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            finally:
                await conn.close()
            if same:
                await self._admin(f"ALTER DATABASE {name} RENAME TO {fresh}")
                current = fresh
                await self._admin(
                    f"ALTER DATABASE {fresh} WITH ALLOW_CONNECTIONS true CONNECTION LIMIT -1"
                )
        except Exception:  # noqa: BLE001  (whatever failed, the database is dropped instead)
            same = False
        if same:
            self.recycled += 1
            self._free.put(fresh)
        else:
            await self._drop(current)

    async def _admin(self, sql: str) -> None:
        """`sql` on the kept connection to the `postgres` database, made again when it was
        lost (a restart test stopped the server): a statement that fails mid-way is not run
        again, its work's caller sees the error."""
        if self._admin_conn is None or self._admin_conn.is_closed():
            self._admin_conn = await asyncpg.connect(self._admin_dsn)
        try:
            await self._admin_conn.execute(sql)
        except (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError):
            self._admin_conn.terminate()
            self._admin_conn = None
            raise
