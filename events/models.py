"""Message bodies on the wire: JSON, strictly validated, unknown fields refused.

Field names and meanings are the package queue's own; timestamps are unix seconds. Commands are
named in the imperative (they ask for a change), events in the past tense or by their long-standing
names (PackageQueuePushEvent, AllPackageExpiredEvent).
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from domain.errors import MAX_AMOUNT, MAX_COUNTER
from domain.model import ExpiryReason
from events.envelope import unstorable

PositiveId = Annotated[int, Field(ge=1, le=MAX_COUNTER)]
Bytes = Annotated[int, Field(ge=0, le=2**62)]
"""Traffic in one message: within a bigint (Postgres) with room to spare. Whether it still fits
once added to what is stored is the domain's rule (domain.errors.CounterOverflowError)."""
UnixSeconds = Annotated[int, Field(ge=0, le=2**40)]
MAX_DATETIME = 253_402_300_799
"""9999-12-31T23:59:59Z: the last unix second a Python datetime (and the handler) can hold."""


def _storable(value: str) -> str:
    problem = unstorable(value)
    if problem is not None:
        raise PydanticCustomError("unstorable_text", "text holds {problem}", {"problem": problem})
    return value


Text = Annotated[str, AfterValidator(_storable)]
"""Every text field of a message body: Postgres text and jsonb cannot store NUL or a lone
surrogate, so a body holding one is refused when it is decoded (schema_invalid, naming the
field), before anything is written. tests/unit/test_wire_text.py tries every text field of
every route's model."""
Reason = Annotated[Text, Field(min_length=1, max_length=500)]
"""Why an operator did it, free text, stored with the item's audit trail."""
Operator = Annotated[Text, Field(min_length=1, max_length=200)]
"""Who did it (`user@host` from the CLI), stored with the item's audit trail. The command's
body says so: it is the publisher's claim, not proof (see Publisher)."""
Publisher = Annotated[Text, Field(min_length=1, max_length=512)]
"""Who published a command, as the broker verified it: its AMQP user_id (RabbitMQ refuses a
publish whose user_id is not the connection's user), or `unverified` when it had none."""


class WireModel(BaseModel):
    """Base of every message body: strict types, no unknown fields, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    user_id: UUID


# -- inbound commands (published by systems outside pkgq) ---------------------------------


class PurchasePackage(WireModel):
    """Shop: queue `amount` identical packages for a user. A purchase naming a `by_order`
    the user bought before is a duplicate, whatever its message id: nothing more is queued."""

    package_id: PositiveId
    by_order: UUID | None = None
    amount: Annotated[int, Field(ge=1, le=MAX_AMOUNT)] = 1


UsageId = Annotated[Text, Field(min_length=1, max_length=128)]
"""The billing system's own id of a usage record (its CDR or mediation record id)."""


class RecordUsageV1(WireModel):
    """RecordUsage as schema version 1 had it (events/versions.py turns it into version 2)."""

    upload: Bytes
    download: Bytes


class RecordUsage(WireModel):
    """Billing: traffic to bill to the user's active package (schema version 2).

    `usage_id`: the billing system's own record id. A record whose (user_id, usage_id) was
    billed before is acknowledged as `duplicate_usage` and bills nothing, whatever its
    message_id, for PKGQ_USAGE_DEDUP_DAYS (35) at least. Without one (and in version 1) a record
    is deduplicated by its message_id only. `recorded_at`: when the traffic happened (unix
    seconds), stored with the billing; it decides which item late traffic is billed to
    (domain/queue.py, UserQueue.record_usage)."""

    upload: Bytes
    download: Bytes
    usage_id: UsageId | None = None
    recorded_at: Annotated[int, Field(ge=0, le=MAX_DATETIME)] | None = None


class CancelPackage(WireModel):
    """Admin/refunds: cancel one queue item."""

    item_id: PositiveId
    reason: Reason | None = None
    operator: Operator | None = None


class AdjustQuota(WireModel):
    """Admin: add `delta` bytes (may be negative) to an item's adjust_quota."""

    item_id: PositiveId
    delta: Annotated[int, Field(ge=-(2**62), le=2**62)]
    reason: Reason | None = None
    operator: Operator | None = None


# -- lifecycle events (published by pkgq through the outbox) ------------------------------


class PackageQueuePushEvent(WireModel):
    item_ids: Annotated[list[PositiveId], Field(min_length=1, max_length=MAX_AMOUNT)]
    package_id: PositiveId
    pushed_at: UnixSeconds


class PackageActivateEvent(WireModel):
    item_id: PositiveId
    package_id: PositiveId
    activated_at: UnixSeconds


class PackageExpiringEvent(WireModel):
    item_id: PositiveId
    package_id: PositiveId
    expired_at: UnixSeconds
    reason: ExpiryReason


class AllPackageExpiredEvent(WireModel):
    expired_at: UnixSeconds


class PackageCancelledEvent(WireModel):
    """A queued or active item was cancelled (refunded); for outside subscribers. `operator` is
    who the cancel command says did it; `publisher`, who published the command as the broker
    verified it (the shop's or an admin tool's broker user; pkgq's own for the console and CLI,
    whose operator pkgq authenticated itself)."""

    item_id: PositiveId
    package_id: PositiveId
    cancelled_at: UnixSeconds
    was_active: bool
    reason: Reason | None = None
    operator: Operator | None = None
    publisher: Publisher | None = None


# -- internal (published and consumed by pkgq only) ---------------------------------------


class PackageExpiryDue(WireModel):
    """The time-expiry timer of an active item, held in the outbox until `due_at`."""

    item_id: PositiveId
    package_id: PositiveId
    due_at: UnixSeconds
