"""Parse human sizes (`500MiB`, `2GB`) and durations (`30d`, `90s`) on the command line."""

from __future__ import annotations

import re
from datetime import timedelta

_SIZE = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_TIME = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _SIZE:
        raise ValueError(f"not a size: {text!r} (examples: 1048576, 500MiB, 2GB)")
    return int(match.group(1)) * _SIZE[match.group(2).lower()]


def parse_duration(text: str) -> timedelta:
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if not match:
        raise ValueError(f"not a duration: {text!r} (examples: 90s, 15m, 12h, 30d)")
    return timedelta(seconds=int(match.group(1)) * _TIME[match.group(2) or "s"])
