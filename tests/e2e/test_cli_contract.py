"""The CLI's one contract (README, "The command line's contract"): exit statuses with one
meaning each, `--json` wherever a command prints data, `--version`, short route names and a
refusal naming the known routes, and a confirmation (with `--yes` and `--dry-run`) on
destructive commands. Real `pkgq` processes against the test's own database and broker names."""

from __future__ import annotations

import json
import socket
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers.cli import exit_codes
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE, ROUTES
from infra.jobs import Jobs
from infra.postgres import dead_letters
from infra.settings import Settings
from tests.support.dead_letters import buried
from tests.support.deliveries import add_package
from tests.support.processes import cli

pytestmark = pytest.mark.e2e

NO_TERMINAL = ""  # stdin is a pipe with nothing in it: there is no one to ask


async def bury(pool: asyncpg.Pool, route: str = "telecom.usage_record") -> int:
    """A dead letter of `route`, as a consumer files it."""
    return await buried(pool, route)


async def status_of(pool: asyncpg.Pool, dead_letter_id: int) -> str | None:
    async with pool.acquire() as conn:
        status: str | None = await conn.fetchval(
            "SELECT status FROM telecom.dead_letters WHERE id = $1", dead_letter_id
        )
        return status


async def discarded(pool: asyncpg.Pool) -> int:
    """A dead letter discarded already: what `dlq purge` deletes."""
    dead_letter_id = await bury(pool)
    async with pool.acquire() as conn:
        assert await dead_letters.discard(conn, [dead_letter_id], "test") == 1
    return dead_letter_id


async def open_group(pool: asyncpg.Pool) -> UUID:
    package = await add_package(pool, 1000)
    bodies = [PurchasePackage(user_id=uuid4(), package_id=package) for _ in range(3)]
    group = await Jobs(pool).publish_group(PACKAGE_PURCHASE, bodies, name="contract")
    return group.group_id


async def group_state(pool: asyncpg.Pool, group_id: UUID) -> str:
    async with pool.acquire() as conn:
        state: str = await conn.fetchval(
            "SELECT state FROM telecom.job_groups WHERE id = $1", group_id
        )
        return state


async def as_json(settings: Settings, *args: str) -> Any:
    done = await cli(settings, *args, "--json", stdin=NO_TERMINAL)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_every_exit_status_has_one_meaning() -> None:
    codes = [
        exit_codes.OK,
        exit_codes.FAILED,
        exit_codes.USAGE,
        exit_codes.NOT_FOUND,
        exit_codes.DROPPED,
        exit_codes.TIMEOUT,
        exit_codes.MISMATCH,
        exit_codes.NOT_CONFIRMED,
        exit_codes.VIOLATIONS,
        exit_codes.UNREACHABLE,
    ]
    assert codes == list(range(10))
    assert sorted(exit_codes.MEANINGS) == codes
    assert len(set(exit_codes.MEANINGS.values())) == len(codes)


def _closed_port() -> int:
    with socket.socket() as probe:  # bound, never listening: connections are refused
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_command_that_cannot_reach_rabbitmq_says_so_in_one_line_with_status_9(
    settings: Settings,
) -> None:
    broker = f"amqp://guest:guest@127.0.0.1:{_closed_port()}/"
    body = json.dumps({"user_id": str(uuid4()), "package_id": 1})
    done = await cli(settings, "publish", "package_purchase", body, PKGQ_AMQP_URL=broker)
    assert done.returncode == exit_codes.UNREACHABLE, done.stderr
    assert "Traceback" not in done.stderr
    (said,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert said.startswith("error: RabbitMQ did not answer (")
    assert "PKGQ_AMQP_URL" in said


async def test_a_command_that_cannot_reach_postgres_says_so_in_one_line_with_status_9(
    settings: Settings,
) -> None:
    dsn = f"postgresql://pkgq@127.0.0.1:{_closed_port()}/pkgq"
    done = await cli(settings, "dlq", "list", PKGQ_POSTGRES_DSN=dsn)
    assert done.returncode == exit_codes.UNREACHABLE, done.stderr
    assert "Traceback" not in done.stderr
    (said,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert "did not answer (" in said
    assert "PKGQ_POSTGRES_DSN" in said


async def test_version_prints_the_installed_version_and_exits_zero(settings: Settings) -> None:
    done = await cli(settings, "--version")
    assert done.returncode == exit_codes.OK, done.stderr
    name, version = done.stdout.split()
    assert name == "pkgq"
    assert version[0].isdigit()


@pytest.mark.parametrize(
    "args",
    [
        ("publish", "usage_rec", "{}"),
        ("run", "no_such_route"),
        ("dlq", "list", "--route", "telecom.nope"),
        ("dlq", "replay", "--route", "nope", "--dry-run"),
        ("partitions", "status", "nope"),
        ("route", "pause", "nope"),
        ("tail", "--route", "nope"),
    ],
)
async def test_an_unknown_route_is_a_usage_error_that_lists_the_known_ones(
    settings: Settings, args: tuple[str, ...]
) -> None:
    done = await cli(settings, *args)
    assert done.returncode == exit_codes.USAGE
    assert "unknown route" in done.stderr
    for route in ROUTES.values():
        assert route.short_name in done.stderr


async def test_dead_letter_filters_take_the_short_route_name_as_well_as_the_full_one(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    usage = await bury(pool, "telecom.usage_record")
    await bury(pool, "telecom.package_purchase")
    for name in ("usage_record", "telecom.usage_record"):
        listed = await as_json(settings, "dlq", "list", "--route", name)
        assert [r["id"] for r in listed] == [usage]
        dry = await as_json(settings, "dlq", "replay", "--route", name, "--dry-run")
        assert [r["id"] for r in dry] == [usage]
    assert await status_of(pool, usage) == "buried"  # the dry run replayed nothing


@pytest.mark.parametrize(
    "args",
    [
        ("dlq", "show", "999999999"),
        ("dlq", "dig", "999999999"),
        ("catalog", "retire", "999999999"),
        ("catalog", "edit", "999999999", "x", "--traffic", "1GiB"),
        ("group", "show", "00000000-0000-0000-0000-000000000001"),
        ("group", "cancel", "00000000-0000-0000-0000-000000000001", "--yes"),
        ("user", "adjust-quota", "999999999", "5"),
        ("wait", "no-such-address"),
    ],
)
async def test_what_does_not_exist_is_exit_status_3_said_on_stderr(
    settings: Settings, args: tuple[str, ...]
) -> None:
    done = await cli(settings, *args, stdin=NO_TERMINAL)
    assert done.returncode == exit_codes.NOT_FOUND, done.stdout + done.stderr
    assert done.stderr.strip(), "the operator is told what was not found"


async def test_every_command_that_prints_data_prints_json_that_parses(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    routes = await as_json(settings, "routes")
    assert {r["route"] for r in routes} >= set(ROUTES)
    added = await as_json(settings, "catalog", "add", "plan", "--traffic", "1GiB")
    assert (added["name"], added["traffic_limit"], added["duration_s"]) == ("plan", 2**30, None)
    edited = await as_json(
        settings,
        "catalog",
        "edit",
        str(added["id"]),
        "plan2",
        "--traffic",
        "2GiB",
        "--duration",
        "1w",
    )
    assert (edited["name"], edited["duration_s"]) == ("plan2", 7 * 86400)
    listed = await as_json(settings, "catalog", "list")
    assert [p["id"] for p in listed] == [added["id"]]
    retired = await as_json(settings, "catalog", "retire", str(added["id"]))
    assert retired["retired_at"] is not None

    body = json.dumps({"user_id": str(uuid4()), "upload": 1, "download": 1})
    published = await as_json(settings, "publish", "usage_record", body)
    UUID(published["message_id"])
    put = await as_json(settings, "publish", "usage_record", body, "--delay", "1w")
    assert put["queued"] is True
    assert put["available_at"] is not None

    assert (await as_json(settings, "partitions", "status", "usage_record"))["route"] == (
        "telecom.usage_record"
    )
    paused = await as_json(settings, "partitions", "pause", "package_queuing")
    assert (paused["changed"], paused["state"]) == (True, "paused")
    resumed = await as_json(settings, "partitions", "resume", "package_queuing")
    assert (resumed["changed"], resumed["state"]) == (True, "resumed")

    stopped = await as_json(
        settings, "route", "pause", "usage_record", "--reason", "r", "--wait", "0"
    )
    assert (stopped["changed"], stopped["paused"]) == (True, True)
    status = await as_json(settings, "route", "status")
    assert [(r["route"], r["paused"]["reason"]) for r in status if r["paused"]] == [
        ("telecom.usage_record", "r")
    ]
    assert (await as_json(settings, "route", "resume", "usage_record"))["changed"] is True

    group_id = await open_group(pool)
    assert (await as_json(settings, "group", "show", str(group_id)))["state"] == "open"
    assert [g["id"] for g in await as_json(settings, "group", "list")] == [str(group_id)]
    cancelled = await as_json(settings, "group", "cancel", str(group_id), "--yes")
    assert (cancelled["cancelled"], cancelled["withdrawn"]) == (True, 3)

    dead = await bury(pool)
    assert [r["id"] for r in await as_json(settings, "dlq", "list")] == [dead]
    assert (await as_json(settings, "dlq", "show", str(dead)))["id"] == dead
    assert [g["count"] for g in await as_json(settings, "dlq", "groups")] == [1]
    assert await as_json(settings, "dlq", "holds") == []
    assert set(await as_json(settings, "stats")) == set(ROUTES)
    assert await as_json(settings, "workers") == []
    assert (await as_json(settings, "prune", "--dry-run"))["dry_run"] is True
    migrated = await cli(settings, "migrate", "--json")
    assert json.loads(migrated.stdout) == {"applied": []}, migrated.stderr


async def test_user_cancel_and_adjust_quota_print_the_published_message_id_as_json(
    settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    async with pool.acquire() as conn:
        item = await conn.fetchval(
            "INSERT INTO telecom.package_queue (user_id, package_id, status, package_name, "
            "traffic_limit) VALUES ($1, $2, 'in_queue', 'test', 1000) RETURNING id",
            user,
            package,
        )
    for args in (("user", "cancel", str(item)), ("user", "adjust-quota", str(item), "--", "-5")):
        sent = await cli(settings, *args[:2], "--json", *args[2:])
        assert sent.returncode == exit_codes.OK, sent.stderr
        UUID(json.loads(sent.stdout)["message_id"])


@pytest.mark.parametrize(
    "args", [("dlq", "discard", "--all"), ("dlq", "discard", "--route", "usage_record")]
)
async def test_a_bulk_discard_without_yes_and_without_a_terminal_changes_nothing(
    settings: Settings, pool: asyncpg.Pool, args: tuple[str, ...]
) -> None:
    dead = await bury(pool)
    refused = await cli(settings, *args, stdin=NO_TERMINAL)
    assert refused.returncode == exit_codes.NOT_CONFIRMED
    assert "--yes" in refused.stderr
    assert await status_of(pool, dead) == "buried"

    dry = await cli(settings, *args, "--dry-run", "--json", stdin=NO_TERMINAL)
    assert dry.returncode == exit_codes.OK, dry.stderr
    assert json.loads(dry.stdout) == {"would_discard": [dead]}
    assert await status_of(pool, dead) == "buried"

    done = await cli(settings, *args, "--yes", "--json", stdin=NO_TERMINAL)
    assert done.returncode == exit_codes.OK, done.stderr
    assert json.loads(done.stdout) == {"discarded": 1}
    assert await status_of(pool, dead) == "discarded"


async def test_a_purge_asks_first_and_its_dry_run_counts_without_deleting(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    dead = await discarded(pool)
    purge = ("dlq", "purge", "--older-than", "0s")
    refused = await cli(settings, *purge, stdin=NO_TERMINAL)
    assert refused.returncode == exit_codes.NOT_CONFIRMED
    assert await status_of(pool, dead) == "discarded"

    dry = await cli(settings, *purge, "--dry-run", "--json", stdin=NO_TERMINAL)
    assert dry.returncode == exit_codes.OK, dry.stderr
    assert json.loads(dry.stdout) == {"would_purge": 1}
    assert await status_of(pool, dead) == "discarded"

    week = await cli(settings, "dlq", "purge", "--older-than", "1w", "--json", stdin=NO_TERMINAL)
    assert week.returncode == exit_codes.OK, week.stderr  # nothing that old: nothing to ask
    assert json.loads(week.stdout) == {"purged": 0}

    done = await cli(settings, *purge, "--yes", "--json", stdin=NO_TERMINAL)
    assert done.returncode == exit_codes.OK, done.stderr
    assert json.loads(done.stdout) == {"purged": 1}
    assert await status_of(pool, dead) is None


async def test_a_group_cancel_asks_first_and_its_dry_run_cancels_nothing(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    group_id = await open_group(pool)
    refused = await cli(settings, "group", "cancel", str(group_id), stdin=NO_TERMINAL)
    assert refused.returncode == exit_codes.NOT_CONFIRMED
    dry = await cli(settings, "group", "cancel", str(group_id), "--dry-run", "--json")
    assert dry.returncode == exit_codes.OK, dry.stderr
    assert json.loads(dry.stdout)["state"] == "open"
    assert await group_state(pool, group_id) == "open"


async def test_the_same_week_is_understood_by_delay_and_by_older_than(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    body = json.dumps({"user_id": str(uuid4()), "upload": 1, "download": 1})
    put = await as_json(settings, "publish", "usage_record", body, "--delay", "1w")
    purge = await as_json(settings, "dlq", "purge", "--older-than", "1w", "--dry-run")
    assert put["queued"] is True
    assert purge == {"would_purge": 0}
    bad = await cli(settings, "publish", "usage_record", body, "--delay", "1y")
    assert bad.returncode == exit_codes.USAGE
    assert "is not a duration" in bad.stderr


async def test_a_dropped_repeat_a_timeout_and_a_refused_cancel_each_have_their_own_status(
    settings: Settings, pool: asyncpg.Pool
) -> None:
    body = json.dumps({"user_id": str(uuid4()), "upload": 1, "download": 1})
    first = await cli(settings, "publish", "usage_record", body, "--unique-for", "1h")
    repeat = await cli(settings, "publish", "usage_record", body, "--unique-for", "1h")
    assert (first.returncode, repeat.returncode) == (exit_codes.OK, exit_codes.DROPPED)
    address = f"contract:{uuid4()}"
    queued = await cli(
        settings, "publish", "usage_record", body, "--address", address, "--delay", "1h"
    )
    in_use = await cli(settings, "publish", "usage_record", body, "--address", address)
    waited = await cli(settings, "wait", address, "--timeout", "1s")
    assert (queued.returncode, in_use.returncode) == (exit_codes.OK, exit_codes.DROPPED)
    assert waited.returncode == exit_codes.TIMEOUT
    assert address in waited.stderr

    group_id = await open_group(pool)
    cancelled = await cli(settings, "group", "cancel", str(group_id), "--yes")
    again = await cli(settings, "group", "cancel", str(group_id), "--yes")
    assert cancelled.returncode == exit_codes.OK, cancelled.stderr
    assert again.returncode == exit_codes.FAILED
    assert "nothing to cancel" in again.stdout
