"""`pkgq doctor` and `pkgq dlq release-hold` as an operator runs them (real `pkgq` processes on
the test's database and broker names): doctor is clean on a fresh database, names an orphaned
hold made by hand and exits 8; the release drains what was parked behind the hold, is audited,
and doctor is clean again; a hold with a way out is not released."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from consumers.cli import exit_codes
from events.routes import USAGE_RECORD
from infra.postgres import invariants
from infra.settings import Settings
from tests.integration.failure_helpers import billed, no_holds_left, usage
from tests.support.dead_letters import buried
from tests.support.in_process import InProcess
from tests.support.observing import eventually, fetch
from tests.support.processes import cli


async def orphaned_hold(pool: asyncpg.Pool, user: UUID | None = None) -> tuple[UUID, UUID]:
    """A hold on usage_record made by hand, on a random blocker: (user, blocker)."""
    user, blocker = user or uuid4(), uuid4()
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state, attempts, last_error) "
            "VALUES ('usage_record', $1, $2, 'retrying', 3, 'lost in a test')",
            user,
            blocker,
        )
    return user, blocker


async def test_doctor_exits_0_on_a_fresh_database_and_says_every_invariant_holds(
    settings: Settings,
) -> None:
    done = await cli(settings, "doctor")
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    assert "every invariant holds" in done.stdout
    as_json = await cli(settings, "doctor", "--json")
    assert as_json.returncode == exit_codes.OK, as_json.stderr
    checks = json.loads(as_json.stdout)
    assert [c["check"] for c in checks] == [c.name for c in invariants.CHECKS]
    assert all(c["ok"] and c["violations"] == 0 for c in checks)


async def test_doctor_names_an_orphaned_hold_made_by_hand_and_exits_non_zero(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    user, blocker = await orphaned_hold(pool)
    done = await cli(settings, "doctor")
    assert done.returncode == exit_codes.VIOLATIONS, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if f"user_id={user}" in x)
    assert "consumer=usage_record" in line
    assert f"blocker={blocker}" in line
    assert "pkgq dlq release-hold" in done.stdout  # what to do about it

    as_json = await cli(settings, "doctor", "--json")
    assert as_json.returncode == exit_codes.VIOLATIONS
    hold = next(c for c in json.loads(as_json.stdout) if c["check"] == "hold_without_way_out")
    assert hold["violations"] == 1
    assert hold["sample"][0]["user_id"] == str(user)
    assert hold["sample"][0]["blocker"] == str(blocker)
    # What it found is stored as the check's last result, for the console's overview.
    async with pool.acquire() as conn:
        stored = {r.check: r for r in await invariants.stored(conn)}
    assert stored["hold_without_way_out"].violations == 1


async def test_the_cli_releases_an_orphaned_hold_audited_its_parked_message_is_applied(
    app: InProcess, fast: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    await app.start_consumers([USAGE_RECORD])
    user, blocker = await orphaned_hold(pool)
    message_id = await usage(fast, amqp, user, 7)

    async def parked() -> bool:
        rows = await fetch(pool, "SELECT sent_as FROM telecom.parked WHERE user_id = $1", user)
        return [r["sent_as"] for r in rows] == [message_id]

    await eventually(parked)  # behind the hold, which nothing will ever release
    assert (await cli(fast, "doctor")).returncode == exit_codes.VIOLATIONS

    released = await cli(
        fast, "dlq", "release-hold", "--consumer", "usage_record", "--user", str(user),
        "--blocker", str(blocker), "--by", "ops-olga",
    )  # fmt: skip
    assert released.returncode == exit_codes.OK, released.stdout + released.stderr
    assert f"blocker {blocker}" in released.stdout
    assert "1 parked message(s)" in released.stdout

    await billed(pool, user, 7)  # the consumer's release poll applied the parked usage
    await no_holds_left(pool)
    (audit,) = await fetch(pool, "SELECT *, detail::text AS detail FROM telecom.operator_actions")
    assert (audit["actor"], audit["action"], audit["user_id"], audit["message_id"]) == (
        "ops-olga",
        "release_hold",
        user,
        blocker,
    )
    detail = json.loads(audit["detail"])
    assert (detail["consumer"], detail["parked"], detail["state"]) == (
        "usage_record",
        1,
        "retrying",
    )

    clean = await cli(fast, "doctor")
    assert clean.returncode == exit_codes.OK, clean.stdout


async def test_a_hold_with_a_way_out_is_released_with_a_warning_and_one_named_wrongly_is_not(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    """Nothing anyone publishes can make an operator's release refuse: a hold whose blocker lies
    buried is released, with a warning of what stays behind (its dead letter, still buried)."""
    user, blocker = uuid4(), uuid4()
    await buried(pool, message_id=str(blocker), user_id=user)
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO telecom.holds (consumer, user_id, blocker, state) "
            "VALUES ('usage_record', $1, $2, 'buried')",
            user,
            blocker,
        )
    released = await cli(
        settings, "dlq", "release-hold", "--consumer", "usage_record", "--user", str(user)
    )
    assert released.returncode == exit_codes.OK, released.stdout + released.stderr
    assert f"warning: message {blocker} lies buried" in released.stdout
    assert not await fetch(pool, "SELECT 1 FROM telecom.holds WHERE blocker IS NOT NULL")
    (letter,) = await fetch(pool, "SELECT status::text AS status FROM telecom.dead_letters")
    assert letter["status"] == "buried"  # to be replayed or discarded, after what it held
    (audit,) = await fetch(pool, "SELECT detail::text AS detail FROM telecom.operator_actions")
    assert "lies buried" in json.loads(audit["detail"])["warning"]

    # A message_id alone matches nothing: the hold is named by its consumer and user.
    elsewhere = await cli(
        settings, "dlq", "release-hold", "--consumer", "package_cancel", "--user", str(user)
    )
    assert elsewhere.returncode == exit_codes.NOT_FOUND
    assert "no hold on consumer 'package_cancel'" in elsewhere.stderr

    orphan_user, _ = await orphaned_hold(pool)
    stale = await cli(
        settings, "dlq", "release-hold", "--consumer", "usage_record",
        "--user", str(orphan_user), "--blocker", str(uuid4()), "--json",
    )  # fmt: skip
    assert stale.returncode == exit_codes.FAILED
    assert json.loads(stale.stdout)["released"] is False
    assert len(await fetch(pool, "SELECT * FROM telecom.operator_actions")) == 1  # the first
