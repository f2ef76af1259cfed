"""The per-route configuration file (`PKGQ_ROUTES_FILE`, TOML), validated with clear errors.

    [routes.usage_record]          # a route's short or full name
    concurrency = 4                # worker lanes (messages spread over lanes by user)
    prefetch = 64
    batch_size = 32
    batch_max = 256                # taken at once when already buffered (a backlog)
    partitions = 4
    ttr = 30                       # seconds a handler may run on one message
    queue_type = "classic"         # or "quorum"
    retry = { max_attempts = 10, backoff = "exponential", base_s = 2 }
    breaker = { failure_rate = 0.5, min_deliveries = 20, window_s = 60, resume_after_s = 300 }

Nothing else is accepted: an unknown route or key, or a value out of range, is an error that
names the file, the route and the key.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class RetrySettings(BaseModel):
    """How a route retries a message whose handler failed (see consumers/retry_policy.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(default=25, ge=1, le=1000)
    """Deliveries in all, the first one included; after the last one the message is buried."""
    backoff: Literal["seed003", "exponential", "fixed"] = "seed003"
    """seed003: attempt^4 + 15 + rand(10) * (attempt + 1) s; exponential: base_s * 2^(attempt-1)
    with full jitter; fixed: base_s."""
    base_s: float = Field(default=1.0, ge=0)
    max_delay_s: float = Field(default=7 * 86400.0, ge=0)


class BreakerSettings(BaseModel):
    """The circuit breaker (domain/breaker.py): pause a route's consumption when this share of
    its deliveries failed (retried, dead-lettered) over a window, in one `pkgq run` process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    failure_rate: float = Field(gt=0, le=1)
    min_deliveries: int = Field(default=20, ge=1)
    window_s: float = Field(default=60.0, gt=0, le=86400)
    resume_after_s: float | None = Field(default=None, gt=0)
    """Resume by itself this long after tripping (then trip again if failures go on); unset:
    only an operator resumes it (`pkgq route resume`, the console)."""


class RouteSettings(BaseModel):
    """One route's entry in the route configuration file (PKGQ_ROUTES_FILE): unset fields fall
    back to the process-wide settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: int | None = Field(default=None, ge=1, le=64)
    """Worker lanes per queue: messages are spread over lanes by user, so one user's messages
    stay in order while different users are applied concurrently."""
    prefetch: int | None = Field(default=None, ge=1, le=10_000)
    batch_size: int | None = Field(default=None, ge=1, le=1000)
    batch_max: int | None = Field(default=None, ge=1, le=1000)
    """Deliveries taken into one transaction when they are already buffered (a backlog)."""
    partitions: int | None = Field(default=None, ge=1, le=256)
    retry: RetrySettings | None = None
    ttr: float | None = Field(default=None, gt=0, le=86400)
    """Seconds a handler may run on one message before it is cancelled and the message is given
    back to the queue in its place (the Fn queue's reservation timeout)."""
    queue_type: Literal["classic", "quorum"] | None = None
    breaker: BreakerSettings | None = None


class RouteConfigError(ValueError):
    """The route configuration file is missing, unreadable or invalid."""


def load_routes_file(path: str | Path) -> dict[str, RouteSettings]:
    from events.routes import UnknownRouteError, route_named

    source = Path(path)
    try:
        document: dict[str, Any] = tomllib.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RouteConfigError(f"{source}: cannot read the route configuration: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise RouteConfigError(f"{source}: not valid TOML: {exc}") from exc
    extra = sorted(set(document) - {"routes"})
    if extra:
        raise RouteConfigError(f"{source}: unknown top-level key(s) {extra}; only [routes.*]")
    routes = document.get("routes", {})
    if not isinstance(routes, dict):
        raise RouteConfigError(f"{source}: `routes` must be a table of [routes.<name>] tables")
    found: dict[str, RouteSettings] = {}
    for name, table in routes.items():
        try:
            full = route_named(name).name
        except UnknownRouteError as exc:
            raise RouteConfigError(f"{source}: [routes.{name}]: {exc.args[0]}") from None
        if full in found:
            raise RouteConfigError(f"{source}: route {full} is configured twice")
        if not isinstance(table, dict):
            raise RouteConfigError(f"{source}: [routes.{name}] must be a table")
        try:
            found[full] = RouteSettings.model_validate(table)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '?'}: {err['msg']}"
                for err in exc.errors()
            )
            raise RouteConfigError(f"{source}: [routes.{name}]: {problems}") from None
    return found
