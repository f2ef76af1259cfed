"""Prometheus metrics and the small HTTP port every long-running pkgq process can serve.

- `/metrics`: Prometheus text format. Label values are routes and outcomes, never user or
  message ids.
- `/healthz`: 200 while the event loop's heartbeat task keeps beating (a stuck loop stops it),
  503 otherwise.
- `/readyz`: 200 while the process's readiness check passes (consuming every assigned queue,
  Postgres answering), 503 during start-up and once a graceful drain has begun. Why a check
  failed is logged, never answered: exception text can name hosts, users and queries.

Off by default (`PKGQ_HTTP_PORT=0`); one port per process, bound to 127.0.0.1 unless
`PKGQ_HTTP_HOST` says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Protocol

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

from domain.delivery import REPEATS, Decision, Fate
from events.decoding import Decoded, RawDelivery
from events.envelope import H_SINCE, H_SINCE_CLOCK, Envelope, header_time

log = structlog.get_logger(__name__)

MESSAGES = Counter(
    "pkgq_messages_total",
    "Deliveries handled, by route and outcome (acked, duplicate, retried, dead_lettered, parked).",
    ["route", "outcome"],
)
PROCESSING = Histogram(
    "pkgq_processing_seconds",
    "Time from taking a delivery (or batch) to its commit, per message, by route.",
    ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
IN_FLIGHT = Gauge("pkgq_in_flight", "Deliveries being processed now, by route.", ["route"])
RELAYED = Counter("pkgq_relay_published_total", "Outbox rows published and confirmed.")
RELAY_LAG = Histogram(
    "pkgq_relay_publish_lag_seconds",
    "From a row being due (available_at) to its publish being confirmed.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
RELAY_STALLED = Gauge(
    "pkgq_relay_stalled",
    "1 while this relay has had no healthy round for PKGQ_RELAY_STALL_AFTER seconds.",
)
RELAY_RENEWALS = Counter(
    "pkgq_relay_channel_renewals_total",
    "Publishing channels (kind=channel) or broker connections (kind=connection) the relay "
    "replaced after a publish was not confirmed.",
    ["kind"],
)

RECONNECTS = Counter(
    "pkgq_reconnects_total", "RabbitMQ connections re-established after they were lost."
)
OUTBOX_PENDING = Gauge("pkgq_outbox_pending", "Outbox rows due and not yet published.")
OUTBOX_OLDEST = Gauge(
    "pkgq_outbox_oldest_pending_seconds", "Age of the oldest due, unpublished outbox row."
)
DEAD_LETTERS = Gauge("pkgq_dead_letters", "Buried dead letters, by route.", ["route"])
JOB_STATES = Gauge(
    "pkgq_job_messages",
    "Messages by route and job state, from Postgres: ready (due in the outbox), waiting "
    "(scheduled or parked), buried, expired, zombie (processed records kept), done (acks).",
    ["route", "state"],
)
JOB_TRANSITIONS = Gauge(
    "pkgq_job_transitions",
    "Transition counts by route (put, take, ack, release, bury, dig, plow, ttl, ttr, delete), "
    "kept in Postgres; they only grow (until the database is reset).",
    ["route", "transition"],
)

WORKERS_REAPED = Counter(
    "pkgq_workers_reaped_total",
    "Stale workers (no heartbeat for PKGQ_WORKER_STALE_AFTER) this process reaped: their leases "
    "freed and their Postgres backends terminated.",
)
HELD_USERS = Gauge(
    "pkgq_held_users",
    "Users whose later messages on a consumer wait behind a blocker, by consumer and state "
    "(retrying: the blocker waits for its retry; buried: it is a dead letter), from Postgres.",
    ["consumer", "state"],
)
INVARIANT_VIOLATIONS = Gauge(
    "pkgq_invariant_violations",
    "Rows breaking each invariant at its last check (infra/postgres/invariants.py; `pkgq "
    "doctor` names them), by check; 0 when it holds. Exported by the relays.",
    ["check"],
)
ROUTE_PAUSED = Gauge(
    "pkgq_route_paused",
    "1 while this process's consumers of the route are paused (`pkgq route pause`), else 0.",
    ["route"],
)
BREAKER_TRIPS = Counter(
    "pkgq_breaker_trips_total",
    "Times this process's circuit breaker paused a route (PKGQ_BREAKER), by route.",
    ["route"],
)
QUEUE_CONSUMERS = Gauge(
    "pkgq_queue_consumers",
    "Consumers subscribed to each queue pkgq consumes (active and standby), by passive declare; "
    "-1 when the queue does not exist.",
    ["queue"],
)
QUEUE_READY = Gauge(
    "pkgq_queue_ready_messages",
    "Messages ready in each queue pkgq consumes, by passive declare; -1 when it does not exist.",
    ["queue"],
)


# The time a user waits (critical time): docs/how-to/dashboards.md says what the figures mean.

CRITICAL_BOUNDS = (
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400,
)  # fmt: skip
"""The buckets (upper bounds, seconds) of both histograms and of the console's per-minute
counts (telecom.critical_minutes): a bucket's index is `critical_bucket`."""
MAX_CRITICAL_S = 86400.0
"""A critical time beyond this (a publisher's clock far behind, or a message that truly waited
that long: a replay of an old dead letter) is counted as this, and as clock skew `behind`."""
PUBLISHER = "publisher"
FIRST_SIGHT = "first_sight"

CRITICAL = Histogram(
    "pkgq_critical_seconds",
    "Time from a message's first publication (its AMQP timestamp: clock=publisher; without one, "
    "pkgq's first sight of it: clock=first_sight) to the commit that applied it, by route; "
    "bounded to [0, 1 day] (pkgq_publisher_clock_skew_total counts what was bounded).",
    ["route", "clock"],
    buckets=CRITICAL_BOUNDS,
)
ACCESS_GRANTED = Histogram(
    "pkgq_access_granted_seconds",
    "Time from a purchase's publication to the commit that granted the access it caused (its "
    "queuing, then its activation); bounded to [0, 1 day].",
    buckets=CRITICAL_BOUNDS,
)
CLOCK_SKEW = Counter(
    "pkgq_publisher_clock_skew_total",
    "Applied messages whose critical time was bounded, by route and direction: ahead (its "
    "timestamp is in the future: counted as 0 s), behind (older than a day: counted as a day).",
    ["route", "direction"],
)
CRITICAL_OBJECTIVE = Gauge(
    "pkgq_critical_p99_objective_seconds",
    "The p99 objective of pkgq_critical_seconds (PKGQ_CRITICAL_P99_OBJECTIVE_S), which the "
    "PkgqCriticalTimeOverObjective alert compares with.",
)


class Applied(Protocol):
    """A decided delivery as the critical time reads it (infra/rabbit/consumer.py `Decided`)."""

    @property
    def raw(self) -> RawDelivery: ...
    @property
    def decoded(self) -> Decoded | None: ...
    @property
    def decision(self) -> Decision: ...


def applied(fate: Fate) -> bool:
    """Whether a delivery of this fate was applied (its critical time ends at its commit)."""
    return fate is Fate.ACKED or fate in REPEATS


def since_of(raw: RawDelivery, envelope: Envelope) -> tuple[datetime, str]:
    """When a message's critical time began, and on which clock: H_SINCE on pkgq's own copy of
    it (a retry, a parked copy: from the first publication), else its AMQP timestamp, else
    pkgq's first sight of it (the decoding's time read: `Envelope.timestamp` is taken as the
    delivery arrives, when it has no timestamp of its own)."""
    headers = raw.headers
    if H_SINCE in headers:  # only pkgq's own: an outsider's x-pkgq-* headers are moved away
        at = header_time(headers, H_SINCE)
        if at is not None:
            return at, FIRST_SIGHT if headers.get(H_SINCE_CLOCK) == FIRST_SIGHT else PUBLISHER
    if raw.timestamp is not None:
        return raw.timestamp, PUBLISHER
    return envelope.timestamp, FIRST_SIGHT


def since_marks(raw: RawDelivery, envelope: Envelope) -> dict[str, str]:
    """The headers pkgq's copy of a message carries so its critical time keeps its start."""
    at, clock = since_of(raw, envelope)
    return {H_SINCE: at.isoformat(), H_SINCE_CLOCK: clock}


def bounded(seconds: float, route: str | None = None) -> float:
    """`seconds` within [0, MAX_CRITICAL_S]; with `route`, what had to be bounded is counted
    (pkgq_publisher_clock_skew_total)."""
    if seconds < 0:
        # Within a second is no skew: an AMQP timestamp has whole seconds.
        if route is not None and seconds < -1.0:
            CLOCK_SKEW.labels(route=route, direction="ahead").inc()
        return 0.0
    if seconds > MAX_CRITICAL_S:
        if route is not None:
            CLOCK_SKEW.labels(route=route, direction="behind").inc()
        return MAX_CRITICAL_S
    return seconds


def critical_bucket(seconds: float) -> int:
    """The index in CRITICAL_BOUNDS of the bucket a (bounded) critical time falls in."""
    return min(bisect_left(CRITICAL_BOUNDS, seconds), len(CRITICAL_BOUNDS) - 1)


Start = tuple[float, str]
"""When an applied delivery's critical time began (unix seconds), and on which clock."""


def critical_starts(decided: Sequence[Applied]) -> list[Start]:
    """The start of each applied delivery's critical time (read once per delivery: the
    console's buckets and the metric after the commit both use it)."""
    starts = []
    for d in decided:
        if d.decoded is not None and applied(d.decision.fate):
            at, clock = since_of(d.raw, d.decoded.envelope)
            starts.append((at.timestamp(), clock))
    return starts


def critical_buckets(starts: Sequence[Start], now: datetime) -> list[int]:
    """The bucket of each critical time as of `now` (the batch's database clock), for the
    console's per-minute counts (written with the batch's counters)."""
    at = now.timestamp()
    return [critical_bucket(bounded(at - start)) for start, _ in starts]


def observe_committed(route: str, starts: Sequence[Start], granted: Iterable[datetime]) -> None:
    """After a batch's commit: each applied delivery's critical time, and the time to each
    access grant the batch committed from its purchase's publication (`granted`). One clock
    read for the batch."""
    now = time.time()
    histograms: dict[str, Histogram] = {}
    for start, clock in starts:
        histogram = histograms.get(clock)
        if histogram is None:
            histogram = histograms[clock] = CRITICAL.labels(route=route, clock=clock)
        histogram.observe(bounded(now - start, route))
    for origin in granted:
        ACCESS_GRANTED.observe(bounded(now - origin.timestamp()))


HEARTBEAT_EVERY = 1.0
REFRESH_EVERY = 10.0
STALE_AFTER = 5.0

Ready = Callable[[], Awaitable[bool]]
Refresh = Callable[[], Awaitable[None]]
Close = Callable[[], Awaitable[None]]


class StatusServer:
    """`/metrics`, `/healthz` and `/readyz` on one port, in the process's own event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        ready: Ready,
        refresh: Refresh | None = None,
        refresh_every: float = REFRESH_EVERY,
        on_stop: Close | None = None,
    ) -> None:
        """`refresh`: updates gauges that come from the database, every `refresh_every` s.
        `on_stop`: releases what `ready` and `refresh` use (their own connections)."""
        self._host = host
        self._port = port
        self._ready = ready
        self._refresh = refresh
        self._refresh_every = refresh_every
        self._on_stop = on_stop
        self._server: asyncio.Server | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._beat = time.monotonic()
        self.draining = False
        """Set when a graceful stop begins: /readyz answers 503 from then on."""

    @property
    def port(self) -> int:
        """The bound port (useful when started with port 0 in tests)."""
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="heartbeat")
        if self._refresh is not None:
            self._refresher = asyncio.create_task(self._refresh_forever(), name="metrics-refresh")
        log.info("status_http_serving", host=self._host, port=self.port)

    async def stop(self) -> None:
        for task in (self._heartbeat, self._refresher):
            if task is not None:
                await cancel_and_wait(task)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)
        if self._on_stop is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._on_stop(), timeout=5)

    def bound_hosts(self) -> list[str]:
        """The addresses the port listens on."""
        if self._server is None:
            return []
        return [str(sock.getsockname()[0]) for sock in self._server.sockets]

    def healthy(self) -> bool:
        return time.monotonic() - self._beat < STALE_AFTER

    async def _beat_forever(self) -> None:
        """Only the event loop's liveness: nothing here waits on I/O."""
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(HEARTBEAT_EVERY)

    async def _refresh_forever(self) -> None:
        """The database gauges, in a task of their own, so a slow query never stalls /healthz."""
        assert self._refresh is not None
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                # lands as the refresh finishes, and this loop then outlived stop() for good.
                async with asyncio.timeout(max(5.0, self._refresh_every)):
                    await self._refresh()
            except Exception as exc:  # noqa: BLE001  (the gauges keep their last values)
                log.warning("metrics_refresh_failed", error=repr(exc))
            await asyncio.sleep(self._refresh_every)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), timeout=5)
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, body, kind = await self._answer(path)
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, path: str) -> tuple[str, bytes, str]:
        text = "text/plain; charset=utf-8"
        if path == "/metrics":
            return "200 OK", generate_latest(), CONTENT_TYPE_LATEST
        if path == "/healthz":
            if self.healthy():
                return "200 OK", b"ok\n", text
            return "503 Service Unavailable", b"event loop heartbeat is stale\n", text
        if path == "/readyz":
            if self.draining:
                return "503 Service Unavailable", b"draining\n", text
            try:
                ready = await asyncio.wait_for(self._ready(), timeout=3)
            except Exception as exc:  # noqa: BLE001  (not ready; why goes to the log only)
                log.warning("readiness_check_failed", error=repr(exc))
                return "503 Service Unavailable", b"not ready\n", text
            if ready:
                return "200 OK", b"ready\n", text
            return "503 Service Unavailable", b"not ready\n", text
        return "404 Not Found", b"not found\n", text


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for its end, cancelling again while it goes on: a cancel that a
    library swallowed must not leave the task running (nor its awaiter waiting) for ever."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    if not task.cancelled() and task.exception() is not None:
        log.warning("status_task_failed", task=task.get_name(), error=repr(task.exception()))
