"""How `pkgq bench`'s backlog phases watch and report a drain: how often its progress is
checked, what one drain measured, and whether the consumer under test is still running."""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass

POLL = 0.02
"""Seconds between progress checks near the end of a drain: the timing's resolution."""
POLL_FAR = 0.25
"""The longest pause between checks while the route's queues still hold messages."""


def next_check_in(waiting: int, fastest: float) -> float:
    """Seconds until the next progress check of a drain. Each check costs the bench's process
    CPU, which the consumer under test shares (checked every POLL: 35-38 µs per record of a
    20,000-record drain beside `pkgq run`'s 215). While `waiting` messages are still in the
    queues the drain cannot end: the pause is half the time they would take at the `fastest`
    rate seen between two checks so far (records/s; 0: none yet), between POLL and POLL_FAR.
    Once none waits, POLL. So a check comes before the queues are empty unless the drain more
    than doubles its fastest rate (a stall only lowers the latest rate, not the fastest), and
    from then on every POLL, as before."""
    if not waiting or fastest <= 0:
        return POLL
    return min(POLL_FAR, max(POLL, waiting / fastest / 2))


@dataclass(frozen=True)
class DrainResult:
    label: str
    records: int
    seconds: float
    rss_mb: float = float("nan")
    cpu_seconds: float = float("nan")
    """CPU the consumer under test used while timed (pkgq run's process; the broker
    baseline's client, the bench process)."""

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def cpu(self) -> str:
        """Its CPU per record and its share of one core, for the progress lines."""
        if math.isnan(self.cpu_seconds) or self.seconds <= 0 or self.records <= 0:
            return "CPU unknown"
        per_record = self.cpu_seconds / self.records * 1e6
        return f"CPU {per_record:.0f} µs/record, {self.cpu_seconds / self.seconds:.0%} of a core"


def records_per_s(result: DrainResult) -> float:
    return result.records_per_s


def exited(process: subprocess.Popen[bytes]) -> str | None:
    code = process.poll()
    return None if code is None else f"pkgq run exited with status {code}"
