"""consumers/ingest.py against Postgres: a dead letter is always stored, in its full form when
Postgres can take it (a blip runs the filing again), in its safe form when it cannot; an outage
is left to the consumer's loop, and no failure is retried by two loops at once."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from consumers import dead_letter_forms, ingest
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE
from infra.postgres import dead_letters
from infra.transient import is_transient


def dead_delivery(**headers: Any) -> RawDelivery:
    return RawDelivery(
        body=b"{}",
        message_id=str(uuid4()),
        message_type="X",
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={"x-death": [{"reason": "expired", "queue": "q"}], **headers},
        routing_key="telecom.usage_record",
    )


async def stored(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return list(
            await conn.fetch(
                "SELECT headers::text AS headers, reason, error_message FROM telecom.dead_letters"
            )
        )


async def test_the_ingester_keeps_a_message_whose_headers_postgres_refuses_as_text(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Headers are made storable before they reach Postgres; should something still slip
    # through, the ingester must store the message anyway instead of requeueing it for ever.
    monkeypatch.setattr(dead_letter_forms, "jsonable", lambda headers: headers)
    raw = dead_delivery(**{"x-note": "a\x00b"})
    assert [r.fate for r in await ingest.make_ingester(pool)([raw])] == [Fate.DEAD_LETTERED]
    (dead,) = await stored(pool)
    assert "x-pkgq-unstorable-headers" in dead["headers"]
    assert "filed without its headers" in dead["error_message"]


async def test_a_deadlock_while_filing_files_the_letter_again_in_full_not_in_its_safe_form(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Finishing the letter's job can deadlock with a worker finishing the same job: that is a
    # blip, so the whole filing runs again rather than dropping to the headerless safe form.
    real_finish = ingest._finish
    calls: list[str] = []

    async def deadlocks_once(*args: Any, **kwargs: Any) -> None:
        calls.append("finish")
        if len(calls) == 1:
            raise asyncpg.DeadlockDetectedError("deadlock detected")
        await real_finish(*args, **kwargs)

    monkeypatch.setattr(ingest, "_finish", deadlocks_once)
    raw = dead_delivery(**{"x-note": "kept"})
    assert [r.fate for r in await ingest.make_ingester(pool)([raw])] == [Fate.DEAD_LETTERED]
    (dead,) = await stored(pool)  # one letter: the first try's row was rolled back
    assert calls == ["finish", "finish"]
    assert dead["reason"] == "expired"
    assert "kept" in dead["headers"]
    assert "x-pkgq-unstorable-headers" not in dead["headers"]


async def test_a_filing_that_keeps_deadlocking_is_stored_in_full_without_finishing_its_job(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job row locked for good: after the retries the letter is filed anyway (never requeued
    # for ever), with its headers, and only its address and group do not hear.
    calls: list[str] = []

    async def always_deadlocks(*args: Any, **kwargs: Any) -> None:
        calls.append("finish")
        raise asyncpg.DeadlockDetectedError("deadlock detected")

    monkeypatch.setattr(ingest, "_finish", always_deadlocks)
    raw = dead_delivery(**{"x-note": "kept"})
    assert [r.fate for r in await ingest.make_ingester(pool)([raw])] == [Fate.DEAD_LETTERED]
    (dead,) = await stored(pool)
    assert len(calls) == 5  # FILING_TRIES tries in full, then filed without its job
    assert dead["reason"] == "expired"
    assert "kept" in dead["headers"]


async def test_an_outage_while_filing_is_raised_at_once_for_the_consumers_loop_to_wait_out(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ingester does not retry an outage itself: the consumer's until_done does, once.
    calls: list[str] = []

    async def unreachable(*args: Any, **kwargs: Any) -> None:
        calls.append("finish")
        raise ConnectionRefusedError(111, "Connect call failed")

    monkeypatch.setattr(ingest, "_finish", unreachable)
    with pytest.raises(ConnectionRefusedError):
        await ingest.make_ingester(pool)([dead_delivery()])
    assert calls == ["finish"]
    assert await stored(pool) == []


async def test_a_blip_in_the_filing_without_its_job_is_raised_as_no_loops_to_retry(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After the tries in full, the filing without its job is tried once; a blip there is not
    # handed to the consumer's loop as a blip (it would run all the tries again).
    calls: list[bool] = []
    real_bury = dead_letters.bury

    async def always_deadlocks(*args: Any, **kwargs: Any) -> None:
        raise asyncpg.DeadlockDetectedError("deadlock detected")

    async def bury_then_deadlock_without_finishing(conn: Any, dead: Any) -> int:
        calls.append(True)
        if len(calls) > ingest.FILING_TRIES:
            raise asyncpg.DeadlockDetectedError("deadlock detected")
        return int(await real_bury(conn, dead))

    monkeypatch.setattr(ingest, "_finish", always_deadlocks)
    monkeypatch.setattr(dead_letters, "bury", bury_then_deadlock_without_finishing)
    with pytest.raises(ingest.FilingFailedError) as raised:
        await ingest.make_ingester(pool)([dead_delivery()])
    assert isinstance(raised.value.__cause__, asyncpg.DeadlockDetectedError)
    # the tries in full, then once without its job, and that once more in its safe form
    assert len(calls) == ingest.FILING_TRIES + 2
    assert not is_transient(raised.value)


async def test_a_broker_dead_letter_sent_again_with_a_new_death_time_is_filed_once(
    pool: asyncpg.Pool,
) -> None:
    # After a node is killed, a quorum queue re-sends a death whose confirm was lost, stamped
    # anew; a killed ingester's copy comes back with the dead-letter queue's delivery count.
    first = dead_delivery()
    death = {"reason": "expired", "queue": "q", "count": 1}
    copies = [
        dataclasses.replace(first, headers={"x-death": [{**death, "time": at}], **extra})
        for at, extra in [
            (datetime(2026, 11, 27, 10, 0, 1, tzinfo=UTC), {}),
            (datetime(2026, 11, 27, 10, 0, 19, tzinfo=UTC), {}),
            (datetime(2026, 11, 27, 10, 0, 19, tzinfo=UTC), {"x-delivery-count": 1}),
        ]
    ]
    ingester = ingest.make_ingester(pool)
    for copy in copies:
        assert [r.fate for r in await ingester([copy])] == [Fate.DEAD_LETTERED]
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT repeats, reason FROM telecom.dead_letters WHERE message_id = $1",
            first.message_id,
        )
    assert [(r["repeats"], r["reason"]) for r in rows] == [(2, "expired")]
