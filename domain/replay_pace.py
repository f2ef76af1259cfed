"""A dead-letter replay run's pace and its verdict, as pure decisions (the run itself is
consumers/replay_runner.py, its record infra/postgres/replay_runs.py).

Pace: a run at N messages a second sends small batches, each when the run's clock says its
messages are due (`Pacer`): a low rate is a steady trickle, never a burst of 200 and a pause.

Verdict: a run watches its own first K replayed messages (those of its current leg: a resumed
run judges what it sends after the fix, not what failed before it). Once enough of them are
decided (applied, or dead-lettered again), more than the allowed share failing again stops it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BATCH = 200
"""Dead letters replayed per transaction when the rate allows (or is unlimited)."""
BATCHES_PER_SECOND = 5
"""At a set rate, how many batches a second at most: each of rate/5 messages (at least one)."""


def batch_size(rate: float | None, largest: int = BATCH) -> int:
    """How many dead letters go in one batch at `rate` messages a second (None: unlimited)."""
    if rate is None:
        return largest
    return max(1, min(largest, math.floor(rate / BATCHES_PER_SECOND)))


@dataclass(slots=True)
class Pacer:
    """When the next batch is due: a batch that takes the leg's count of messages to n at
    `rate` a second is due n / rate seconds after the leg started (no burst at the start)."""

    rate: float | None
    started: float
    """The leg's start on a monotonic clock."""
    sent: int = 0

    def wait_before(self, now: float, count: int) -> float:
        """Seconds to wait before the next batch, of `count` messages (0: now)."""
        if self.rate is None:
            return 0.0
        return max(0.0, self.started + (self.sent + count) / self.rate - now)

    def record(self, count: int) -> None:
        self.sent += count


@dataclass(frozen=True, slots=True)
class Limits:
    """When a run stops by itself: more than `max_failed` (a share, 0..1) of its first
    `check_first` replayed messages that are decided failed again, once at least
    `min_decided` of them (or all of them, when fewer were sent) are decided."""

    check_first: int = 50
    max_failed: float = 0.5
    min_decided: int = 10

    def __post_init__(self) -> None:
        if self.check_first < 1 or self.min_decided < 1:
            raise ValueError("check_first and min_decided must be at least 1")
        if not 0 <= self.max_failed <= 1:
            raise ValueError("max_failed is a share between 0 and 1")


@dataclass(frozen=True, slots=True)
class Window:
    """The first `check_first` messages of the run's current leg, as far as they are known."""

    sent: int
    """How many of them were sent (at most check_first)."""
    applied: int
    failed: int

    @property
    def decided(self) -> int:
        return self.applied + self.failed


def failing(window: Window, limits: Limits) -> str | None:
    """Why the run must stop, when its window says its messages fail again; None otherwise."""
    if window.sent == 0:
        return None
    enough = min(limits.min_decided, window.sent)
    if window.decided < enough or window.decided == 0:
        return None
    share = window.failed / window.decided
    if share <= limits.max_failed:
        return None
    return (
        f"{window.failed} of the first {window.decided} decided replayed messages failed again "
        f"({share:.0%} > {limits.max_failed:.0%}): fix the cause, then resume the run"
    )


def awaiting_verdict(window: Window, limits: Limits, left: int) -> bool:
    """Whether the run holds back its next batch until its first messages are decided: once
    it sent its whole window with more to send, it waits until every one of them is decided
    (the caller gives up waiting after a while and goes on, still watching)."""
    return left > 0 and window.sent >= limits.check_first and window.decided < window.sent


@dataclass(frozen=True, slots=True)
class Progress:
    """What a run reports while it runs (a log line, the terminal's display, the console)."""

    run_id: int
    state: str
    total: int
    sent: int
    skipped: int
    failed_again: int
    applied: int
    leg_sent: int
    leg_seconds: float
    reason: str | None = None

    @property
    def left(self) -> int:
        return max(0, self.total - self.sent - self.skipped)

    @property
    def rate(self) -> float:
        """Messages a second sent in this leg, so far."""
        return self.leg_sent / self.leg_seconds if self.leg_seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until every letter is sent at the rate achieved; None: not known yet."""
        if self.left == 0:
            return 0.0
        return self.left / self.rate if self.rate > 0 else None

    def fields(self) -> dict[str, object]:
        """The progress as flat fields (a structured log line, the CLI's JSON)."""
        eta = self.eta_seconds
        return {
            "run_id": self.run_id,
            "state": self.state,
            "total": self.total,
            "sent": self.sent,
            "skipped": self.skipped,
            "failed_again": self.failed_again,
            "applied": self.applied,
            "left": self.left,
            "rate": round(self.rate, 1),
            "eta_s": None if eta is None else round(eta, 1),
        }
