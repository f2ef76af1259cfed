"""The job-queue publishing API: put messages on a route with the job-queue options.

    jobs = Jobs(pool)
    result = await jobs.publish("usage_record", body, priority=2, delay=60, ttl=3600,
                                address="bill:2026-11:user-42", unique_for=600)
    state = await jobs.wait("bill:2026-11:user-42", timeout=30)

Every put is an outbox row written in one Postgres transaction with its bookkeeping (address,
unique window, group membership), so it survives restarts of everything and is published by
the relay with confirms:
- priority 0-2, higher is more urgent, FIFO within a priority (relay claim order, and the AMQP
  priority on classic queues). rsqueue ranks the other way (0 is most urgent): not here.
- delay: not published before `delay` seconds have passed;
- ttl: not delivered after `ttl` seconds from the put; recorded as expired in the dead-letter
  store (by the relay, the broker's per-message expiration, or the consumer, whichever sees it);
- address: `DuplicateAddress` while a message with that address is queued or in flight;
- unique_for: a repeat of the same route and arguments (sha256) within the window is dropped,
  and the result says so.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg

from events.envelope import H_PRIORITY, Envelope
from events.models import WireModel
from events.routes import Route, route_named
from infra.postgres import addresses, groups, outbox, unique_keys
from infra.postgres.addresses import AddressState
from infra.postgres.groups import CancelResult, EndMessage
from infra.postgres.pool import Conn, clock
from infra.transient import transient_retrying


class DuplicateAddress(Exception):  # noqa: N818  (rsqueue's name for it)
    """A message with this address is already queued or in flight."""

    def __init__(self, address: str, holder: UUID) -> None:
        super().__init__(f"address {address!r} is already queued or in flight (message {holder})")
        self.address = address
        self.holder = holder


class UnknownAddressError(KeyError):
    def __init__(self, address: str) -> None:
        super().__init__(f"no message was ever published with address {address!r}")
        self.address = address


@dataclass(frozen=True, slots=True)
class JobOptions:
    priority: int = 0
    delay: float | None = None
    ttl: float | None = None
    address: str | None = None
    unique_for: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.priority <= 2:
            raise ValueError(
                f"priority must be 0, 1 or 2 (2 is the most urgent), not {self.priority}"
            )
        for name in ("delay", "ttl", "unique_for"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        if self.ttl is not None and self.ttl == 0:
            raise ValueError("ttl must be positive")
        if self.address is not None and not self.address.strip():
            raise ValueError("address must not be empty")


@dataclass(frozen=True, slots=True)
class PublishResult:
    message_id: UUID
    queued: bool
    """False: dropped as a repeat within its unique window (see `duplicate_of`)."""
    duplicate_of: UUID | None = None
    available_at: datetime | None = None
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class GroupResult:
    group_id: UUID
    message_ids: list[UUID]


def unique_key(route: Route, body: WireModel) -> str:
    """Route + sha256 of the arguments (the body as canonical JSON)."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return f"{route.name}:{hashlib.sha256(canonical.encode()).hexdigest()}"


def as_route(route: Route | str) -> Route:
    return route if isinstance(route, Route) else route_named(route)


def as_body(route: Route, body: WireModel | dict[str, Any] | str) -> WireModel:
    """Validate a body for the route (a model instance of the wrong type is refused too)."""
    if isinstance(body, str):
        return route.model.model_validate_json(body)
    if isinstance(body, dict):
        return route.model.model_validate_json(json.dumps(body))
    if not isinstance(body, route.model):
        raise TypeError(f"{route.name} takes {route.model.__name__}, not {type(body).__name__}")
    return body


async def put(
    conn: Conn,
    route: Route,
    body: WireModel,
    options: JobOptions = JobOptions(),
    *,
    group_id: UUID | None = None,
    message_id: UUID | None = None,
) -> PublishResult:
    """Inside a transaction: write one message to the outbox with its options."""
    message_id = message_id or uuid4()
    if options.unique_for is not None:
        holder = await unique_keys.take_unique(
            conn, unique_key(route, body), message_id, options.unique_for
        )
        if holder is not None:
            return PublishResult(message_id, queued=False, duplicate_of=holder)
    if options.address is not None:
        holder = await addresses.take_address(conn, options.address, route.name, message_id)
        if holder is not None:
            raise DuplicateAddress(options.address, holder)
    now = await clock(conn)
    available_at = now + timedelta(seconds=options.delay) if options.delay else None
    expires_at = now + timedelta(seconds=options.ttl) if options.ttl else None
    envelope = Envelope(
        message_id=message_id,
        message_type=route.message_type,
        schema_version=route.schema_version,
        user_id=body.user_id,
        address=options.address,
        group_id=group_id,
        expires_at=expires_at,
    )
    row = outbox.from_envelope(
        route.name,
        envelope,
        body.model_dump_json().encode(),
        extra_headers={H_PRIORITY: options.priority} if options.priority else None,
        available_at=available_at,
        priority=options.priority,
        expires_at=expires_at,
    )
    await outbox.enqueue(conn, [row])
    return PublishResult(message_id, True, None, available_at or now, expires_at)


def end_message(route: Route | str, body: WireModel | dict[str, Any] | str) -> EndMessage:
    """A group's end or abort work, validated for its route."""
    target = as_route(route)
    model = as_body(target, body)
    return EndMessage(
        route=target.name,
        message_type=target.message_type,
        schema_version=target.schema_version,
        body=model.model_dump_json().encode(),
        user_id=model.user_id,
    )


class Jobs:
    """The publishing API over a pool (each call is one transaction)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def publish(
        self,
        route: Route | str,
        body: WireModel | dict[str, Any] | str,
        *,
        priority: int = 0,
        delay: float | None = None,
        ttl: float | None = None,
        address: str | None = None,
        unique_for: float | None = None,
    ) -> PublishResult:
        target = as_route(route)
        options = JobOptions(priority, delay, ttl, address, unique_for)
        model = as_body(target, body)
        async with self._pool.acquire() as conn, conn.transaction():
            return await put(conn, target, model, options)

    async def publish_group(
        self,
        route: Route | str,
        bodies: Sequence[WireModel | dict[str, Any] | str],
        *,
        name: str,
        on_complete: EndMessage | None = None,
        on_abort: EndMessage | None = None,
        priority: int = 0,
        delay: float | None = None,
        ttl: float | None = None,
    ) -> GroupResult:
        """Publish `bodies` as one group: `on_complete` is published once every member has
        finished (applied, or given up on), `on_abort` once the group is cancelled."""
        target = as_route(route)
        options = JobOptions(priority, delay, ttl)
        models = [as_body(target, b) for b in bodies]
        group_id = uuid4()
        ids = [uuid4() for _ in models]
        async with self._pool.acquire() as conn, conn.transaction():
            # The group and its members first: a member cannot finish before it is known.
            await groups.create_group(
                conn, group_id, name, [(i, target.name) for i in ids], on_complete, on_abort
            )
            for model, message_id in zip(models, ids, strict=True):
                await put(conn, target, model, options, group_id=group_id, message_id=message_id)
        return GroupResult(group_id, ids)

    async def cancel_group(self, group_id: UUID, who: str) -> CancelResult | None:
        """Cancel an open group (see groups.cancel_group). It locks the group's members in
        id order while deliveries lock theirs in batch order, so Postgres may pick it as a
        deadlock victim: that is retried."""
        async for attempt in transient_retrying():
            with attempt:
                async with self._pool.acquire() as conn, conn.transaction():
                    return await groups.cancel_group(conn, group_id, who)
        raise AssertionError("unreachable: transient_retrying re-raises")

    async def group(self, group_id: UUID) -> dict[str, Any] | None:
        async with self._pool.acquire() as conn:
            return await groups.group_summary(conn, group_id)

    async def groups(self, limit: int = 50) -> list[dict[str, Any]]:
        """The most recent groups, newest first."""
        async with self._pool.acquire() as conn:
            return await groups.list_groups(conn, limit)

    async def wait(self, address: str, timeout: float | None = None) -> AddressState:  # noqa: ASYNC109
        """Return once the addressed message is done or failed (its `error` says why).
        Raises TimeoutError after `timeout` seconds, UnknownAddressError for an unknown one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.05
        while True:
            async with self._pool.acquire() as conn:
                state = await addresses.address_state(conn, address)
            if state is None:
                raise UnknownAddressError(address)
            if state.state != "queued":
                return state
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"address {address!r} is still queued after {timeout} s")
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, 0.5)
