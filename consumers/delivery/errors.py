"""Errors by kind: what a failure is (a `Failure` of an `ErrorKind`, see domain/delivery.py),
named, located and described for the dead-letter store.

- a broken domain rule, a `Bury` from the handler, bad input: RULE (buried at once, holding
  nothing back);
- a data error that reached Postgres (SQLSTATE class 22, a check or not-null violation): it can
  never succeed, so PERMANENT (buried at once, holding its user as a buried message does);
- a TTR struck out: TTR;
- anything else, `Retry` included: HANDLER (retried with backoff).
Transient errors (outages and blips, infra/transient.py) are never a message's failure: the
pipeline retries them in place and they never reach here.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path

from consumers.handler_errors import Bury, Retry, TTRExceededError
from domain.delivery import ErrorKind, Failure
from domain.errors import DomainError
from events.decoding import BadMessageError
from infra.transient import is_permanent

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    error_type: str
    message: str
    location: str
    """Where it was raised: `path:line in function` (the key `pkgq dlq groups` groups by)."""
    traceback: str


def describe(exc: BaseException) -> ErrorInfo:
    """Name, message and origin of an error. The origin is the innermost frame in pkgq's own
    code (a driver's internals say little about which of our lines went wrong)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [
        f
        for f in frames
        if Path(f.filename).is_relative_to(ROOT)
        and not {".venv", "site-packages"} & set(Path(f.filename).parts)
    ]
    location = ""
    if ours or frames:
        last = (ours or frames)[-1]
        path = Path(last.filename)
        shown = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        location = f"{shown}:{last.lineno} in {last.name}"
    return ErrorInfo(
        error_type=type(exc).__qualname__,
        message=str(exc) or type(exc).__name__,
        location=location,
        traceback="".join(traceback.format_exception(exc)),
    )


def failure_of(exc: BaseException) -> Failure:
    """The failure a message's own error is, by kind."""
    info = describe(exc)
    if isinstance(exc, BadMessageError):
        return Failure(
            ErrorKind.RULE,
            exc.reason,
            info.error_type,
            exc.detail,
            f"decode:{exc.reason}",
            info.traceback,
        )
    kind, reason, delay = ErrorKind.HANDLER, "handler_error", None
    if isinstance(exc, DomainError):
        kind, reason = ErrorKind.RULE, "domain_rule"
    elif isinstance(exc, Bury):
        kind, reason = ErrorKind.RULE, exc.reason
    elif isinstance(exc, TTRExceededError):
        kind, reason = ErrorKind.TTR, "ttr"
    elif is_permanent(exc):
        kind, reason = ErrorKind.PERMANENT, "data_error"
    elif isinstance(exc, Retry):
        delay = exc.delay
    return Failure(
        kind, reason, info.error_type, info.message, info.location, info.traceback, delay
    )
