"""What becomes of a delivery: one `Decision` per delivery, decided by pure functions.

A batch of one route's deliveries is decided in delivery order against the batch's snapshot
(which messages the consumer applied before, the holds on the batch's users, each message's
failures counted so far). The `Gate` holds that snapshot and keeps it up to date as the batch
goes, so a failure early in a batch holds its user's later messages in the same batch:

1. `Gate.admit` decides what needs no handler: a duplicate, a message past its TTL, a member of
   a cancelled group, a message that must wait behind its user's blocker (parked). None: run
   the handler.
2. `Gate.decide` turns the handler's result (None, or a `Failure` of some `ErrorKind`) into the
   decision: applied, buried at once, retried at T, or buried after its last attempt.
3. `Gate.note` folds the decision back into the snapshot.

Nothing here does I/O: the writer (consumers/delivery/writer.py) turns a batch's decisions into
statements, and the consumer loop derives the transport's ack or give-back from the fate.

Attempts are counted here and stored in Postgres only. Every failure of a message moves its
count by one or buries it; no header of the delivery plays a part, so nobody who publishes can
skip, repeat or lose a retry by what it writes in `x-attempt`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from domain.records import record


class Fate(enum.StrEnum):
    """What became of a delivery: each name is its value, the `outcome` label of pkgq's metrics
    and log lines."""

    ACKED = "acked"
    """Applied: its handler's changes committed, the message acknowledged."""
    DUPLICATE = "duplicate"
    """The same message (its key: message_id, publisher, user) again: the consumer applied it
    before; nothing was run."""
    DUPLICATE_ORDER = "duplicate_order"
    """A purchase of an order bought before, under a new message_id: applied as nothing."""
    DUPLICATE_USAGE = "duplicate_usage"
    """A usage record whose (user, usage_id) was billed before, under a new message_id: applied
    as nothing."""
    CANCELLED = "cancelled"
    """A member of a cancelled group: acknowledged without running the handler."""
    EXPIRED = "expired"
    """Taken after its TTL (or its next attempt would come after it): buried as `expired`."""
    PARKED = "parked"
    """Kept behind its user's blocker, to be applied in order once the blocker is done."""
    RETRIED = "retried"
    """Failed; scheduled again at `retry_at`, its user's later messages held behind it."""
    DEAD_LETTERED = "dead_lettered"
    """Buried: filed as a dead letter with its reason (`pkgq dlq`), to be replayed or
    discarded by an operator."""
    GIVEN_BACK = "given_back"
    """Not decided in this run (the handler of it or of an earlier delivery ran past the
    route's TTR): back to the queue in its place, or left parked."""
    UNDECIDED = "undecided"
    """Its failure could not even be recorded (the transaction that records it failed too):
    the consumer's last resort files a confirmed copy in the dead-letter queue; the rest of
    its batch keeps what was decided."""


REPEATS = frozenset({Fate.DUPLICATE_ORDER, Fate.DUPLICATE_USAGE})
"""Applied as nothing: a business key (an order, a billing record id) seen before under another
message_id. Recorded in the inbox and acknowledged like an applied message."""
DONE = frozenset({Fate.ACKED, Fate.DUPLICATE, Fate.CANCELLED, Fate.EXPIRED, *REPEATS})
"""Fates after which the message is finished with and never blocks anyone."""


class Source(enum.Enum):
    """Where the deliveries come from, which decides what a lifted hold on their user means."""

    QUEUE = "queue"
    """From the broker: behind any hold (blocked, or being drained) they are parked."""
    PARKING = "parking"
    """Taken from the parking lot by the drain, behind a lifted hold: they may go."""


class ErrorKind(enum.Enum):
    """How a failure is treated (docs/explanation/failures.md)."""

    RULE = "rule"
    """A broken domain rule or a `Bury` from the handler: buried at once, holding nothing."""
    PERMANENT = "permanent"
    """A data error Postgres refuses every time: buried at once; it holds its user, as any
    buried message does, since a later message of the user may depend on it."""
    HANDLER = "handler"
    """May pass (a bug fixed by a deploy, a dependency down): retried with backoff."""
    TTR = "ttr"
    """Ran past the route's TTR on every strike: buried, holding its user."""
    NEWER = "newer"
    """A schema version newer than this pkgq knows: left for a newer pkgq. Deferred after the
    failure's delay, holding its user, each deferral counted like an attempt; after `limit`
    deferrals (a rolling upgrade is long over) it is buried as `unknown_version`, holding its
    user like any buried message, for an operator to replay once the new pkgq runs."""


@dataclass(frozen=True, slots=True)
class Failure:
    kind: ErrorKind
    reason: str
    """The dead-letter reason when it is buried at once (`domain_rule`, a `Bury`'s reason,
    `data_error`, `ttr`); a retried failure that runs out is buried as `max_attempts`."""
    error_type: str
    message: str
    location: str = ""
    traceback: str = ""
    delay: float | None = None
    """A `Retry`'s own pause (None: the policy's backoff)."""
    limit: int | None = None
    """NEWER: how many times it is deferred at most before it is buried."""

    @property
    def summary(self) -> str:
        return f"{self.error_type}: {self.message}"


@dataclass(frozen=True, slots=True)
class Hold:
    """A user's hold on the consumer: `blocker` is the key of the message their later ones wait
    behind (events/identity.py: never a message_id alone, which anyone can send a copy under),
    None: lifted, the parked messages are being drained in order."""

    blocker: UUID | None
    state: str


@record
class Facts:
    """What the snapshot says of one delivery."""

    index: int
    key: UUID
    """The message's identity (events/identity.py): message_id, first publisher, body's user.
    Everything here (seen, attempts, a hold's blocker) is matched on it."""
    user_id: UUID | None
    expires_at: datetime | None = None
    cancelled_member: bool = False
    """A member of a group an operator cancelled."""


@record
class Decision:
    fate: Fate
    reason: str | None = None
    """Why it was buried (DEAD_LETTERED, EXPIRED)."""
    failure: Failure | None = None
    attempt: int = 0
    """Its failures counted so far, this one included (0: this run counted none)."""
    retry_at: datetime | None = None
    holds: str | None = None
    """`retrying` or `buried`: the message now holds its user's later messages back."""
    lifts: bool = False
    """It was its user's blocker and is done with: the hold is lifted, the parked may go."""
    behind: UUID | None = None
    """PARKED: the blocker it waits behind (None: a lifted hold being drained)."""
    counted: bool = False
    """This decision counts one more failure of the message."""

    @property
    def counts_against_route(self) -> bool:
        """A failure of the route's own: a handler error, a TTR, a failure that could not even
        be recorded (an outage). What a circuit breaker judges a route by. What pkgq refuses
        before, or without, any fault of the handler's (bad input, an untrusted publisher, a
        broken domain rule, a data error Postgres refuses every time, which the message's own
        values cause, an unknown version, a message past its TTL) never counts: anyone who can
        publish could otherwise pause a route for all."""
        if self.fate is Fate.UNDECIDED:
            return True
        failure = self.failure
        return (
            self.fate in (Fate.RETRIED, Fate.DEAD_LETTERED, Fate.EXPIRED)
            and failure is not None
            and failure.kind in (ErrorKind.HANDLER, ErrorKind.TTR)
        )

    @property
    def claims(self) -> bool:
        """Recorded in the inbox as applied (a later copy is a duplicate)."""
        return self.fate in (Fate.ACKED, Fate.CANCELLED) or self.fate in REPEATS


Backoff = Callable[[int], float | None]
"""Seconds before the next attempt after `attempt` failures, or None: that was the last."""


@dataclass
class Gate:
    """A batch's snapshot, kept up to date as its deliveries are decided (see the docstring)."""

    now: datetime
    source: Source
    seen: set[UUID]
    """Keys of messages the consumer applied before (the inbox), or finished in this batch."""
    holds: dict[UUID, Hold]
    """The holds on the batch's users, as the batch has left them so far."""
    attempts: dict[UUID, int] = field(default_factory=dict)
    """Each message's failures (and deferrals) counted so far, by key."""

    def admit(self, facts: Facts) -> Decision | None:
        """The decision that needs no handler, or None: run it."""
        hold = self._hold_of(facts)
        lifts = hold is not None and hold.blocker == facts.key
        if facts.key in self.seen:
            return Decision(Fate.DUPLICATE, lifts=lifts)
        if facts.expires_at is not None and facts.expires_at <= self.now:
            expired = Failure(
                ErrorKind.RULE,
                "expired",
                "ExpiredError",
                f"delivered after its TTL ran out at {facts.expires_at}",
            )
            return Decision(Fate.EXPIRED, "expired", expired, attempt=1, lifts=lifts)
        if hold is not None and not lifts and _waits(self.source, hold):
            return Decision(Fate.PARKED, behind=hold.blocker)
        if facts.cancelled_member:
            return Decision(Fate.CANCELLED, lifts=lifts)
        return None

    def decide(
        self,
        facts: Facts,
        failure: Failure | None,
        backoff: Backoff,
        *,
        repeat: Fate | None = None,
    ) -> Decision:
        """The handler ran: `failure` is how it failed (None: it did not). `repeat`: one of
        REPEATS when it named a business key seen before (applied as nothing)."""
        hold = self._hold_of(facts)
        lifts = hold is not None and hold.blocker == facts.key
        if failure is None:
            if repeat is not None and repeat not in REPEATS:
                raise ValueError(f"{repeat} is not a repeat")
            return Decision(repeat or Fate.ACKED, lifts=lifts)
        if failure.kind is ErrorKind.NEWER:
            return self._deferred(facts, failure)
        attempt = self.attempts.get(facts.key, 0) + 1
        held = "buried" if facts.user_id is not None else None
        if failure.kind is ErrorKind.RULE:
            return Decision(
                Fate.DEAD_LETTERED, failure.reason, failure, attempt, lifts=lifts, counted=True
            )
        if failure.kind in (ErrorKind.PERMANENT, ErrorKind.TTR):
            return Decision(
                Fate.DEAD_LETTERED, failure.reason, failure, attempt, holds=held, counted=True
            )
        wait = backoff(attempt)
        if wait is None:
            return Decision(
                Fate.DEAD_LETTERED, "max_attempts", failure, attempt, holds=held, counted=True
            )
        if failure.delay is not None:
            wait = failure.delay
        retry_at = self.now + timedelta(seconds=wait)
        if facts.expires_at is not None and retry_at >= facts.expires_at:
            # Its next attempt would come after its TTL: it will never be taken in time.
            return Decision(Fate.EXPIRED, "expired", failure, attempt, lifts=lifts, counted=True)
        return Decision(
            Fate.RETRIED,
            failure=failure,
            attempt=attempt,
            retry_at=retry_at,
            holds="retrying" if facts.user_id is not None else None,
            counted=True,
        )

    def _deferred(self, facts: Facts, failure: Failure) -> Decision:
        """A version this pkgq does not know: tried again after the failure's delay, its user
        held behind it; each deferral is counted, and past the failure's `limit` it is buried
        as `unknown_version`, holding its user (no hold lasts for ever)."""
        attempt = self.attempts.get(facts.key, 0) + 1
        lifts = self._lifts(facts)
        if failure.limit is not None and attempt > failure.limit:
            held = "buried" if facts.user_id is not None else None
            return Decision(
                Fate.DEAD_LETTERED, "unknown_version", failure, attempt, holds=held, counted=True
            )
        retry_at = self.now + timedelta(seconds=failure.delay or 0.0)
        if facts.expires_at is not None and retry_at >= facts.expires_at:
            return Decision(Fate.EXPIRED, "expired", failure, attempt, lifts=lifts, counted=True)
        return Decision(
            Fate.RETRIED,
            failure=failure,
            attempt=attempt,
            retry_at=retry_at,
            holds="retrying" if facts.user_id is not None else None,
            counted=True,
        )

    def _lifts(self, facts: Facts) -> bool:
        hold = self._hold_of(facts)
        return hold is not None and hold.blocker == facts.key

    def note(self, facts: Facts, decision: Decision) -> None:
        """Fold a decision into the snapshot. Only a message that is done counts as seen: a
        second copy of one that failed in this batch (a relay re-publish, a redelivery next to
        its own retry) must meet the hold it left, not pass as a duplicate."""
        if decision.fate in DONE:
            self.seen.add(facts.key)
        if decision.counted:
            self.attempts[facts.key] = decision.attempt
        user = facts.user_id
        if user is None:
            return
        if decision.holds is not None:
            self.holds[user] = Hold(facts.key, decision.holds)
        elif decision.lifts:
            self.holds[user] = Hold(None, "releasing")

    def _hold_of(self, facts: Facts) -> Hold | None:
        return self.holds.get(facts.user_id) if facts.user_id is not None else None


def _waits(source: Source, hold: Hold) -> bool:
    """Whether a message of a held user (not the blocker) waits behind the hold: from the
    queue always (a lifted hold is being drained: arrivals queue up behind the parked ones);
    from the parking lot only while the hold names a blocker again."""
    return source is Source.QUEUE or hold.blocker is not None
