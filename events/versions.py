"""Message versions: each route's body as it was one schema version ago, and the pure upcaster
that turns such a body into the current one.

A route accepts its current version (`Route.schema_version`) and the one before it (N-1), so a
rolling upgrade, a parked message, an unpublished outbox row or a week-old dead letter written
by the previous release is still applied after an upgrade. A body of version N-1 is validated
against the model it had then (`Previous.model`, strict as every wire model), turned into a
body of version N by `Previous.upcast` (a pure function of a JSON-shaped dict: one step, unit
tested), and validated again as the current model. Anything older is refused as
`unsupported_version`; anything newer is left for a newer pkgq (events/decoding.py,
NewerVersionError).

When a route's format changes again (N+1): the model of N becomes `Previous.model` of the route,
its upcaster goes here, and N-1 is dropped, one release after the one that stopped writing it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from events.models import RecordUsageV1, WireModel

Body = dict[str, Any]
Upcaster = Callable[[Body], Body]


@dataclass(frozen=True, slots=True)
class Previous:
    """A route's version N-1: what its bodies looked like, and how one becomes version N."""

    version: int
    model: type[WireModel]
    upcast: Upcaster


def usage_v1_to_v2(body: Body) -> Body:
    """RecordUsage 1 -> 2: no billing record id (deduplicated by message_id only, as before) and
    no time of the traffic (billed by the time it is applied)."""
    return {**body, "usage_id": None, "recorded_at": None}


RECORD_USAGE_V1 = Previous(1, RecordUsageV1, usage_v1_to_v2)
