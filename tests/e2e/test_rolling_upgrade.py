"""A rolling upgrade: the previous release's `pkgq relay` and `pkgq run` (the last tag, checked
out as a git worktree, in a virtualenv of its own) work on the newest schema, first alone, then
beside this release's processes, then this release alone, as pods are replaced one by one. Every
user's lifecycle ends exactly as it would on one release, each message applied once, and nothing
is buried (for its version or for any other reason).

Expand, then contract: the newest schema only adds to the previous release's, so its SQL runs
unchanged; the message formats the previous release writes (version N-1) are still applied.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from events.envelope import H_SCHEMA_VERSION, H_USER_ID
from events.models import PurchasePackage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.settings import Settings
from tests.support import releases
from tests.support.deliveries import add_package, send, send_raw
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess

pytestmark = [pytest.mark.e2e, pytest.mark.serial]

PACKAGES = 3
TRAFFIC = 100


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(tag, python) of the previous release, checked out and ready to run."""
    tag = releases.previous_release()
    root = tmp_path_factory.mktemp("previous-release")
    worktree = releases.checkout(tag, root / "code")
    try:
        yield tag, releases.venv_for(worktree, root / "venv")
    finally:
        releases.remove(worktree)


@pytest.fixture
def old_and_new(
    previous: tuple[str, Path], spawn: Callable[..., PkgqProcess]
) -> Callable[..., PkgqProcess]:
    """Start a `pkgq` process of the previous release (old=True) or of this one."""
    _, python = previous

    def start(*args: str, old: bool) -> PkgqProcess:
        # PYTHONSAFEPATH: the working directory (this checkout) is not put first on the path.
        return spawn(*args, python=str(python), PYTHONSAFEPATH="1") if old else spawn(*args)

    return start


def imported_from(python: Path) -> Path:
    """Where `python` imports pkgq's code from."""
    seen = subprocess.run(
        [str(python), "-c", "import events.routes as r; print(r.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    ).stdout.strip()
    return Path(seen)


def usage_v1(user: UUID) -> bytes:
    """A usage record as the previous release's publishers write it (version 1)."""
    return json.dumps({"user_id": str(user), "upload": TRAFFIC, "download": 0}).encode()


async def finished(pool: asyncpg.Pool, users: list[UUID]) -> int:
    async with pool.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM telecom.queue_users WHERE user_id = ANY($1::uuid[]) "
            "AND NOT has_access AND user_id IN (SELECT user_id FROM telecom.package_queue "
            "GROUP BY user_id HAVING count(*) FILTER (WHERE status = 'consumed') = $2)",
            users,
            PACKAGES,
        )
    return count


async def lifecycle(
    settings: Settings,
    amqp: AbstractRobustConnection,
    pool: asyncpg.Pool,
    package: int,
    users: list[UUID],
) -> None:
    """Each user buys PACKAGES packages and uses each up with one v1 usage record."""
    for user in users:
        await send(
            settings,
            amqp,
            PACKAGE_PURCHASE,
            PurchasePackage(user_id=user, package_id=package, amount=PACKAGES),
        )
    for _ in range(PACKAGES):
        for user in users:
            headers = {H_SCHEMA_VERSION: 1, H_USER_ID: str(user)}
            await send_raw(settings, amqp, USAGE_RECORD, usage_v1(user), headers=headers)

    async def done() -> bool:
        return await finished(pool, users) == len(users)

    await eventually(done, within=90)


async def test_the_previous_release_runs_beside_this_one_on_the_newest_schema_and_buries_nothing(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    previous: tuple[str, Path],
    old_and_new: Callable[..., PkgqProcess],
) -> None:
    tag, python = previous
    # The previous release's interpreter runs the previous release's code, not this one's.
    where = await asyncio.to_thread(imported_from, python)
    assert where.is_relative_to(python.parents[2] / "code"), where
    package = await add_package(pool, TRAFFIC, timedelta(days=1))
    start = old_and_new

    # Before the rollout: the previous release alone, on the schema this release migrated.
    old = [start("relay", old=True), start("run", old=True)]
    alone = [uuid4() for _ in range(4)]
    await lifecycle(settings, amqp, pool, package, alone)

    # During it: both releases' pods consume the same queues and relay the same outbox.
    new = [start("relay", old=False), start("run", old=False)]
    during = [uuid4() for _ in range(12)]
    await lifecycle(settings, amqp, pool, package, during)

    # After it: the previous release's pods are gone.
    for process in old:
        assert process.terminate() == 0, process.logs()[-2000:]
    after = [uuid4() for _ in range(4)]
    await lifecycle(settings, amqp, pool, package, after)

    users = alone + during + after
    async with pool.acquire() as conn:
        letters = await conn.fetch("SELECT route, reason FROM telecom.dead_letters")
        applied = await conn.fetch(
            "SELECT consumer, count(*) AS n FROM telecom.inbox GROUP BY consumer"
        )
        used = await conn.fetchval(
            "SELECT sum(upload) FROM telecom.package_queue WHERE user_id = ANY($1::uuid[])", users
        )
    assert [dict(r) for r in letters] == [], f"buried beside {tag}"
    counts = {r["consumer"]: r["n"] for r in applied}
    assert counts["usage_record"] == PACKAGES * len(users)
    assert counts["package_purchase"] == len(users)
    assert counts["all_expired"] == len(users)
    assert used == PACKAGES * TRAFFIC * len(users)
    # The previous release did its share: its consumer applied messages of its own.
    old_logs = old[1].logs()
    assert '"event": "processed"' in old_logs, old_logs[-2000:]
    for process in new:
        assert process.proc.poll() is None, process.logs()[-2000:]
