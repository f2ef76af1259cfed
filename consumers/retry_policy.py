"""When a failed message is tried again, and when it is given up on (buried)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from infra.route_config import RetrySettings
from infra.settings import Settings

Backoff = Callable[[int], float]
"""Seconds to wait after the given failed attempt (1 = the first delivery failed)."""


def seed003_backoff(attempt: int, rand: Callable[[int], int] = random.randrange) -> float:
    """The worker queue's schedule: attempt^4 + 15 + rand(10) * (attempt + 1) seconds (16 s to
    ~4.5 d)."""
    return float(attempt**4 + 15 + rand(10) * (attempt + 1))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 25
    backoff: Backoff = seed003_backoff
    max_delay_s: float = 7 * 86400.0
    newer_version_s: float = 30.0
    """The pause before a message of a version newer than this pkgq knows is tried again
    (see domain.delivery.ErrorKind.NEWER)."""
    newer_version_limit: int = 240
    """How many deferrals of such a message before it is buried as `unknown_version`."""

    def delay_after(self, attempt: int) -> float | None:
        """The pause before the next delivery, or None when `attempt` was the last one."""
        if attempt >= self.max_attempts:
            return None
        return max(0.0, min(self.backoff(attempt), self.max_delay_s))


def from_settings(
    config: RetrySettings, newer_version_s: float = 30.0, newer_version_limit: int = 240
) -> RetryPolicy:
    base = config.base_s
    backoff: Backoff
    if config.backoff == "fixed":
        backoff = lambda _attempt: base  # noqa: E731
    elif config.backoff == "exponential":
        backoff = lambda attempt: random.uniform(0, base * 2 ** (attempt - 1))  # noqa: E731
    else:
        backoff = seed003_backoff
    return RetryPolicy(
        config.max_attempts, backoff, config.max_delay_s, newer_version_s, newer_version_limit
    )


def policy_for(settings: Settings, route_name: str) -> RetryPolicy:
    return from_settings(
        settings.retry_for(route_name),
        settings.newer_version_retry,
        settings.newer_version_deferrals,
    )
