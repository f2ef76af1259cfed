"""The one size parser of the command line (a package's `--traffic`)."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
EXAMPLES = "1048576, 500MiB, 2GB"


def parse_size(text: str) -> int:
    """Bytes (`1048576`) or a number with a decimal (`2GB`) or binary (`500MiB`) unit."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: {EXAMPLES})")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]
