"""The holds' checks: every hold has a bounded way out.

A hold on (consumer, user) waits on its blocker, by the blocker's key (events/identity.py). Its
way out is the blocker's own pending retry (the outbox row whose cancel key names that key) or
its buried dead letter on the consumer; a copy of its message_id that another publisher sent,
or that names another user, is another message and no way out of this hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from infra.postgres.check_base import GRACES, Check, Graces
from infra.postgres.holds import HOLD_KEY
from infra.postgres.pool import Conn, from_row

_OWN_RETRY = f"""o.route = 'telecom.' || h.consumer AND o.user_id = h.user_id
          AND o.message_id = h.blocker
          AND telecom.message_key(o.message_id, o.headers ->> 'x-pkgq-publisher', o.user_id)
              = {HOLD_KEY}"""
"""Outbox row `o` sends hold `h`'s very blocker (a retry or a replay carries the first
publisher in x-pkgq-publisher): its message_id, publisher and user are the hold's."""


def _pending(grace: str) -> str:
    """Hold `h`'s blocker has an outbox row unpublished, or published within the grace (the
    parameter `grace` holds OUTBOX_GRACE_S): a retry (or replay) of that very message on its
    way, to the hold's consumer. Another user's or publisher's copy releases nothing."""
    return f"""EXISTS (
        SELECT 1 FROM telecom.outbox o
        WHERE {_OWN_RETRY}
          AND (o.published_at IS NULL
               OR o.published_at > now() - make_interval(secs => {grace}::float8)))"""


_BURIED = f"""EXISTS (
        SELECT 1 FROM telecom.dead_letters d
        WHERE d.consumer = h.consumer AND d.message_key = {HOLD_KEY}
          AND d.user_id = h.user_id AND d.status = 'buried')"""
"""Hold `h`'s blocker lies buried on the hold's consumer: a replay or a discard releases it
(another user's or publisher's dead letter of the same message_id releases nothing)."""


HOLD_WITHOUT_WAY_OUT = Check(
    "hold_without_way_out",
    "a hold's blocker has no pending retry and no buried dead letter: nothing will release it",
    f"""
    SELECT h.consumer, h.user_id, h.blocker, h.state, h.attempts, h.since,
           count(*) OVER () AS total
    FROM telecom.holds h
    WHERE h.blocker IS NOT NULL AND NOT {_pending("$2")} AND NOT {_BURIED}
    ORDER BY h.since, h.consumer, h.user_id
    LIMIT $1
    """,
    lambda g: (g.outbox_s,),
)

HOLD_PAST_ITS_BOUND = Check(
    "hold_past_its_bound",
    "a hold's blocker was retried (or deferred) more often than any bound pkgq sets: it is "
    "being retried for ever",
    """
    SELECT h.consumer, h.user_id, h.blocker, h.state, h.attempts, h.since, h.last_error,
           count(*) OVER () AS total
    FROM telecom.holds h
    WHERE h.blocker IS NOT NULL AND h.state = 'retrying' AND h.attempts > $2
    ORDER BY h.since, h.consumer, h.user_id
    LIMIT $1
    """,
    lambda g: (g.attempts_bound,),
)

HOLD_WAITS_ON_ANOTHER_COPY = Check(
    "hold_waits_on_another_copy",
    "a hold's blocker has no way out of its own, but a retry of its message_id from another "
    "publisher or for another user is pending: that copy will never release it",
    f"""
    SELECT h.consumer, h.user_id, h.blocker, h.state, h.since, o.id AS retry_id,
           o.user_id AS retry_user_id, o.headers ->> 'x-pkgq-publisher' AS retry_publisher,
           count(*) OVER () AS total
    FROM telecom.holds h
    JOIN telecom.outbox o
      ON o.message_id = h.blocker AND o.route = 'telecom.' || h.consumer
     AND o.published_at IS NULL AND o.cancel_key LIKE 'retry:%'
    WHERE h.blocker IS NOT NULL AND NOT {_pending("$2")} AND NOT {_BURIED}
    ORDER BY h.since, h.consumer, h.user_id, o.id
    LIMIT $1
    """,
    lambda g: (g.outbox_s,),
)


@dataclass(frozen=True, slots=True)
class HoldWayOut:
    """One hold, and whether its blocker has a way out (the first check, for this hold)."""

    consumer: str
    user_id: UUID
    blocker: UUID | None
    state: str
    attempts: int
    last_error: str | None
    since: datetime
    parked: int
    pending_retry: bool
    buried: bool

    @property
    def orphaned(self) -> bool:
        """A blocker with no way out: nothing but an operator will ever release this hold."""
        return self.blocker is not None and not self.pending_retry and not self.buried

    @property
    def release_warning(self) -> str | None:
        """What an operator's release leaves behind, and what becomes of it (None: nothing,
        the hold is orphaned). A release is never refused for it: nothing anyone sends can
        keep an operator from letting a user's messages go."""
        if self.buried:
            return (
                f"message {self.blocker} lies buried: released, the {self.parked} parked "
                "message(s) are applied first; its dead letter stays buried, to be replayed "
                "(after them, out of order) or discarded"
            )
        if self.pending_retry:
            return (
                f"a retry of message {self.blocker} is on its way: released, the "
                f"{self.parked} parked message(s) are applied first, and the retry is applied "
                "when it comes, after them (out of order)"
            )
        return None


async def hold_way_out(
    conn: Conn, consumer: str, user_id: UUID, *, graces: Graces = GRACES, lock: bool = False
) -> HoldWayOut | None:
    """The hold on (consumer, user) and its way out, if there is such a hold. `lock`: inside a
    transaction, lock the hold until it ends (it is the only row an operator's release locks,
    so it needs no place in the writers' lock order of user, then hold)."""
    row = await conn.fetchrow(
        f"""
        SELECT h.consumer, h.user_id, h.blocker, h.state, h.attempts, h.last_error, h.since,
               (SELECT count(*) FROM telecom.parked p
                WHERE p.consumer = h.consumer AND p.user_id = h.user_id) AS parked,
               h.blocker IS NOT NULL AND {_pending("$3")} AS pending_retry,
               h.blocker IS NOT NULL AND {_BURIED} AS buried
        FROM telecom.holds h
        WHERE h.consumer = $1 AND h.user_id = $2
        {"FOR UPDATE OF h" if lock else ""}
        """,
        consumer,
        user_id,
        graces.outbox_s,
    )
    return None if row is None else from_row(HoldWayOut, row)
