"""The Fn message queue: its contract in its own words, checked on the real services.

- "Priorities are currently 0-2 … call with higher priority always get pulled off the queue
  first. Within the same priority, jobs should be available in FIFO order."
- "If the job's Delay value is > 0, the job should NOT be enqueued. The job should only be
  available in the queue after at least Delay seconds have elapsed."
- "If Delete() is not called on the call within the timeout, the call should be restored to the
  queue … for jobs [A, B, C] … B is now permanently erased from the queue. A's timeout occurs
  before the job is finished. At this point the ordering should be [A, C] and not [C, A]."
- "MQ implementations MUST NOT lose jobs in case of errors. That is, in case of reservation
  failure, it should be possible to retrieve the job on a future reservation."

In pkgq a delivery is the reservation, the ack is the delete, and the route's TTR is the timeout.
"""

from __future__ import annotations

import asyncio
import signal
import zlib
from collections.abc import Callable
from uuid import UUID, uuid4

import asyncpg
import pytest
from aio_pika.abc import AbstractRobustConnection

from consumers import publishing
from events.models import PurchasePackage, RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra import faults
from infra.jobs import Jobs
from infra.rabbit.topology import declare_all
from infra.route_config import RouteSettings
from infra.settings import Settings
from tests.conformance.jobs_support import HANG_ONCE, Recorder, recording_pipeline, usage
from tests.support.deliveries import add_package, send
from tests.support.in_process import InProcess, StartApp
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess


@pytest.fixture
async def app(
    in_process: StartApp, settings: Settings, pool: asyncpg.Pool, amqp: AbstractRobustConnection
) -> InProcess:
    return in_process(settings, pool, amqp)


async def publish_direct(
    settings: Settings, amqp: AbstractRobustConnection, body: RecordUsage, priority: int = 0
) -> UUID:
    """Straight to the exchange, one confirmed publish after another (so arrival order is
    known), with an AMQP priority."""
    return await publishing.publish(settings, amqp, USAGE_RECORD, body, priority=priority)


async def of_type(settings: Settings, amqp: AbstractRobustConnection, queue_type: str) -> Settings:
    """The test's settings with every queue of `queue_type`, declared (quorum ones under a
    prefix of their own: a queue's type cannot change in place)."""
    if queue_type == "classic":
        return settings
    typed = settings.model_copy(
        update={"queue_type": queue_type, "queue_prefix": f"{settings.queue_prefix}.{queue_type}"}
    )
    channel = await amqp.channel()
    await declare_all(channel, typed)
    await channel.close()
    return typed


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_the_relay_publishes_higher_priorities_first_and_fifo_within_a_priority(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    queue_type: str,
) -> None:
    # The relay's claim order (priority, then id) ranks on both queue types: on quorum queues,
    # which have no priorities in RabbitMQ 3.x, it is the only ranking there is.
    app = in_process(await of_type(settings, amqp, queue_type), pool, amqp)
    recorder = Recorder()
    jobs = Jobs(pool)
    user = uuid4()  # one user: the relay publishes a user's rows as one chain, in claim order
    priorities = [0, 2, 1, 0, 2, 1]
    for upload, priority in enumerate(priorities, start=1):
        await jobs.publish(USAGE_RECORD, usage(user, upload), priority=priority)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    await app.start_relay()

    async def all_applied() -> bool:
        return len(recorder.applied) == len(priorities)

    await eventually(all_applied)
    assert recorder.uploads(recorder.applied) == [2, 5, 3, 6, 1, 4]


@pytest.mark.parametrize(
    ("queue_type", "expected"),
    [
        ("classic", [3, 5, 2, 6, 1, 4, 7]),  # by priority, FIFO within one
        ("quorum", [1, 2, 3, 4, 5, 6, 7]),  # RabbitMQ 3.x quorum queues ignore priorities: FIFO
    ],
)
async def test_the_broker_hands_out_piled_up_messages_by_priority_on_classic_queues_only(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    queue_type: str,
    expected: list[int],
) -> None:
    # One at a time, so that the handler sees the broker's order (a batch is applied user by
    # user, and these are different users).
    typed = await of_type(settings, amqp, queue_type)
    one_by_one = typed.model_copy(update={"batch_size": 1})
    recorder = Recorder()
    priorities = [0, 1, 2, 0, 2, 1, 0]
    for upload, priority in enumerate(priorities, start=1):
        await publish_direct(one_by_one, amqp, usage(uuid4(), upload), priority)
    app = in_process(one_by_one, pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )

    async def all_applied() -> bool:
        return len(recorder.applied) == len(priorities)

    await eventually(all_applied)
    await app.close()
    assert recorder.uploads(recorder.applied) == expected


async def test_a_delayed_message_is_not_delivered_before_its_delay_has_passed(
    settings: Settings, pool: asyncpg.Pool, app: InProcess
) -> None:
    recorder = Recorder()
    jobs = Jobs(pool)
    await app.start_consumers(
        [USAGE_RECORD], pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder)}
    )
    await app.start_relay()
    user = uuid4()
    delayed = await jobs.publish(USAGE_RECORD, usage(user, 1), delay=1.5)
    at_once = await jobs.publish(USAGE_RECORD, usage(uuid4(), 2))

    async def both_committed() -> bool:
        # The recorder hears of a message inside its transaction: wait for the commit too.
        return len(recorder.applied) == 2 and await committed(pool, delayed.message_id)

    await eventually(both_committed)
    assert recorder.applied == [at_once.message_id, delayed.message_id]
    assert delayed.available_at is not None
    assert await put_to_applied_s(pool, delayed.message_id) >= 1.5


def lane_of(user: UUID, lanes: int) -> int:
    return zlib.crc32(str(user).encode()) % lanes


def users_in_different_lanes(lanes: int) -> tuple[UUID, UUID]:
    first = uuid4()
    while True:
        second = uuid4()
        if lane_of(second, lanes) != lane_of(first, lanes):
            return first, second


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_a_message_that_times_out_keeps_its_place_a_b_c_becomes_a_c(
    in_process: StartApp,
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    queue_type: str,
) -> None:
    """[A, B, C]: A is taken and hangs past the TTR while B is taken and done; A goes back in
    its place, so what is left is [A, C] and A runs before C, on classic and quorum queues."""
    config = RouteSettings.model_validate(
        {"concurrency": 2, "batch_size": 1, "queue_type": queue_type}
    )
    scoped = settings.model_copy(update={"route_settings": {USAGE_RECORD.name: config}})
    channel = await amqp.channel()
    # The fixture declared the route's queue as classic; a queue's type cannot change in place.
    await channel.queue_delete(scoped.queue_name(USAGE_RECORD.name))
    await declare_all(channel, scoped, [USAGE_RECORD])
    await channel.close()
    user_a, user_b = users_in_different_lanes(2)  # A and C on one lane, B on the other
    a = await publish_direct(scoped, amqp, usage(user_a, HANG_ONCE))
    b = await publish_direct(scoped, amqp, usage(user_b, 2))
    c = await publish_direct(scoped, amqp, usage(user_a, 3))
    recorder = Recorder()
    app = in_process(scoped, pool, amqp)
    await app.start_consumers(
        [USAGE_RECORD],
        pipelines={USAGE_RECORD.name: recording_pipeline(pool, recorder, ttr=1.0)},
    )

    async def all_applied() -> bool:
        return len(recorder.applied) == 3

    await eventually(all_applied, within=30)
    await app.close()
    assert recorder.applied == [b, a, c]
    second_run_of_a = [i for i, m in enumerate(recorder.started) if m == a][1]
    assert recorder.started.index(c) > second_run_of_a  # [A, C], not [C, A]
    async with pool.acquire() as conn:
        strikes = await conn.fetchval(
            "SELECT strikes FROM telecom.ttr_strikes WHERE sent_as = $1", a
        )
    assert strikes == 1


async def committed(pool: asyncpg.Pool, message_id: UUID) -> bool:
    async with pool.acquire() as conn:
        found = await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM telecom.inbox WHERE sent_as = $1)", message_id
        )
    return bool(found)


async def put_to_applied_s(pool: asyncpg.Pool, message_id: UUID) -> float:
    """Seconds from the put to the message's application, on the database's own clock."""
    async with pool.acquire() as conn:
        seconds = await conn.fetchval(
            "SELECT extract(epoch FROM i.processed_at - o.created_at) FROM telecom.inbox i "
            "JOIN telecom.outbox o ON o.message_id = i.sent_as "
            "WHERE i.sent_as = $1 ORDER BY o.id LIMIT 1",
            message_id,
        )
    return float(seconds)


async def applied_exactly_once(pool: asyncpg.Pool, user: UUID) -> None:
    """The user's one purchase is queued, and stays the only one (no second application)."""

    async def items() -> int:
        async with pool.acquire() as conn:
            count: int = await conn.fetchval(
                "SELECT count(*) FROM telecom.package_queue WHERE user_id = $1", user
            )
        return count

    async def queued() -> bool:
        return await items() >= 1

    await eventually(queued, within=30)
    await asyncio.sleep(0.5)  # a second application would have landed by now
    assert await items() == 1


@pytest.mark.e2e
async def test_no_message_is_lost_when_the_consumer_dies_holding_it(
    settings: Settings,
    pool: asyncpg.Pool,
    amqp: AbstractRobustConnection,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    doomed = spawn(
        "run",
        "package_purchase",
        "--no-ingest",
        PKGQ_FAULTS=f"{faults.DELIVERY_BEFORE_COMMIT}={PACKAGE_PURCHASE.name}",
    )
    user = uuid4()
    await send(settings, amqp, PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package))

    async def died() -> bool:
        return doomed.proc.poll() is not None

    await eventually(died)
    assert doomed.proc.returncode == -signal.SIGKILL  # killed inside its transaction
    spawn("run", "package_purchase", "--no-ingest")

    await applied_exactly_once(pool, user)


@pytest.mark.e2e
async def test_a_delay_survives_every_process_being_killed_and_restarted(
    settings: Settings,
    pool: asyncpg.Pool,
    spawn: Callable[..., PkgqProcess],
) -> None:
    package = await add_package(pool, 1000)
    user = uuid4()
    put = await Jobs(pool).publish(
        PACKAGE_PURCHASE, PurchasePackage(user_id=user, package_id=package), delay=4
    )
    relay = spawn("relay")
    consumer = spawn("run", "package_purchase", "--no-ingest")
    await asyncio.sleep(1.0)
    relay.kill()  # SIGKILL both while the message waits for its delay
    consumer.kill()
    spawn("relay")
    spawn("run", "package_purchase", "--no-ingest")

    await applied_exactly_once(pool, user)
    assert await put_to_applied_s(pool, put.message_id) >= 4
