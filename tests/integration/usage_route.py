"""The usage route driven directly, as the delivery tests drive it
(tests/integration/test_delivery_redelivery.py, test_delivery_edge_cases.py): a usage record's
delivery with the headers a producer sends, a usage handler that fails for the uploads it is
told to and logs what it applied, and the route's pipeline around it."""

from __future__ import annotations

from uuid import UUID, uuid4

import asyncpg

from consumers.delivery import DeliveryPipeline
from consumers.handlers import usage_record
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import HandlerContext
from domain.delivery import Fate
from events.decoding import RawDelivery
from events.envelope import CONTENT_TYPE, H_ATTEMPT, H_SCHEMA_VERSION, H_USER_ID
from events.models import RecordUsage
from events.routes import USAGE_RECORD
from infra.rabbit.consumer import Decided


def delivery(
    user: UUID, upload: int, *, message_id: UUID | None = None, attempt: int = 1
) -> RawDelivery:
    return RawDelivery(
        body=RecordUsage(user_id=user, upload=upload, download=0).model_dump_json().encode(),
        message_id=str(message_id or uuid4()),
        message_type=USAGE_RECORD.message_type,
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers={
            H_SCHEMA_VERSION: USAGE_RECORD.schema_version,
            H_USER_ID: str(user),
            H_ATTEMPT: attempt,
        },
    )


class Switchable:
    """A usage handler that fails for the uploads in `failing`, and logs what it applied."""

    def __init__(self, *failing: int) -> None:
        self.failing = set(failing)
        self.applied: list[int] = []

    async def __call__(self, ctx: HandlerContext, body: RecordUsage) -> None:
        if body.upload in self.failing:
            raise RuntimeError(f"upload {body.upload} refused")
        await usage_record.handle(ctx, body)
        self.applied.append(body.upload)


def outcomes_of(results: list[Decided]) -> list[Fate]:
    return [r.fate for r in results]


def pipeline(pool: asyncpg.Pool, handler: Switchable, policy: RetryPolicy) -> DeliveryPipeline:
    return DeliveryPipeline(pool, USAGE_RECORD, handler, policy, max_body_bytes=2**20)
