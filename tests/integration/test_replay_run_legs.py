"""A replay run's runner that was taken for gone (it stopped writing past STALE_AFTER_S: a frozen
or suspended process) and wakes after `--resume` started a new leg stops by itself, sending
nothing and writing nothing of the run's state: the new leg's runner drives the run and ends it.
Real PostgreSQL."""

from __future__ import annotations

import asyncpg

from consumers import replay_runner
from consumers.replay_runner import RunOptions
from infra.postgres import replay_runs
from tests.support.dead_letters import buried
from tests.support.observing import fetch


async def test_a_runner_that_wakes_after_its_run_was_resumed_stops_and_leaves_the_new_leg_alone(
    pool: asyncpg.Pool,
) -> None:
    ids = [await buried(pool) for _ in range(3)]
    async with pool.acquire() as conn:
        run_id = await replay_runner.start(conn, ids, "olga", description="three letters")
        row = await replay_runs.get(conn, run_id)
    assert row is not None
    options = RunOptions(who="olga", pkgq_user="pkgq", verdict_wait_s=0)
    first = replay_runner._Run(pool.acquire, row, options, lambda _: None)
    async with pool.acquire() as conn:
        # Its runner stopped writing (frozen): the run is stale, and an operator resumes it.
        await conn.execute(
            "UPDATE telecom.replay_runs SET heartbeat_at = now() - interval '2 minutes' "
            "WHERE id = $1",
            run_id,
        )
        await replay_runner.resume(conn, run_id, "ivan")

    outcome = await first.drive()  # the first runner wakes up

    assert outcome.progress.state == replay_runner.SUPERSEDED
    (stored,) = await fetch(
        pool, "SELECT state, leg, sent FROM telecom.replay_runs WHERE id = $1", run_id
    )
    assert (stored["state"], stored["leg"], stored["sent"]) == ("running", 2, 0)
    replayed = await fetch(
        pool, "SELECT count(*) AS n FROM telecom.outbox WHERE dedup_key LIKE 'replay:%'"
    )
    assert replayed[0]["n"] == 0  # it sent nothing: the letters are the new leg's to send
