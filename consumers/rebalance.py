"""Elastic replicas of a partitioned route: the `pkgq run` processes that consume a route split
into partitions (and are not pinned with `--replica I/N`) find each other in Postgres and share
its partitions, each consuming the ones rendezvous hashing gives it (domain/assignment.py).

Every REBALANCE_EVERY_S (1 s) the loop runs one statement (infra/postgres/partition_owners.py):
it renews this worker's heartbeat and reads each route's live replicas, those whose heartbeat
is younger than LIVE_WITHIN_S (3 s). When the assignment changes:
- a partition this replica loses is handed over: its consumer stops taking deliveries,
  finishes and acks the batch in hand, then closes its channel, which gives what it had
  buffered back to the queue, in place, and ends its subscription (QueueConsumer.stop with
  `hand_over`);
- a partition it gains is subscribed to at once. Its queue is single-active-consumer, so a new
  owner that subscribes while the old one still finishes only stands by: the broker makes it
  active when the old one's channel closes, with everything the old one did not ack back in
  the queue ahead of the rest. One consumer at a time, each user's messages in order.

A replica that joins takes its share within a round or two; one that stops gracefully
(SIGTERM) leaves the route first, so the others take its partitions while it hands them over;
one that dies is no longer live once its heartbeat is LIVE_WITHIN_S old, and its partitions
go to the others at their next round (its connection is gone, so the broker has given back
what it held already). A replica that cannot reach Postgres keeps what it has: if the others
take its partitions meanwhile, they stand by on them until it reads again and hands them over.

Moves run as tasks of their own: the loop keeps reading (and heartbeating) while a hand-over
waits for a batch in hand, so a slow batch never makes this replica look dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

import asyncpg
import structlog

from consumers.route_pauses import PauseWatch
from domain.assignment import owned_by
from events.partitioning import partition_key
from infra.postgres import partition_owners
from infra.postgres.pool import Conn
from infra.rabbit.consumer import QueueConsumer
from infra.transient import StoppingError

log = structlog.get_logger(__name__)

REBALANCE_EVERY_S = 1.0
"""How often a replica reads the live replicas of its routes (and renews its heartbeat)."""
LIVE_WITHIN_S = 3.0
"""A replica whose heartbeat is older than this is not live: its partitions go to the others."""

Key = tuple[str, int]
"""A route's partition: (route name, partition)."""


@dataclass(frozen=True, slots=True)
class ElasticRoute:
    """A partitioned route whose partitions this replica shares with the others."""

    name: str
    partitions: int
    consumer: Callable[[int], QueueConsumer]
    """A new consumer of one partition (a consumer that stopped is never started again)."""


class Rebalancer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        worker_id: UUID,
        routes: Sequence[ElasticRoute],
        started: list[QueueConsumer],
        pauses: PauseWatch,
        *,
        record: Callable[[list[str]], Awaitable[None]] | None = None,
        every: float = REBALANCE_EVERY_S,
        live_within: float = LIVE_WITHIN_S,
    ) -> None:
        """`started`: the runner's list of running consumers (the pause watch's): consumers
        are added to it as they start and taken out as they are handed over. `record`: told
        the partition keys consumed after each change (the worker's routes)."""
        self._pool = pool
        self.worker_id = worker_id
        self._me = str(worker_id)
        self._routes = {r.name: r for r in routes}
        self._started = started
        self._pauses = pauses
        self._record = record
        self._every = every
        self._live_within = live_within
        self.held: dict[Key, QueueConsumer] = {}
        """The partitions this replica consumes (or is subscribing to)."""
        self._moving: dict[Key, asyncio.Task[None]] = {}
        """Partitions being taken or handed over."""
        self.failed = asyncio.Event()
        """Set when a consumer of a held partition dies or cannot subscribe (exit non-zero)."""
        self.rounds = 0
        """Rounds whose read succeeded (the first one makes the replica ready)."""
        self._failures = 0
        self._read_at = time.monotonic()
        """When a round last read the live replicas (or when this replica started)."""
        self.assigned = asyncio.Event()
        """Set once the first read's moves are done (the runner's `ready` waits for it)."""

    def ready(self) -> bool:
        """The live replicas were read once, and every held partition is consumed."""
        return self.rounds > 0 and not self._moving and all(c.consuming for c in self.held.values())

    def keys(self) -> list[str]:
        """The routing keys of the held partitions (what `pkgq workers` shows)."""
        return [
            partition_key(route, k, self._routes[route].partitions)
            for route, k in sorted(self.held)
        ]

    async def run(self, stop: asyncio.Event) -> None:
        """Join the routes, then a round every `every` seconds until `stop` is set."""
        joined = False
        while not stop.is_set():
            started = time.monotonic()
            try:
                if not joined:
                    await self._join()
                    joined = True
                await self.round()
            except Exception as exc:  # noqa: BLE001  (an outage: try again)
                self._failures += 1
                if self._failures == 1 or self._failures % 30 == 0:
                    log.warning("rebalance_read_failed", error=repr(exc), held=self.keys())
                self._let_go_when_unseen()
            else:
                self._failures = 0
                self._read_at = time.monotonic()
            pause = max(0.0, self._every - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=pause)

    def _let_go_when_unseen(self) -> None:
        """Past the liveness bound without a read, the others take this replica for gone and
        stand by on its partitions, while what it holds waits on a database it cannot reach:
        hand them over, so one of them goes on. A round that reads again takes back what the
        assignment gives it."""
        if time.monotonic() - self._read_at <= self._live_within:
            return
        letting_go = [key for key in sorted(self.held) if key not in self._moving]
        if letting_go:
            log.warning(
                "partitions_let_go_unseen",
                partitions=[f"{r}.p{k}" for r, k in letting_go],
                unseen_s=round(time.monotonic() - self._read_at, 1),
            )
        for key in letting_go:
            self._move(key, self._hand_over(key))

    async def _join(self) -> None:
        async with self._pool.acquire(timeout=5) as conn:
            await partition_owners.join(conn, self.worker_id, list(self._routes))

    async def round(self) -> None:
        """Read the live replicas once, and start the moves that the assignment asks for."""
        async with self._pool.acquire(timeout=5) as conn:
            live = await partition_owners.live_replicas(
                conn, self.worker_id, list(self._routes), self._live_within
            )
            if live.beaten and any(
                self.worker_id not in ids for ids in live.replicas.values()
            ):  # a membership lost meanwhile (nothing removes one but `leave`): join again
                await partition_owners.join(conn, self.worker_id, list(self._routes))
        self.rounds += 1
        wanted: set[Key] = set()
        if live.beaten:  # else: reaped, so not live for the others either
            for route in self._routes.values():
                ids = [str(i) for i in live.replicas.get(route.name, [])]
                wanted |= {
                    (route.name, k) for k in owned_by(route.name, route.partitions, ids, self._me)
                }
        if any(c.failed.is_set() for c in self.held.values()):
            self.failed.set()
        for key in sorted(wanted - set(self.held)):
            if key not in self._moving:
                self._move(key, self._take(key))
        for key in sorted(set(self.held) - wanted):
            if key not in self._moving:
                self._move(key, self._hand_over(key))
        if not self._moving:
            self.assigned.set()

    def _move(self, key: Key, work: Awaitable[None]) -> None:
        async def moving() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("partition_move_failed", route=key[0], partition=key[1])
                self.failed.set()
            finally:
                self._moving.pop(key, None)
                if not self._moving:
                    self.assigned.set()

        self._moving[key] = asyncio.create_task(moving(), name=f"rebalance:{key[0]}.p{key[1]}")

    async def _take(self, key: Key) -> None:
        route, partition = key
        consumer = self._routes[route].consumer(partition)
        self.held[key] = consumer
        began = time.monotonic()
        try:
            await consumer.start(paused=self._pauses.holds(consumer))
        except StoppingError:
            return
        except Exception:
            log.exception("partition_subscribe_failed", route=route, partition=partition)
            self.failed.set()
            return
        self._started.append(consumer)
        log.info(
            "partition_taken",
            route=route,
            partition=partition,
            subscribe_s=round(time.monotonic() - began, 3),
        )
        await self._write(partition_owners.claim, route, partition)

    async def _hand_over(self, key: Key) -> None:
        route, partition = key
        consumer = self.held[key]
        began = time.monotonic()
        await consumer.stop(hand_over=True)
        if not consumer.closed:
            # The broker keeps the subscription active until this connection goes: the new
            # owner stands by meanwhile, and the partition waits. Worth waking someone.
            log.error("partition_hand_over_stuck", route=route, partition=partition)
        self.held.pop(key, None)
        with contextlib.suppress(ValueError):
            self._started.remove(consumer)
        log.info(
            "partition_handed_over",
            route=route,
            partition=partition,
            drain_s=round(time.monotonic() - began, 3),
        )
        await self._write(partition_owners.release, route, partition)

    async def _write(
        self,
        change: Callable[[Conn, UUID, str, Sequence[int]], Awaitable[None]],
        route: str,
        partition: int,
    ) -> None:
        """Record a change of owner (best effort: the next change records again), and the
        worker's routes."""
        try:
            async with self._pool.acquire(timeout=5) as conn:
                await change(conn, self.worker_id, route, [partition])
        except Exception as exc:  # noqa: BLE001  (a record only: consuming goes on)
            log.warning("partition_owner_not_recorded", route=route, error=repr(exc))
        if self._record is not None and not self._moving.keys() - {(route, partition)}:
            await self._record(self.keys())

    async def close(self) -> None:
        """Leave every route (the others take its partitions at their next round), then hand
        every held partition over. Bounded: Postgres may be down (the others then wait for
        this replica's heartbeat to age instead)."""
        for task in list(self._moving.values()):
            task.cancel()
        await asyncio.gather(*self._moving.values(), return_exceptions=True)
        try:
            async with asyncio.timeout(5):
                async with self._pool.acquire() as conn:
                    await partition_owners.leave(conn, self.worker_id)
        except Exception as exc:  # noqa: BLE001
            log.warning("rebalance_leave_failed", error=repr(exc))
        held, self.held = list(self.held.values()), {}
        await asyncio.gather(*(c.stop(hand_over=True) for c in held), return_exceptions=True)
        for consumer in held:
            with contextlib.suppress(ValueError):
                self._started.remove(consumer)
