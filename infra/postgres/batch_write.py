"""A batch's writes: the rows every batch of deliveries may write, each table's as one part of
its write statement (infra/postgres/compound.py gathers consecutive parts into one statement
unless they touch the same table). These are the batch's state, which the writer
(consumers/delivery/writer.py) adds in this order: inbox claims, the users' queues (items,
orders, user rows), usage billed under a record id, access, and (last) the transition counts.
A part with nothing to write is None and is not sent, so a batch costs a fixed number of
statements whatever its size. What a batch sends on (follow-up events and retries: the outbox),
its audit and its failure path (dead letters, attempts, parking, holds) live with their tables
and are asked for a part only when the batch has something of theirs to write.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple
from uuid import UUID

from domain.delivery import REPEATS, Fate, Source
from domain.model import BilledUsage, ItemStatus, QueueItem
from infra.postgres.access import Change as Change
from infra.postgres.compound import Part, part_of
from infra.postgres.pool import columns

if TYPE_CHECKING:
    from infra.postgres.batch_read import LoadedQueue

SLOTS = 8
"""Rows of the transition counters per (route, move): a batch adds to one of them, at random,
so concurrent writers seldom wait on one row (infra/postgres/transitions.py sums them)."""


class Claim(NamedTuple):
    """A message recorded as applied: its key (events/identity.py), the message_id people
    see, and the user its body names."""

    message_id: UUID
    user_id: UUID | None


def claim_many(consumer: str, messages: Mapping[UUID, Claim]) -> Part[int] | None:
    """Claim messages (their key -> what it is): a part of the batch's write statement
    (infra/postgres/compound.py), None when there are none. Its value is how many were claimed
    now (not applied before): the caller knows which it asked for, so only a shortfall, which
    means another transaction claimed some meanwhile, needs telling. The user is kept with the
    message (a user's timeline reads it).

    The same part marks `superseded` every dead letter of the consumer for a message it
    claims, by its key, whatever its status (buried; replayed or discarded, which a forced
    replay would otherwise send again): such a dead letter is never replayed, however long
    after the inbox forgets the message (infra/postgres/replay.py). Another publisher's or
    another user's message under the same message_id has another key: it supersedes nothing."""
    if not messages:
        return None
    return Part(
        (
            (
                "inbox_claimed",
                """
                INSERT INTO telecom.inbox (consumer, message_id, sent_as, user_id)
                SELECT $1, k, m, u FROM unnest($2::uuid[], $3::uuid[], $4::uuid[]) AS y(k, m, u)
                ON CONFLICT DO NOTHING RETURNING message_id
                """,
            ),
            (
                "inbox_superseded",
                """
                UPDATE telecom.dead_letters d SET status = 'superseded', superseded_at = now()
                WHERE d.status <> 'superseded' AND d.consumer = $1
                  AND d.message_key IN (SELECT message_id FROM inbox_claimed)
                """,
            ),
        ),
        (
            consumer,
            list(messages),
            [c.message_id for c in messages.values()],
            [c.user_id for c in messages.values()],
        ),
        # dead_letter_counts: what the dead letters' triggers write
        frozenset({"inbox", "dead_letters", "dead_letter_counts"}),
        "(SELECT count(*) FROM inbox_claimed)",
        int,
    )


def _counters_update(first: int) -> str:
    """The update of items' traffic counters from three arrays (id, upload, download), taken
    as parameters $first to $first+2: a statement of its own, or a CTE of the upsert."""
    ids, uploads, downloads = (f"${first + n}::bigint[]" for n in range(3))
    return f"""
        UPDATE telecom.package_queue AS q SET upload = c.upload, download = c.download
        FROM unnest({ids}, {uploads}, {downloads}) AS c(id, upload, download)
        WHERE q.id = c.id
    """


_COUNTERS = _counters_update(1)


_COUNTERS_CTE = _counters_update(18)


def _only_counters_differ(item: QueueItem, was: QueueItem) -> bool:
    """Whether `item` differs from how it was loaded in its traffic counters alone (a usage
    billed to it), the only change the counters' update writes. Its terms, id, user, order and
    creation never change once it is bought."""
    return (
        item.status is was.status
        and item.activated_at == was.activated_at
        and item.adjust_quota == was.adjust_quota
        and item.expire_at == was.expire_at
    )


def _counter_columns(items: list[QueueItem]) -> list[list[int]]:
    return [[i.id for i in items], [i.upload for i in items], [i.download for i in items]]


def save_queues(queues: Iterable[LoadedQueue]) -> list[Part[None]]:
    """New and changed items with the orders bought, and changed user rows: up to two parts
    of the batch's write statement (infra/postgres/compound.py)."""
    items: list[QueueItem] = []
    counted: list[QueueItem] = []
    users: list[LoadedQueue] = []
    orders: list[tuple[UUID, UUID, tuple[int, ...]]] = []
    for loaded in queues:
        queue = loaded.queue
        orders.extend(
            (queue.user_id, order, ids)
            for order, ids in queue.orders.items()
            if order not in loaded.orders_before
        )
        before = loaded.items_before
        for item in queue.items:
            was = before.get(item.id)
            if was is None:
                items.append(item)
            elif item != was:
                (counted if _only_counters_differ(item, was) else items).append(item)
        user_after = (queue.unbilled_upload, queue.unbilled_download, queue.has_access)
        if user_after != loaded.user_before or loaded.seq != loaded.seq_before:
            users.append(loaded)
    parts: list[Part[None]] = []
    if counted and not items:
        # Usage billed to items that change nothing else (most of a usage batch): three short
        # arrays instead of the upsert's fourteen, and a plain update instead of a speculative
        # insert. With other items to write as well, it rides on their part (below).
        parts.append(
            Part((("queue_counted", _COUNTERS),), tuple(_counter_columns(counted)), _ITEM_TABLES)
        )
    elif items:
        # Items leaving `active` are written before the ones entering it (the rows go in in
        # this order), so the partial unique index (one active item per user) never sees two.
        items.sort(key=lambda i: i.status is ItemStatus.ACTIVE)
        # An order bought comes with its new items, so it rides on their part. No ON CONFLICT
        # there: under the users' locks an order is never bought twice, so a conflict would
        # be a bug, and the key refuses it rather than hide it.
        args = (
            *columns(items, "id", "user_id", "package_id", "by_order", "status.value"),
            *columns(items, "created_at", "activated_at", "upload", "download", "adjust_quota"),
            *columns(items, "expire_at", "terms.package_name", "terms.traffic_limit"),
            *columns(items, "terms.duration"),
            [u for u, _, ids in orders for _ in ids],
            [o for _, o, ids in orders for _ in ids],
            [i for _, _, ids in orders for i in ids],
            *_counter_columns(counted),
        )
        parts.append(Part(_UPSERT, args, _ITEM_TABLES))
    if users:
        args = (
            *columns(users, "queue.user_id", "queue.unbilled_upload", "queue.unbilled_download"),
            *columns(users, "queue.has_access", "seq"),
        )
        parts.append(Part((("queue_users_saved", _USERS),), args, frozenset({"queue_users"})))
    return parts


_ITEM_TABLES = frozenset({"package_queue", "orders"})


_UPSERT = (
    (
        "queue_bought",
        """
        INSERT INTO telecom.orders (user_id, by_order, item_ids)
        SELECT o.user_id, o.by_order, array_agg(o.item_id ORDER BY o.item_id)
        FROM unnest($15::uuid[], $16::uuid[], $17::bigint[]) AS o(user_id, by_order, item_id)
        GROUP BY o.user_id, o.by_order
        """,
    ),
    # Items whose counters alone changed: never among the rows the upsert writes.
    ("queue_counted", _COUNTERS_CTE),
    (
        "queue_saved",
        """
        INSERT INTO telecom.package_queue AS q
            (id, user_id, package_id, by_order, status, created_at, activated_at,
             upload, download, adjust_quota, expire_at, package_name, traffic_limit, duration)
        SELECT x.id, x.user_id, x.package_id, x.by_order, x.status::telecom.package_status,
               x.created_at, x.activated_at, x.upload, x.download, x.adjust_quota, x.expire_at,
               x.package_name, x.traffic_limit, x.duration
        FROM unnest($1::bigint[], $2::uuid[], $3::bigint[], $4::uuid[], $5::text[],
                    $6::timestamptz[], $7::timestamptz[], $8::bigint[], $9::bigint[],
                    $10::bigint[], $11::timestamptz[], $12::text[], $13::bigint[],
                    $14::interval[])
             WITH ORDINALITY AS x(id, user_id, package_id, by_order, status, created_at,
                                  activated_at, upload, download, adjust_quota, expire_at,
                                  package_name, traffic_limit, duration, ord)
        ORDER BY x.ord
        -- the terms are written once, at purchase, and never updated
        ON CONFLICT (id) DO UPDATE SET
            status = EXCLUDED.status, activated_at = EXCLUDED.activated_at,
            upload = EXCLUDED.upload, download = EXCLUDED.download,
            adjust_quota = EXCLUDED.adjust_quota, expire_at = EXCLUDED.expire_at
        """,
    ),
)


_USERS = """
    UPDATE telecom.queue_users u
    SET unbilled_upload = x.up, unbilled_download = x.down, has_access = x.access,
        seq = x.seq, updated_at = now()
    FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bool[], $5::bigint[])
         AS x(user_id, up, down, access, seq)
    WHERE u.user_id = x.user_id
"""


@dataclass(frozen=True, slots=True)
class NewBilling:
    user_id: UUID
    usage_id: str
    message_id: UUID
    billed: BilledUsage


def bill_usages(billed: Sequence[NewBilling], keep_days: int) -> Part[None] | None:
    """The records billed by a batch: a part of its write statement (none when there are
    none). No ON CONFLICT: under the users' locks a record id is never billed twice, so a
    conflict would be a bug, and the key refuses it rather than hide it."""
    if not billed:
        return None
    return part_of(
        """
        INSERT INTO telecom.usage_billed
            (user_id, usage_id, message_id, item_id, upload, download, recorded_at, keep_until)
        SELECT x.user_id, x.usage_id, x.message_id, x.item_id, x.upload, x.download,
               x.recorded_at, now() + make_interval(days => $8)
        FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::bigint[], $5::bigint[],
                    $6::bigint[], $7::timestamptz[])
             AS x(user_id, usage_id, message_id, item_id, upload, download, recorded_at)
        """,
        (
            *columns(billed, "user_id", "usage_id", "message_id", "billed.item_id"),
            *columns(billed, "billed.upload", "billed.download", "billed.recorded_at"),
            keep_days,
        ),
        ("usage_billed",),
        name="usage_billed_written",
    )


def write_access(
    changes: Mapping[UUID, Change],
    remaining: Mapping[tuple[UUID, int], int | None],
) -> tuple[Part[set[UUID]] | None, Part[None] | None]:
    """A batch's access updates, a part of its write statement per kind (None: nothing of
    that kind). `changes`: per user, the grant or revoke with the highest seq (applied in
    order, only the newest of them could stick); `remaining`: new traffic left per (user,
    item), applied where that item is the granted one. Both write `access`, so they never
    share a statement: the remaining update sees the grants. The first part's value: the users
    whose change was newer than the row's (the others were stale)."""
    granted: Part[set[UUID]] | None = None
    left: Part[None] | None = None
    if changes:
        granted = part_of(
            """
            INSERT INTO telecom.access AS a
                (user_id, granted, item_id, package_id, remaining, expire_at, seq)
            SELECT * FROM unnest($1::uuid[], $2::bool[], $3::bigint[], $4::bigint[],
                                 $5::bigint[], $6::timestamptz[], $7::bigint[])
            ON CONFLICT (user_id) DO UPDATE
            SET granted = EXCLUDED.granted, item_id = EXCLUDED.item_id,
                package_id = EXCLUDED.package_id, remaining = EXCLUDED.remaining,
                expire_at = EXCLUDED.expire_at, seq = EXCLUDED.seq, updated_at = now()
            WHERE a.seq < EXCLUDED.seq
            RETURNING a.user_id
            """,
            (
                [c.user_id for c in changes.values()],
                [c.granted for c in changes.values()],
                [c.item_id for c in changes.values()],
                [c.package_id for c in changes.values()],
                [c.remaining for c in changes.values()],
                [c.expire_at for c in changes.values()],
                [c.seq for c in changes.values()],
            ),
            ("access",),
            name="access_changed",
            result="ARRAY(SELECT user_id FROM access_changed)",
            decode=set,
        )
    if remaining:
        left = part_of(
            """
            UPDATE telecom.access a SET remaining = x.remaining, updated_at = now()
            FROM unnest($1::uuid[], $2::bigint[], $3::bigint[]) AS x(user_id, item_id, remaining)
            WHERE a.user_id = x.user_id AND a.item_id = x.item_id AND a.granted
            """,
            (
                [user for user, _ in remaining],
                [item for _, item in remaining],
                list(remaining.values()),
            ),
            ("access",),
            name="access_remaining",
        )
    return granted, left


def moves_of(route: str, fates: Sequence[Fate], source: Source) -> dict[tuple[str, str], int]:
    """A batch's transition counts (bury and ttl are counted by a trigger on the dead-letter
    store; a retry scheduled is a "release"). A parked message was counted as taken when parked."""
    fates = [f for f in fates if f is not Fate.GIVEN_BACK]
    taken = len(fates) if source is Source.QUEUE else 0
    acked = sum(1 for f in fates if f is Fate.ACKED or f in REPEATS)
    retried = sum(1 for f in fates if f is Fate.RETRIED)
    return {(route, "take"): taken, (route, "ack"): acked, (route, "release"): retried}


def count_moves(
    moves: Mapping[tuple[str, str], int], route: str = "", critical: Sequence[int] = ()
) -> Part[None] | None:
    """`count` as a part of a batch's write statement (infra/postgres/compound.py): the
    totals, and this second's bucket of the ring. A bucket still holding an older second starts
    again; a move counted late for a second already taken over by a later one is past the
    minute, and left out of the ring. `critical`: the route's applied messages' critical-time
    buckets, counted in this minute's ring row (telecom.critical_minutes: trends.py reads it)."""
    items = [(route, move, n) for (route, move), n in moves.items() if n]
    if not items and not critical:
        return None
    return Part(
        (
            (
                "moves_given",
                """
                SELECT route, move, n FROM unnest($1::text[], $2::text[], $3::bigint[])
                    AS m(route, move, n)
                """,
            ),
            (
                "moves_totalled",
                """
                INSERT INTO telecom.transition_counts AS c (route, transition, slot, count)
                SELECT route, move, $4, n FROM moves_given
                ON CONFLICT (route, transition, slot) DO UPDATE SET count = c.count + excluded.count
                """,
            ),
            (
                "moves_timed",
                """
                INSERT INTO telecom.transition_seconds AS s
                    (transition, route, second, slot, at, count)
                SELECT move, route, (t.at % 60)::smallint, $4, t.at, n
                FROM moves_given,
                     (SELECT floor(extract(epoch FROM statement_timestamp()))::bigint AS at) t
                ON CONFLICT (transition, route, second, slot) DO UPDATE SET
                    count = CASE WHEN s.at = excluded.at THEN s.count + excluded.count
                                 WHEN s.at < excluded.at THEN excluded.count
                                 ELSE s.count END,
                    at = greatest(s.at, excluded.at)
                """,
            ),
            (
                "critical_counted",  # a minute's row replaces the one an hour older
                """
                INSERT INTO telecom.critical_minutes AS c (route, minute, bucket, slot, at, count)
                SELECT $5, (extract(epoch FROM t)::bigint / 60 % 60)::smallint, b, $4, t, count(*)
                FROM unnest($6::smallint[]) AS b, date_trunc('minute', statement_timestamp()) t
                GROUP BY b, t
                ON CONFLICT (route, minute, bucket, slot) DO UPDATE SET at = excluded.at,
                    count = excluded.count + CASE WHEN c.at = excluded.at THEN c.count ELSE 0 END
                """,
            ),
        ),
        (
            [i[0] for i in items],
            [i[1] for i in items],
            [i[2] for i in items],
            random.randrange(SLOTS),  # spread writers (in containers every pid is 1)
            route,
            list(critical),
        ),
        # The outbox's trigger adds 'put' rows to transition_counts, never counted here, and
        # after the statement: a part that adds outbox rows may share it.
        frozenset({"transition_counts", "transition_seconds", "critical_minutes"}),
    )
