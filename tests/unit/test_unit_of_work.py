"""The batch's in-memory unit of work: what a failed message leaves behind (nothing), timers
withdrawn within the batch, and which access change sticks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID

from consumers.unit_of_work import HandlerContext, UnitOfWork, transition
from domain.model import BilledUsage, ItemStatus, Package, QueueItem
from events.envelope import Envelope
from infra.postgres import batch_write
from infra.postgres.batch_read import UserRow, loaded_queue

A = UUID("00000000-0000-4000-8000-00000000000a")
B = UUID("00000000-0000-4000-8000-00000000000b")
T0 = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
MONTHLY = Package(id=2, name="monthly", traffic_limit=100, duration=timedelta(days=30))


def work_for(*users: UUID) -> UnitOfWork:
    queues = {u: loaded_queue(UserRow(u, 0, 0, False, 0), []) for u in users}
    return UnitOfWork(T0, queues, {MONTHLY.id: MONTHLY}, list(range(1, 11)), T0)


def context(work: UnitOfWork, user: UUID, seq: int | None = None) -> HandlerContext:
    envelope = Envelope(
        message_id=UUID(int=seq or 1), message_type="t", schema_version=1, user_id=user, seq=seq
    )
    return HandlerContext(None, T0, envelope, work)  # type: ignore[arg-type]  # no I/O here


async def buy_and_activate(work: UnitOfWork, user: UUID, amount: int = 1) -> list[int]:
    ctx = context(work, user)
    ids, at = ctx.new_item_ids(amount)
    await transition(ctx, user, lambda q: q.purchase(MONTHLY, None, amount, ids, at))
    await transition(ctx, user, lambda q: q.advance(T0))
    return ids


async def test_a_rolled_back_message_leaves_its_users_queue_and_outbox_rows_as_before() -> None:
    work = work_for(A, B)
    await buy_and_activate(work, A)
    rows_before = list(work.outbox_rows)
    seq_before = work.queues[A].seq
    point = work.savepoint(A)
    await transition(context(work, A), A, lambda q: q.record_usage(100, 0, T0))  # uses it up
    assert work.queues[A].queue.items[0].status is ItemStatus.CONSUMED
    work.rollback(point)
    assert work.queues[A].queue.items[0].status is ItemStatus.ACTIVE
    assert work.queues[A].seq == seq_before
    assert work.outbox_rows == rows_before
    assert work.remaining_to_write() == {}


async def test_a_rollback_keeps_what_other_users_messages_changed_before_it() -> None:
    work = work_for(A, B)
    await buy_and_activate(work, B)
    point = work.savepoint(A)
    await buy_and_activate(work, A)
    work.rollback(point)
    assert [i.status for i in work.queues[B].queue.items] == [ItemStatus.ACTIVE]
    assert work.queues[A].queue.items == []
    assert {r.user_id for r in work.outbox_rows} == {B}


async def test_a_timer_scheduled_and_withdrawn_in_one_batch_is_never_written() -> None:
    work = work_for(A)
    (item,) = await buy_and_activate(work, A)
    timers = [r for r in work.outbox_rows if r.cancel_key == f"expire:{item}"]
    assert len(timers) == 1
    await transition(context(work, A), A, lambda q: q.record_usage(100, 0, T0))
    assert f"expire:{item}" not in {r.cancel_key for r in work.rows_to_write()}
    assert [key for key, _ in work.withdrawn] == [f"expire:{item}"]  # deleted from the db too


async def test_of_a_users_grants_and_revokes_in_one_batch_the_highest_seq_sticks() -> None:
    work = work_for(A)
    (item,) = await buy_and_activate(work, A)
    context(work, A, seq=5).grant(A, item)
    context(work, A, seq=7).revoke(A)
    context(work, A, seq=6).grant(A, item)
    change = work.access_changes[A]
    assert change == batch_write.Change(A, 7)
    assert not change.granted


async def test_a_grant_carries_the_items_remaining_traffic_and_expiry_as_loaded() -> None:
    work = work_for(A)
    (item,) = await buy_and_activate(work, A)
    await transition(context(work, A), A, lambda q: q.record_usage(30, 10, T0))
    context(work, A, seq=3).grant(A, item)
    change = work.access_changes[A]
    assert (change.item_id, change.remaining) == (item, 60)
    assert change.expire_at == T0 + timedelta(days=30)


async def test_a_users_first_message_rolled_back_leaves_the_queue_as_loaded_without_a_copy() -> (
    None
):
    item = QueueItem(1, A, MONTHLY.terms(), None, ItemStatus.ACTIVE, T0, T0, upload=10)
    as_loaded = item.copy()
    order = UUID(int=77)
    loaded = loaded_queue(
        UserRow(A, 5, 6, True, 3),
        [item],
        orders={order: (1,)},
        usages={"u-1": BilledUsage(1, 10, 0, None)},
    )
    work = UnitOfWork(T0, {A: loaded}, {MONTHLY.id: MONTHLY}, list(range(2, 11)), T0)
    point = work.savepoint(A)
    assert point.queue is None  # nothing copied for a queue as loaded
    ctx = context(work, A)
    ids, at = ctx.new_item_ids(2)
    await transition(ctx, A, lambda q: q.purchase(MONTHLY, UUID(int=78), 2, ids, at))
    await transition(ctx, A, lambda q: q.record_usage(200, 0, T0, usage_id="u-2"))
    changed = work.queues[A]
    assert changed.seq > 3
    assert len(changed.queue.items) == 3
    assert "u-2" in changed.queue.usages
    work.rollback(point)
    back = work.queues[A]
    queue = back.queue
    assert item.upload == 210  # the handlers changed the loaded item itself
    assert queue.items == [as_loaded]
    assert queue.items[0] is not loaded.items_before[1]
    assert (queue.unbilled_upload, queue.unbilled_download, queue.has_access) == (5, 6, True)
    assert queue.orders == {order: (1,)}
    assert set(queue.usages) == {"u-1"}
    assert back.seq == 3
    assert work.outbox_rows == []
    # A second message of the user in the batch finds it handed out: that one is copied.
    again = work.savepoint(A)
    assert again.queue is not None
