"""Fault injection for the crash tests: named points in production code where a test can have
the process SIGKILLed. A point does nothing unless a fault for it is enabled.

Code reaches a point with `hit(point, route=...)`. Faults are enabled only by `configure(spec)`,
which the CLI calls once at start-up with PKGQ_FAULTS (Settings.faults); this module reads no
environment and does no I/O of its own. Never set PKGQ_FAULTS in production.

A spec is a comma-separated list of faults, each `point[=route][@n]`:
- `point`: one of POINTS;
- `=route`: only hits for that route (a full route name) count; without it, every hit does;
- `@n`: the n-th counted hit kills (default 1: the first), e.g. the relay's third confirm.

    PKGQ_FAULTS="delivery.before_commit=telecom.usage_record,relay.after_confirm@3"
"""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass

DELIVERY_BEFORE_COMMIT = "delivery.before_commit"
"""Inside a batch's transaction, after its writes and before the commit; reached only when the
batch applied something."""
CONSUMER_AFTER_COMMIT = "consumer.after_commit"
"""A batch is committed and its deliveries are not yet acked."""
RELAY_AFTER_CONFIRM = "relay.after_confirm"
"""The relay has a publish confirmed and has not yet marked it published (reached once per
confirmed publish)."""

POINTS = frozenset({DELIVERY_BEFORE_COMMIT, CONSUMER_AFTER_COMMIT, RELAY_AFTER_CONFIRM})

_ENTRY = re.compile(r"(?P<point>[^=@\s]+)(?:=(?P<route>[^=@\s]+))?(?:@(?P<at>[0-9]+))?")


class FaultSpecError(ValueError):
    """A fault spec that cannot be enabled: bad syntax, an unknown point, a count below 1."""


@dataclass(frozen=True, slots=True)
class Fault:
    point: str
    route: str | None = None
    """Only hits for this route count; None: every hit of the point."""
    at: int = 1
    """The counted hit that kills (1: the first)."""

    def __str__(self) -> str:
        route = f"={self.route}" if self.route is not None else ""
        return f"{self.point}{route}@{self.at}"


def parse(spec: str) -> tuple[Fault, ...]:
    """The faults `spec` names ("" names none). Raises FaultSpecError."""
    faults: list[Fault] = []
    for entry in spec.split(","):
        text = entry.strip()
        if not text:
            continue
        found = _ENTRY.fullmatch(text)
        if found is None:
            raise FaultSpecError(f"fault {text!r} is not of the form point[=route][@n]")
        point, route, at = found.group("point", "route", "at")
        if point not in POINTS:
            raise FaultSpecError(f"unknown fault point {point!r}; points are {sorted(POINTS)}")
        fault = Fault(point, route, int(at) if at is not None else 1)
        if fault.at < 1:
            raise FaultSpecError(f"fault {text!r}: the count after '@' must be 1 or more")
        if any((f.point, f.route) == (fault.point, fault.route) for f in faults):
            raise FaultSpecError(f"fault {text!r} is given twice")
        faults.append(fault)
    return tuple(faults)


_enabled: tuple[Fault, ...] = ()
_hits: dict[Fault, int] = {}


def configure(spec: str | None) -> tuple[Fault, ...]:
    """Enable the faults `spec` names, in place of any enabled before, their counts from zero
    ("" or None: none; every `hit` is then a no-op). Raises FaultSpecError, changing nothing."""
    global _enabled
    faults = parse(spec or "")
    _enabled = faults
    _hits.clear()
    return faults


def hit(point: str, *, route: str | None = None) -> None:
    """SIGKILL this process if fault `point` is enabled (for `route`, when the fault names one);
    otherwise nothing."""
    if not _enabled:
        return
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; points are {sorted(POINTS)}")
    for fault in _enabled:
        if fault.point != point or (fault.route is not None and fault.route != route):
            continue
        _hits[fault] = count = _hits.get(fault, 0) + 1
        if count >= fault.at:
            sys.stderr.write(f"pkgq: fault {fault} reached: SIGKILL\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
