"""The one duration parser of the command line (`--delay`, `--ttl`, `--unique-for`,
`--timeout`, `--older-than`, `--since`, a package's `--duration`), and `--since` times."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
EXAMPLES = "90, 90s, 15m, 1.5h, 7d, 1w"


def parse_duration(text: str) -> timedelta:
    """A number of seconds (`90`) or a number with a unit: `90s`, `15m`, `1.5h`, `7d`, `1w`."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (examples: {EXAMPLES})")
    return timedelta(seconds=float(match.group(1)) * _SECONDS[match.group(2)])


def seconds(text: str | None) -> float | None:
    """An optional duration, in seconds."""
    return None if text is None else parse_duration(text).total_seconds()


def parse_since(text: str | None) -> datetime | None:
    """An ISO-8601 time (UTC when it names no offset), or a duration meaning that long ago."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return datetime.now(UTC) - parse_duration(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
