"""Cheap statistics: the status refresh of every process and the console's overview
read no growing table row by row, and what they show stays meaningful: counters exact, counts
exact up to stats.EXACT_UP_TO, estimates past it marked as such (infra/postgres/stats.py)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection
from asyncpg.connection import LoggedQuery

from consumers import runtime
from consumers.job_stats import route_stats
from consumers.runtime import start_status_server
from consumers.worker import Services
from events.routes import ROUTES
from infra.postgres import stats, transitions
from infra.postgres.pool import create_pool
from infra.settings import Settings
from tests.support import big_tables
from tests.support.dead_letters import buried
from tests.support.observing import eventually
from tests.support.processes import free_port, http_get
from tests.web.client import VIEWER_PASSWORD, client, sign_in

BIG = 1_000_000
"""The inbox's rows: the table whose count every process's refresh used to scan."""
OTHERS = int(os.environ.get("PKGQ_BIG_ROWS", "200000"))
"""Rows in each other growing table (outbox, dead letters, holds, parked): 200,000 keeps the
suite's time; PKGQ_BIG_ROWS=1000000 fills them to a million too (the plans are the same)."""
CONSUMERS = [route.short_name for route in ROUTES.values()]
SCANS = ("Seq Scan", "Parallel Seq Scan", "Bitmap Heap Scan")
"""Plan nodes that read a table's rows beyond what an index range bounds."""


class Statements:
    """A query logger (`create_pool(query_logger=…)`) keeping each statement with its
    arguments, so that it can be explained as it ran."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, record: LoggedQuery) -> None:
        if isinstance(record.args, tuple):  # an executemany's list: none on these paths
            self.seen.append((record.query, record.args))

    def reads(self) -> list[tuple[str, tuple[Any, ...]]]:
        """The distinct reads (the pool's reset on release is several commands, and reads no
        table: it cannot be explained)."""
        found: dict[str, tuple[str, tuple[Any, ...]]] = {}
        for query, args in self.seen:
            text = query.strip()
            if text.upper().startswith(("SELECT", "WITH")) and ";" not in text.rstrip(";"):
                found.setdefault(query + repr(args), (query, args))
        return list(found.values())


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _explained(
    conn: asyncpg.Connection, reads: list[tuple[str, tuple[Any, ...]]]
) -> list[tuple[str, dict[str, Any]]]:
    plans = []
    for query, args in reads:
        found = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + query, *args))
        plans.append((" ".join(query.split())[:100], found[0]))
    return plans


def _gauges(text: str, name: str, state: str) -> dict[str, float]:
    found = re.findall(rf'^{name}{{route="([^"]+)",state="{state}"}} (\S+)$', text, re.M)
    return {route: float(value) for route, value in found}


async def test_the_status_refresh_and_the_overview_read_million_row_tables_only_by_index(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with pool.acquire() as conn:
        await big_tables.fill(conn, BIG, CONSUMERS, others=OTHERS)
    for _ in range(3):  # and a few that the figures count, filed as pkgq files them
        await buried(pool, "telecom.usage_record")

    # The refresh, as a process runs it: its own pool, with every statement logged.
    refreshed = Statements()
    real_create_pool = create_pool

    async def logged_pool(*args: Any, **kwargs: Any) -> asyncpg.Pool:
        return await real_create_pool(*args, query_logger=refreshed, **kwargs)

    monkeypatch.setattr(runtime, "create_pool", logged_pool)
    port = free_port()
    served = settings.model_copy(
        update={"http_port": port, "http_host": "127.0.0.1", "metrics_refresh_interval": 0.2}
    )
    server = await start_status_server(served, lambda: True, Services(pool, amqp))
    assert server is not None
    metrics: list[str] = []
    try:

        async def refreshed_once() -> bool:
            _, text = await http_get(port, "/metrics")
            metrics[:] = [text]
            zombies = _gauges(text, "pkgq_job_messages", "zombie")
            return sum(zombies.get(f"telecom.{c}", 0) for c in CONSUMERS) > BIG / 2

        await eventually(refreshed_once, within=60)
    finally:
        await server.stop()

    # The overview, as the console serves it, on a pool that logs its statements.
    shown = Statements()
    web_pool = await create_pool(settings.postgres_dsn, min_size=1, max_size=2, query_logger=shown)
    try:
        async with client(settings, web_pool) as http:
            assert (await sign_in(http, "vic", VIEWER_PASSWORD)).status_code == 303
            page = await http.get("/overview/live")
            assert page.status_code == 200
    finally:
        await web_pool.close()

    explainer = await asyncpg.connect(settings.postgres_dsn)
    try:
        plans = await _explained(explainer, refreshed.reads() + shown.reads())
    finally:
        await explainer.close()
    scanned = [
        (statement, node["Node Type"], node["Relation Name"])
        for statement, plan in plans
        for node in _nodes(plan["Plan"])
        if node["Node Type"] in SCANS and node.get("Relation Name") in big_tables.FILLED
    ]
    assert scanned == []
    assert [statement for statement, plan in plans if "JIT" in plan] == []
    read = {
        node.get("Relation Name")
        for _, plan in plans
        for node in _nodes(plan["Plan"])
        if node["Node Type"] in ("Index Scan", "Index Only Scan")
    }
    assert set(big_tables.FILLED) <= read  # every big table was read: through an index
    # And the figures mean what they say: the kept records estimated near their million, the
    # buried dead letters counted exactly (not one of the million replayed ones).
    zombies = _gauges(metrics[0], "pkgq_job_messages", "zombie")
    assert sum(zombies.get(f"telecom.{c}", 0) for c in CONSUMERS) == pytest.approx(BIG, rel=0.1)
    assert 'pkgq_dead_letters{route="telecom.usage_record"} 3.0' in metrics[0]
    assert re.search(r'<tr data-route="usage_record">\s*<td>usage_record</td>', page.text)


async def test_a_figure_past_the_cap_is_estimated_from_statistics_and_marked_as_such(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    many, few = 3 * stats.EXACT_UP_TO, 5
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.inbox (consumer, message_id) "
            "SELECT CASE WHEN g <= $1 THEN 'usage_record' ELSE 'package_purchase' END, "
            "gen_random_uuid() FROM generate_series(1, $1::int + $2::int) AS g",
            many,
            few,
        )
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, body, "
            "available_at) SELECT gen_random_uuid(), 'telecom.package_expiring', 'X', 1, '{}', "
            "now() + interval '1 day' + g * interval '1 s' FROM generate_series(1, $1) AS g",
            many,
        )
        await conn.execute("ANALYZE telecom.inbox, telecom.outbox")
        found = await stats.per_route(conn)
        table = await route_stats(settings, conn)
    usage, purchase = found.of("telecom.usage_record"), found.of("telecom.package_purchase")
    assert usage["kept"] == pytest.approx(many, rel=0.1)
    assert found.estimated["telecom.usage_record"] == {"kept"}
    assert purchase["kept"] == few  # under the cap: counted, exactly
    assert "telecom.package_purchase" not in found.estimated
    expiring = found.of("telecom.package_expiring")
    assert expiring["scheduled"] == pytest.approx(many, rel=0.1)
    assert expiring["pending"] == 0
    assert table["telecom.package_expiring"]["estimated"] == ["scheduled", "waiting"]
    assert table["telecom.usage_record"]["estimated"] == ["zombie"]
    assert table["telecom.package_purchase"]["estimated"] == []


async def test_buried_dead_letters_per_route_follow_every_way_in_and_out_of_buried(
    pool: asyncpg.Pool,
) -> None:
    async def figures() -> tuple[dict[str, int], dict[str, int]]:
        async with pool.acquire() as conn:
            shown = (await stats.backlog(conn)).buried_by_route
            truth = await conn.fetch(
                "SELECT route, count(*) AS n FROM telecom.dead_letters "
                "WHERE status = 'buried' GROUP BY route"
            )
        return shown, {r["route"]: int(r["n"]) for r in truth}

    messages = [str(uuid4()) for _ in range(4)]
    users = [uuid4() for _ in messages]  # a message is its id and its user (its key)
    ids = [
        await buried(pool, "telecom.usage_record", message_id=m, user_id=u)
        for m, u in zip(messages, users, strict=True)
    ]
    expired = await buried(pool, "telecom.package_activate", reason="expired")
    shown, truth = await figures()
    assert shown == truth == {"telecom.usage_record": 4, "telecom.package_activate": 1}
    async with pool.acquire() as conn:
        await conn.execute(
            "UPDATE telecom.dead_letters SET status = 'replayed' WHERE id = $1", ids[0]
        )
        await conn.execute(
            "UPDATE telecom.dead_letters SET status = 'discarded' WHERE id = $1", ids[1]
        )
        await conn.execute("DELETE FROM telecom.dead_letters WHERE id = $1", expired)  # purged
        undone = conn.transaction()  # buried again, then rolled back: never counted
        await undone.start()
        await conn.execute(
            "UPDATE telecom.dead_letters SET status = 'buried' WHERE id = $1", ids[1]
        )
        await undone.rollback()
    shown, truth = await figures()
    assert shown == truth == {"telecom.usage_record": 2}
    # Filed again as pkgq files a failure (one upsert): the replayed message's new failure is a
    # letter of its own (the replayed one stays a record of the replay), the buried one stays
    # buried and counts once, a new one comes in as expired.
    await buried(pool, "telecom.usage_record", message_id=messages[0], user_id=users[0])
    await buried(pool, "telecom.usage_record", message_id=messages[2], user_id=users[2])
    await buried(pool, "telecom.usage_record", reason="expired")
    shown, truth = await figures()
    assert shown == truth == {"telecom.usage_record": 4}
    async with pool.acquire() as conn:
        per_route = await stats.per_route(conn)
    usage = per_route.of("telecom.usage_record")
    assert (usage["dead_letters"], usage["expired"]) == (3, 1)
    # every usage_record dead letter was filed just now: the four, the replayed message's new
    # letter, the expired one
    assert usage["failed_1m"] == 6


async def test_processed_in_the_last_minute_counts_the_acks_of_the_last_sixty_seconds_only(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    route = "telecom.usage_record"
    async with pool.acquire() as conn:
        await transitions.count(conn, {(route, "ack"): 3, (route, "take"): 3})
        assert await transitions.last_minute(conn, "ack") == {route: 3}
        # A minute on, the same second's bucket holds the older count: it is past the minute,
        # and a new count in that bucket starts again from it.
        await conn.execute("UPDATE telecom.transition_seconds SET at = at - 60")
        assert await transitions.last_minute(conn, "ack") == {}
        await transitions.count(conn, {(route, "ack"): 2})
        assert await transitions.last_minute(conn, "ack") == {route: 2}
        table = await route_stats(settings, conn)
        totals = await transitions.totals(conn)
    assert table[route]["detail"]["processed_1m"] == 2
    assert totals[route]["ack"] == 5  # the totals keep everything


async def test_due_rows_past_the_cap_show_at_the_cap_and_never_take_the_timers_share(
    pool: asyncpg.Pool,
) -> None:
    """1,200 due queuing rows beside 6,000 scheduled expiry timers: the due figure is the cap,
    marked (at least that many), never a share of the timers; the timers keep theirs."""
    due, later = stats.EXACT_UP_TO + 200, 6 * stats.EXACT_UP_TO
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.outbox (message_id, route, message_type, schema_version, body, "
            "available_at) SELECT gen_random_uuid(), "
            "CASE WHEN g <= $1 THEN 'telecom.package_queuing' ELSE 'telecom.package_expiring' END,"
            " 'X', 1, '{}', CASE WHEN g <= $1 THEN now() - interval '1 minute' "
            "ELSE now() + interval '1 day' END FROM generate_series(1, $1::int + $2::int) AS g",
            due,
            later,
        )
        await conn.execute("ANALYZE telecom.outbox")
        found = await stats.per_route(conn)
    queuing, expiring = found.of("telecom.package_queuing"), found.of("telecom.package_expiring")
    assert queuing["pending"] == stats.EXACT_UP_TO
    assert "pending" in found.estimated["telecom.package_queuing"]
    assert expiring["scheduled"] == pytest.approx(later, rel=0.25)
    assert expiring["pending"] == 0
