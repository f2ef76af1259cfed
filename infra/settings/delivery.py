"""How a consumer takes and applies deliveries: lanes, prefetch and batches, body and queue
limits, retries and breakers, messages of a newer schema version, and pauses."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from domain.errors import MAX_QUEUED_ITEMS
from infra.route_config import BreakerSettings, RetrySettings
from infra.settings.routes import RouteTableSettings, known_routes


class DeliverySettings(RouteTableSettings):
    """Delivery: consuming, batching and retrying."""

    concurrency: int = Field(default=1, ge=1, le=64)
    """Worker lanes per queue, for routes the route file does not configure (`--concurrency`)."""
    prefetch: int = Field(default=1024, ge=1, le=10_000)
    """Deliveries the broker sends ahead per consumed queue (raised to batch_size if lower): a
    backlog's next batches are already here while one commits. Each is held in memory, up to
    the broker's max_message_size apiece: where memory is tight and bodies may be large, lower
    it (the Kubernetes example sets 32; deploy/k8s/verify.sh checks the budget)."""
    batch_size: int = Field(default=32, ge=1, le=1000)
    """Deliveries a consumer waits (up to the linger) to apply together in one Postgres
    transaction (1: one at a time)."""
    batch_max: int = Field(default=512, ge=1, le=1000)
    """Deliveries a consumer takes into one transaction when they are already waiting in its
    prefetch buffer (a backlog): it never waits for more than batch_size, so a trickle stays
    in small batches, while a backlog drains in large ones. Raised to batch_size if lower;
    ignored with a batch_size of 1 (one at a time)."""
    batch_linger_ms: float = Field(default=5.0, ge=0, le=10_000)
    """How long a consumer waits for a batch to fill once it has one delivery in hand."""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    max_queued_items: int = Field(default=MAX_QUEUED_ITEMS, ge=1)
    """Live items (in_queue and active) one user may hold: a purchase beyond it is refused as
    a domain rule (dead-lettered as domain_rule), so a batch's load of a user's items is
    bounded."""

    newer_version_retry: float = Field(default=30.0, gt=0, le=3600)
    """Seconds before a message of a schema version newer than this pkgq knows is tried again
    (held in its user's order: docs/how-to/upgrade.md)."""
    newer_version_deferrals: int = Field(default=240, ge=1, le=100_000)
    """How many times a message of a newer schema version is deferred (counted in Postgres)
    before it is buried as `unknown_version`, its user held behind it until an operator
    replays it (once the new pkgq runs) or discards it. 240 deferrals of 30 s: two hours, far
    longer than a rolling upgrade."""
    usage_dedup_days: int = Field(default=35, ge=1, le=3650)
    """How long a billed usage record's (user_id, usage_id) is remembered at least: a resend
    within it bills nothing (duplicate_usage). A billing cycle plus margin."""
    retry: RetrySettings = RetrySettings()
    """The default retry policy, e.g.
    PKGQ_RETRY='{"max_attempts": 10, "backoff": "exponential"}'."""
    retry_routes: dict[str, RetrySettings] = Field(default_factory=dict)
    """Per-route policies by route name, e.g.
    PKGQ_RETRY_ROUTES='{"telecom.package_activate": {"max_attempts": 5}}'."""
    release_poll_interval: float = Field(default=2.0, gt=0)
    """How often a consumer looks for holds an operator released (a discarded dead letter)."""
    breaker: BreakerSettings | None = None
    """The circuit breaker of every route (a route's own in PKGQ_ROUTES_FILE wins), e.g.
    PKGQ_BREAKER='{"failure_rate": 0.5, "min_deliveries": 20, "window_s": 60}'; unset: off."""
    pause_poll: float = Field(default=2.0, gt=0)
    """How often each `pkgq run` reads which routes are paused (`pkgq route pause`): a pause
    or resume is obeyed by every replica within about this many seconds."""

    @field_validator("retry_routes")
    @classmethod
    def _known_retry_routes(cls, value: dict[str, Any]) -> dict[str, Any]:
        return known_routes(value)

    def attempts_bound(self) -> int:
        """The most attempts any hold's blocker may take before it is buried: the largest
        `max_attempts` of any retry policy, or PKGQ_NEWER_VERSION_DEFERRALS if larger
        (`pkgq doctor`'s hold_past_its_bound)."""
        policies = [self.retry, *self.retry_routes.values()]
        policies += [r.retry for r in self.route_settings.values() if r.retry is not None]
        return max(self.newer_version_deferrals, *(p.max_attempts for p in policies))

    def concurrency_for(self, route_name: str) -> int:
        return self.route(route_name).concurrency or self.concurrency

    def prefetch_for(self, route_name: str) -> int:
        return self.route(route_name).prefetch or self.prefetch

    def batch_size_for(self, route_name: str) -> int:
        return self.route(route_name).batch_size or self.batch_size

    def batch_max_for(self, route_name: str) -> int:
        """batch_max, never below batch_size; a batch_size of 1 is the one-at-a-time mode,
        whatever batch_max says."""
        size = self.batch_size_for(route_name)
        if size == 1:
            return 1
        return max(self.route(route_name).batch_max or self.batch_max, size)

    def ttr_for(self, route_name: str) -> float | None:
        return self.route(route_name).ttr

    def breaker_for(self, route_name: str) -> BreakerSettings | None:
        return self.route(route_name).breaker or self.breaker

    def retry_for(self, route_name: str) -> RetrySettings:
        return self.route(route_name).retry or self.retry_routes.get(route_name, self.retry)
