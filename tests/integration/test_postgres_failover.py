"""Postgres failover, against the real dev server:

- a multi-host DSN (`127.0.0.1:1,127.0.0.1:5432`: the first host dead, as an old primary is
  during a failover) connects, creates and migrates its database, and what explains a failed
  connection names every host instead of raising;
- a process started while no host answers waits, and starts as soon as one does: woken by the
  process's probe, not by its back-off (which these tests make an hour long), as is work that
  an outage interrupts. "Answers" is a Gate: a port that refuses connections (nothing listens)
  until it is opened, then forwards them to the dev server;
- a server that stops taking writes (a demoted primary; here `ALTER DATABASE ... SET
  default_transaction_read_only = on` on the test's own database) has the pool's connections
  dropped, so that once the database takes writes again they are made afresh and the write
  succeeds; the consumer pipeline waits it out and applies its batch on a fresh connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import runtime
from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.runtime import services
from consumers.worker import Services
from domain.delivery import Fate
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra import transient
from infra.postgres.migrate import ensure_database, migrate
from infra.postgres.pool import (
    connect,
    create_pool,
    database,
    forget_if_demoted,
    watch_for_recovery,
    writable,
)
from infra.settings import Settings
from infra.tls import parse_postgres_dsn, postgres_target
from infra.transient import is_demotion, is_outage, probe_can_tell, recovery, until_done
from tests.conftest import PG_SERVER
from tests.support.deliveries import raw_for
from tests.support.observing import eventually, fetch

FOREVER = 3600.0
"""A back-off no test waits out: whatever resumes was woken by the probe."""
GUARD = 60.0
"""How long a test lets something take before it fails it as hung (not a timing claim)."""
DEAD = "127.0.0.1:1"
"""A host where nothing listens: the old primary."""
SERVER_HOST, SERVER_PORT = parse_postgres_dsn(PG_SERVER).hosts[0]


def _dsn(hosts: str, db: str, query: str = "target_session_attrs=read-write") -> str:
    user = PG_SERVER.split("://", 1)[1].rpartition("@")[0]
    return f"postgresql://{user}@{hosts}/{db}" + (f"?{query}" if query else "")


def _db(settings: Settings) -> str:
    return parse_postgres_dsn(settings.postgres_dsn).database


class Gate:
    """A port on 127.0.0.1 that refuses connections while shut (nothing listens there, as on a
    host whose Postgres is down) and forwards them to the dev server while open. Shutting it
    cuts the connections it forwards."""

    def __init__(self) -> None:
        self.port = 0
        self.forwarded = 0
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()

    async def reserve(self) -> None:
        """Take a free port and leave it shut."""
        server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)

    async def shut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for stream in list(self._streams):
            stream.close()
        self._streams.clear()

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(SERVER_HOST, int(SERVER_PORT))
        except OSError:
            writer.close()
            return
        self.forwarded += 1
        self._streams |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()
                self._streams.discard(sink)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@pytest.fixture
async def gate() -> AsyncIterator[Gate]:
    gate = Gate()
    await gate.reserve()
    yield gate
    await gate.shut()


async def _probes(at_least: int) -> None:
    """Until the process's probe has tried (and failed) `at_least` times."""

    async def probed() -> bool:
        return recovery().probes >= at_least

    await eventually(probed, within=GUARD, every=0.05)


@contextlib.asynccontextmanager
async def _read_only(db: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The database refuses writes to every session started from now on (a demoted primary,
    as pkgq's new connections see it); the context gives the call that makes it writable
    again (the new primary), and makes it writable on the way out in any case."""
    admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
    try:
        await admin.execute(f"ALTER DATABASE {db} SET default_transaction_read_only = on")

        async def promote() -> None:
            await admin.execute(f"ALTER DATABASE {db} RESET default_transaction_read_only")

        try:
            yield promote
        finally:
            await promote()
    finally:
        await admin.close()


async def test_a_multi_host_dsn_whose_first_host_is_dead_connects_creates_and_migrates(
    settings: Settings,
) -> None:
    dsn = _dsn(f"{DEAD},{SERVER_HOST}:{SERVER_PORT}", _db(settings))
    assert postgres_target(dsn).address == f"{DEAD},{SERVER_HOST}:{SERVER_PORT}"
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            assert await writable(conn)
    finally:
        await pool.close()
    assert not await ensure_database(dsn)  # it exists: found through the second host
    async with database(dsn) as conn:
        assert await migrate(conn) == []  # the template's schema is complete
    fresh = f"pkgq_t_failover_{uuid4().hex[:8]}"
    try:
        assert await ensure_database(_dsn(f"{DEAD},{SERVER_HOST}:{SERVER_PORT}", fresh))
    finally:
        admin = await asyncpg.connect(f"{PG_SERVER}/postgres")
        try:
            await admin.execute(f"DROP DATABASE IF EXISTS {fresh}")
        finally:
            await admin.close()


async def test_no_host_answering_a_multi_host_dsn_is_an_outage_to_wait_out_not_a_value_error(
    settings: Settings,
) -> None:
    dsn = _dsn(f"{DEAD},127.0.0.1:2", _db(settings))
    with pytest.raises(ConnectionRefusedError) as refused:  # not the explainer's ValueError
        await connect(dsn)
    assert is_outage(refused.value)
    assert probe_can_tell(refused.value)


async def test_a_process_started_while_no_host_answers_starts_once_one_does_woken_by_the_probe(
    settings: Settings,
    gate: Gate,
    amqp: AbstractRobustConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime, "STARTUP_FIRST_PAUSE_S", FOREVER)
    monkeypatch.setattr(runtime, "STARTUP_LONGEST_PAUSE_S", FOREVER)
    gated = settings.model_copy(
        update={"postgres_dsn": _dsn(f"{DEAD},127.0.0.1:{gate.port}", _db(settings))}
    )
    started: asyncio.Future[Services] = asyncio.get_running_loop().create_future()
    leave = asyncio.Event()

    async def process() -> None:
        async with services(gated, "failover", wait_seconds=2 * FOREVER) as svc:
            started.set_result(svc)
            await leave.wait()

    running = asyncio.create_task(process())
    try:
        await _probes(2)
        assert not started.done()  # waiting, not crashed: the DSN names two hosts
        await gate.open()
        svc = await asyncio.wait_for(asyncio.shield(started), GUARD)
        assert recovery().recoveries == 1
        async with svc.pool.acquire() as conn:
            assert await writable(conn)
        assert await fetch(
            svc.pool, "SELECT role FROM telecom.workers WHERE id = $1", svc.worker_id
        ) == [{"role": "failover"}]
    finally:
        leave.set()
        await asyncio.wait_for(running, GUARD)


async def test_work_cut_off_by_an_outage_resumes_once_the_server_answers_woken_by_the_probe(
    settings: Settings, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transient, "OUTAGE_FIRST_PAUSE_S", FOREVER)
    monkeypatch.setattr(transient, "OUTAGE_LONGEST_PAUSE_S", FOREVER)
    await gate.open()
    dsn = _dsn(f"{DEAD},127.0.0.1:{gate.port}", _db(settings))
    watch_for_recovery(dsn)
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            before = await conn.fetchval("SELECT pg_backend_pid()")
        await gate.shut()  # the server goes away, with the pool's connection

        async def work() -> int:
            async with pool.acquire() as conn:
                pid: int = await conn.fetchval("SELECT pg_backend_pid()")
                return pid

        waiting = asyncio.create_task(until_done(work, asyncio.Event()))
        await _probes(2)
        assert not waiting.done()
        await gate.open()
        after = await asyncio.wait_for(waiting, GUARD)
        assert after != before  # on a new connection
        assert recovery().recoveries == 1
    finally:
        await pool.close()


async def test_a_pool_drops_its_connections_to_a_read_only_server_and_writes_once_it_is_writable(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    db = _db(settings)
    async with pool.acquire() as conn:
        await conn.execute("CREATE TABLE public.failover_writes (n int)")
    async with _read_only(db) as promote:
        demoted = await create_pool(settings.postgres_dsn, min_size=1, max_size=1)
        try:
            pids = []
            for _ in range(2):
                async with demoted.acquire() as conn:
                    pids.append(conn.get_server_pid())
                    with pytest.raises(asyncpg.ReadOnlySQLTransactionError) as refused:
                        await conn.execute("INSERT INTO public.failover_writes VALUES (1)")
            # The problem: the pool hands the same read-only connection out again.
            assert pids[0] == pids[1]
            assert is_demotion(refused.value)
            assert await forget_if_demoted(demoted, refused.value)
            assert not await forget_if_demoted(demoted, ConnectionRefusedError(111, "refused"))
            await promote()
            async with demoted.acquire() as conn:
                assert conn.get_server_pid() != pids[0]  # a new connection
                await conn.execute("INSERT INTO public.failover_writes VALUES (2)")
        finally:
            await demoted.close()
    assert await fetch(pool, "SELECT n FROM public.failover_writes") == [{"n": 2}]


async def test_the_pipeline_waits_out_a_read_only_server_and_applies_on_a_fresh_connection(
    settings: Settings, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transient, "OUTAGE_FIRST_PAUSE_S", FOREVER)
    monkeypatch.setattr(transient, "OUTAGE_LONGEST_PAUSE_S", FOREVER)
    user = uuid4()
    delivery = raw_for(USAGE_RECORD, RecordUsage(user_id=user, upload=7, download=0))
    async with _read_only(_db(settings)) as promote:
        demoted = await create_pool(settings.postgres_dsn, min_size=1, max_size=1)
        try:
            watch_for_recovery(settings.postgres_dsn)
            async with demoted.acquire() as conn:
                before = conn.get_server_pid()
                assert not await writable(conn)
            pipeline = DeliveryPipeline(
                demoted, USAGE_RECORD, usage_record.handle, RetryPolicy(), max_body_bytes=2**20
            )
            waiting = asyncio.create_task(
                until_done(lambda: pipeline.process_batch([delivery]), asyncio.Event())
            )
            await _probes(2)  # each finds the server read-only
            assert not waiting.done()
            await promote()
            (result,) = await asyncio.wait_for(waiting, GUARD)
            assert result.fate is Fate.ACKED
            assert recovery().recoveries == 1
            async with demoted.acquire() as conn:
                assert conn.get_server_pid() != before
        finally:
            await demoted.close()
    assert await fetch(
        pool, "SELECT unbilled_upload FROM telecom.queue_users WHERE user_id = $1", user
    ) == [{"unbilled_upload": 7}]
