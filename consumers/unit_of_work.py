"""The handler's side of a batch: what a handler sees and what it changes, all in memory.

The delivery pipeline (consumers/delivery/) locks and loads every user of a batch with one
statement each, hands each message's handler a `HandlerContext` over that batch's `UnitOfWork`,
and writes everything the handlers changed back with one part per table, gathered into few
statements. A handler only
describes its transition: it never runs SQL of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from domain.delivery import Fate
from domain.events import (
    DomainEvent,
    ExpiryUnscheduled,
    PackageCancelled,
    PackageExpired,
    UsageRemaining,
)
from domain.model import ItemStatus, Package
from domain.queue import UserQueue
from domain.records import record
from events.decoding import RawDelivery
from events.envelope import H_ORIGIN_TS, Envelope, header_time
from events.models import AdjustQuota, CancelPackage
from events.outgoing import Outgoing, expiry_key, outgoing
from events.routes import PACKAGE_ACTIVATE, PACKAGE_PURCHASE, PACKAGE_QUEUING
from infra.observability import since_of
from infra.postgres import audit, batch_write, outbox
from infra.postgres.batch_read import LoadedQueue
from infra.postgres.pool import Conn

_LEAVES_NOTHING = (PackageExpired, PackageCancelled)
"""Events after which an item has no traffic left (a tuple: read for every event)."""
_CHAINED = (PACKAGE_QUEUING.name, PACKAGE_ACTIVATE.name)
"""The follow-ups between a purchase and the access it grants, which carry H_ORIGIN_TS."""


class NotInBatchError(LookupError):
    """A handler asked for something its batch did not load (a bug in its `Needs`)."""


@dataclass(frozen=True, slots=True)
class Needs:
    """What a message needs loaded besides its user's live items, declared per route so that
    the pipeline can load a whole batch's needs with one statement each."""

    item_ids: tuple[int, ...] = ()
    """Items the message targets that may have left the queue (cancelled, consumed)."""
    package_ids: tuple[int, ...] = ()
    """Catalog entries it buys."""
    new_items: int = 0
    """Item ids it creates."""
    orders: tuple[tuple[UUID, UUID], ...] = ()
    """(user, by_order) pairs it buys: whether each was bought before is loaded with them."""
    usages: tuple[tuple[UUID, str], ...] = ()
    """(user, usage_id) pairs it bills: whether each was billed before is loaded with them."""


NO_NEEDS = Needs()


@dataclass
class UnitOfWork:
    """A batch's locked users in memory, and the changes its messages made to them."""

    now: datetime
    """The batch's clock: the database's, read once every user of the batch was locked
    (batch_read.lock_users), so a transition is dated when it happens, not when the
    transaction began to wait for its user. The relay schedules by the same database clock."""
    queues: dict[UUID, LoadedQueue]
    packages: dict[int, Package] = field(default_factory=dict)
    new_ids: list[int] = field(default_factory=list)
    created_at: datetime | None = None
    """When the new item ids were taken (the purchased items' created_at)."""
    outbox_rows: list[outbox.OutboxMessage] = field(default_factory=list)
    """Follow-up rows in the order they were made (append-only: a rollback cuts the tail)."""
    withdrawn: list[tuple[str, int]] = field(default_factory=list)
    """Timers withdrawn: (cancel key, how many outbox rows had been made by then)."""
    access_changes: dict[UUID, batch_write.Change] = field(default_factory=dict)
    remaining: dict[UUID, dict[int, int | None]] = field(default_factory=dict)
    """Remaining traffic per user and item, for node management (None: unlimited)."""
    audit: list[audit.Entry] = field(default_factory=list)
    """Operators' commands applied, for the item audit (append-only, like outbox_rows)."""
    billed_by: dict[tuple[UUID, str], UUID] = field(default_factory=dict)
    """(user, usage_id) -> the message that billed it in this batch (a rolled-back message's
    entry is left, harmless: only record ids its user's queue still holds are written)."""
    _handed_out: set[UUID] = field(default_factory=set, init=False, repr=False)
    """Users whose queue `queue` handed to a handler (it may differ from the loaded one)."""
    repeats: dict[UUID, Fate] = field(default_factory=dict)
    """Message ids of messages that repeated a business key seen before (an order bought, a
    billing record billed), with the fate that says which (domain.delivery.REPEATS)."""
    granted_since: dict[UUID, tuple[int, datetime]] = field(default_factory=dict)
    """Per user, the seq of a grant a purchase caused and when that purchase was published
    (H_ORIGIN_TS): observed after the commit (`granted`) if that grant is the one written."""

    def savepoint(self, user_id: UUID | None) -> Savepoint:
        """The state one message may change (its user's), to go back to if it fails. A user's
        queue no handler has had yet is as loaded, which the loaded queue remembers
        (`as_loaded`): nothing is copied for it (the first message of each user in a batch)."""
        loaded = self.queues.get(user_id) if user_id is not None else None
        queue = _copy(loaded) if loaded is not None and user_id in self._handed_out else None
        return Savepoint(
            user_id=user_id,
            queue=queue,
            outbox_len=len(self.outbox_rows),
            withdrawn_len=len(self.withdrawn),
            audit_len=len(self.audit),
            access_change=self.access_changes.get(user_id) if user_id is not None else None,
            remaining=dict(self.remaining.get(user_id, {})) if user_id is not None else {},
        )

    def rollback(self, point: Savepoint) -> None:
        """Undo what a failed message changed (its neighbours' changes stay). Item ids it took
        are not handed back: a gap in the ids is harmless."""
        del self.outbox_rows[point.outbox_len :]
        del self.withdrawn[point.withdrawn_len :]
        del self.audit[point.audit_len :]
        user_id = point.user_id
        if user_id is None:
            return
        if point.queue is not None:
            self.queues[user_id] = point.queue
        elif user_id in self.queues:  # no handler had it before this message: as loaded
            self.queues[user_id] = self.queues[user_id].as_loaded()
        if point.access_change is None:
            self.access_changes.pop(user_id, None)
        else:
            self.access_changes[user_id] = point.access_change
        self.remaining[user_id] = point.remaining

    def granted(self) -> list[datetime]:
        """When the purchases were published whose grants this batch writes (the write drops
        a user whose grant was stale)."""
        found = []
        for user, (seq, origin) in self.granted_since.items():
            change = self.access_changes.get(user)
            if change is not None and change.granted and change.seq == seq:
                found.append(origin)
        return found

    def rows_to_write(self) -> list[outbox.OutboxMessage]:
        """The follow-up rows, less timers withdrawn later in the batch (never written)."""
        if not self.withdrawn:
            return self.outbox_rows
        cut: dict[str, int] = {}
        for key, made in self.withdrawn:
            cut[key] = max(cut.get(key, 0), made)
        return [
            row
            for index, row in enumerate(self.outbox_rows)
            if row.cancel_key is None or index >= cut.get(row.cancel_key, 0)
        ]

    def billings_to_write(self) -> list[batch_write.NewBilling]:
        """The usage records billed under a record id in this batch, as usage_billed keeps them."""
        found = []
        for user_id, loaded in self.queues.items():
            usages = loaded.queue.usages
            if len(usages) == len(loaded.usages_before):
                continue  # nothing is ever removed from it: same size, nothing new
            for usage_id, billed in usages.items():
                if usage_id not in loaded.usages_before:
                    message_id = self.billed_by[(user_id, usage_id)]
                    found.append(batch_write.NewBilling(user_id, usage_id, message_id, billed))
        return found

    def remaining_to_write(self) -> dict[tuple[UUID, int], int | None]:
        return {(u, i): r for u, items in self.remaining.items() for i, r in items.items()}

    def queue(self, user_id: UUID) -> LoadedQueue:
        """The user's queue, for a handler to change (every change goes through here)."""
        loaded = self.queues.get(user_id)
        if loaded is None:
            raise NotInBatchError(f"user {user_id} was not locked by this batch")
        self._handed_out.add(user_id)
        return loaded

    def record(
        self,
        loaded: LoadedQueue,
        events: list[DomainEvent],
        envelope: Envelope,
        traceparent: str | None,
        raw: RawDelivery | None = None,
    ) -> None:
        """The events of a transition: follow-up rows (numbered from the user's sequence),
        timers withdrawn, and node management's remaining traffic."""
        # Loops rather than comprehensions and generators: this runs for every message.
        user_id = loaded.queue.user_id
        made = len(self.outbox_rows)
        withdrawn: list[str] = []
        for event in events:
            if isinstance(event, ExpiryUnscheduled):
                # A timer scheduled and withdrawn in the same batch (an item activated and
                # consumed at once) is never written; one written earlier is deleted.
                key = expiry_key(event.item_id)
                withdrawn.append(key)
                self.withdrawn.append((key, made))
        messages: list[Outgoing] = []
        for event in events:
            out = outgoing(event)
            if out is not None and out.cancel_key not in withdrawn:
                messages.append(out)
            # Node management sees remaining traffic change in the same transaction as billing.
            if isinstance(event, UsageRemaining):
                self.remaining.setdefault(user_id, {})[event.item_id] = event.remaining
            elif isinstance(event, _LEAVES_NOTHING):
                # Nothing left on it from now on (applied only where it is the granted item).
                self.remaining.setdefault(user_id, {})[event.item_id] = 0
        if not messages:
            return
        trace = traceparent or envelope.traceparent
        origin = _origin(raw, envelope) if raw is not None else None
        for out, seq in zip(messages, loaded.take_seqs(len(messages)), strict=True):
            row = outbox.from_outgoing(out, seq=seq, traceparent=trace)
            if origin is not None and out.route.name in _CHAINED:
                row.headers[H_ORIGIN_TS] = origin
            self.outbox_rows.append(row)

    def change_access(self, change: batch_write.Change) -> None:
        """Of a user's grants and revokes in a batch, only the newest (highest seq) can stick."""
        current = self.access_changes.get(change.user_id)
        if current is None or change.seq > current.seq:
            self.access_changes[change.user_id] = change


def _origin(raw: RawDelivery, envelope: Envelope) -> str | None:
    """The H_ORIGIN_TS of a message's chained follow-ups: a purchase's own critical start, or
    what the follow-up of one carries (pkgq's own: an outsider's x-pkgq-* headers are moved
    away); None for anything else (an activation after an expiry owes nothing to a purchase)."""
    carried = raw.headers.get(H_ORIGIN_TS)
    if isinstance(carried, str):
        return carried
    if envelope.message_type == PACKAGE_PURCHASE.message_type:
        return since_of(raw, envelope)[0].isoformat()
    return None


@record
class Savepoint:
    user_id: UUID | None
    queue: LoadedQueue | None
    """A copy of the user's queue to go back to; None when no handler of the batch had had it
    yet (going back is going back to the queue as loaded) or the user is not in the batch."""
    outbox_len: int
    withdrawn_len: int
    audit_len: int
    access_change: batch_write.Change | None
    remaining: dict[int, int | None]


def _copy(loaded: LoadedQueue) -> LoadedQueue:
    """The user's queue as it is, to go back to: the queue copied, its sequence kept (what
    it was loaded as never changes, so that is shared)."""
    return LoadedQueue(
        loaded.queue.copy(),
        loaded.items_before,
        loaded.user_before,
        loaded.seq,
        loaded.seq_before,
        loaded.orders_before,
        loaded.usages_before,
    )


@record
class HandlerContext:
    conn: Conn
    """The batch's connection (read-only for handlers: the pipeline writes)."""
    now: datetime
    """The batch's clock (UnitOfWork.now): read under the users' locks."""
    envelope: Envelope
    work: UnitOfWork
    traceparent: str | None = None
    """The trace context follow-up events carry: the span applying this message (see
    infra/tracing.py), or the incoming message's."""
    raw: RawDelivery | None = None
    """The delivery (its headers carry H_ORIGIN_TS along a purchase's follow-ups)."""

    def package(self, package_id: int) -> Package | None:
        """A catalog entry the message's `Needs` named (None: not in the catalog)."""
        return self.work.packages.get(package_id)

    def new_item_ids(self, count: int) -> tuple[list[int], datetime]:
        """`count` item ids the message's `Needs` reserved, and when they were taken."""
        if count > len(self.work.new_ids) or self.work.created_at is None:
            raise NotInBatchError(f"{count} new item ids were not reserved for this message")
        taken, self.work.new_ids[:] = self.work.new_ids[:count], self.work.new_ids[count:]
        return taken, self.work.created_at

    def grant(self, user_id: UUID, item_id: int) -> None:
        """Grant access on the item, with its remaining traffic and expiry as they are now."""
        loaded = self.work.queue(user_id)
        item = next((i for i in loaded.queue.items if i.id == item_id), None)
        if item is None:
            return  # not this user's item: nothing to grant
        # None: unlimited traffic (the read model's remaining is NULL for it)
        remaining = item.remaining if item.status is ItemStatus.ACTIVE else 0
        seq = self.envelope.seq or 0
        self.work.change_access(
            batch_write.Change(user_id, seq, item.id, item.package_id, remaining, item.expire_at)
        )
        origin = header_time(self.raw.headers, H_ORIGIN_TS) if self.raw is not None else None
        if origin is not None:
            self.work.granted_since[user_id] = (seq, origin)

    def record_command(self, command: CancelPackage | AdjustQuota) -> None:
        """Record an operator's command on an item in the item audit, with this message's id,
        its reason and operator (and an adjustment's delta), and who published it as the broker
        verified it (the operator is only what the body claims)."""
        self.work.audit.append(
            audit.Entry(
                command.item_id,
                command.user_id,
                "adjust_quota" if isinstance(command, AdjustQuota) else "cancel",
                self.envelope.message_id,
                delta=command.delta if isinstance(command, AdjustQuota) else None,
                reason=command.reason,
                operator=command.operator,
                publisher=self.envelope.publisher,
            )
        )

    def revoke(self, user_id: UUID) -> None:
        self.work.queue(user_id)  # the user is locked like any other
        self.work.change_access(batch_write.Change(user_id, self.envelope.seq or 0))


Handler = Callable[[HandlerContext, Any], Awaitable[None]]
NeedsOf = Callable[[Any], Needs]


async def transition(
    ctx: HandlerContext,
    user_id: UUID,
    step: Callable[[UserQueue], list[DomainEvent]],
) -> list[DomainEvent]:
    """Run `step` on the user's queue (loaded by the batch, with the items the route's `Needs`
    named) and record its events. The batch writes the new state back."""
    loaded = ctx.work.queue(user_id)
    events = step(loaded.queue)
    ctx.work.record(loaded, events, ctx.envelope, ctx.traceparent, ctx.raw)
    return events
