"""The process itself: its event loop, its drain on a signal, its heartbeat in telecom.workers,
and the crash tests' fault points."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from infra.event_loop import EventLoopName
from infra.faults import FaultSpecError
from infra.faults import parse as parse_faults


class ProcessSettings(BaseModel):
    """The process: event loop, shutdown, liveness and fault points."""

    drain_timeout: float = Field(default=30.0, gt=0)
    event_loop: EventLoopName = "uvloop"
    """The event loop commands run on: uvloop (the default; the consumers' and the relay's
    throughput, infra/event_loop.py) or asyncio (the standard library's)."""

    heartbeat_interval: float = Field(default=5.0, gt=0)
    """How often a process updates its row in telecom.workers."""
    worker_stale_after: float = Field(default=30.0, gt=0)
    """A worker whose heartbeat is older than this is stale: its leases and Postgres
    connections are taken from it."""

    faults: str = ""
    """Crash tests only, never in production: the fault points that SIGKILL the process, e.g.
    PKGQ_FAULTS="consumer.after_commit=telecom.package_queuing,relay.after_confirm@10" (see
    infra/faults.py for the points and the syntax). The CLI enables them at start-up."""

    @field_validator("faults")
    @classmethod
    def _known_faults(cls, value: str) -> str:
        from events.routes import ROUTES

        try:
            named = parse_faults(value)
        except FaultSpecError as exc:
            raise ValueError(f"PKGQ_FAULTS {value!r}: {exc}") from None
        unknown = sorted({f.route for f in named if f.route is not None} - set(ROUTES))
        if unknown:
            raise ValueError(
                f"PKGQ_FAULTS {value!r}: unknown route(s) {unknown}; routes are {sorted(ROUTES)}"
            )
        return value
