"""One log line per decision that is news (buried, retried, expired, parked), after its
commit: a rolled-back decision is never reported."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from consumers.delivery.executor import Decided
from domain.delivery import Fate
from events.envelope import bounded_text
from events.routes import Route

log = structlog.get_logger(__name__)


NEWS = frozenset({Fate.RETRY, Fate.BURIED, Fate.EXPIRED, Fate.UNDECIDED, Fate.PARKED})
"""The fates worth a line of their own (an applied message gets settle's `processed`)."""


def report(route: Route, decided: Sequence[Decided]) -> None:
    for d in decided:
        decision, failure = d.decision, d.decision.failure
        if decision.fate not in NEWS:
            continue
        if d.decoded is not None:
            envelope = d.decoded.envelope
            message_id = str(envelope.message_id)
            user_id = str(envelope.user_id) if envelope.user_id is not None else None
        else:
            message_id, user_id = bounded_text(str(d.raw.message_id), 64), None
        fields = {"route": route.name, "message_id": message_id, "user_id": user_id}
        error = failure.summary if failure is not None else None
        if decision.fate is Fate.RETRY:
            assert failure is not None
            log.warning(
                "retry_scheduled",
                **fields,
                attempt=decision.attempt,
                retry_at=decision.retry_at.isoformat() if decision.retry_at else None,
                error=error,
                at=failure.location,
            )
        elif decision.fate is Fate.BURIED:
            level = log.error if decision.holds is not None else log.warning
            level(
                "dead_lettered",
                **fields,
                reason=decision.reason,
                attempts=decision.attempt,
                holds_user=decision.holds is not None,
                error=error,
            )
        elif decision.fate is Fate.EXPIRED:
            log.warning("expired", **fields, error=error)
        elif decision.fate is Fate.UNDECIDED:
            log.error("undecided_to_last_resort", **fields, error=error)
        elif decision.fate is Fate.PARKED:
            log.info("parked", **fields, behind=str(decision.behind) if decision.behind else None)
