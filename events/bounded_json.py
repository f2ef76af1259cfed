"""JSON anyone may have written, read with a bound on its nesting.

Python's json module and pydantic's parser recurse once per level of nesting: json raises
RecursionError near a thousand levels, and a RecursionError is no ValueError, so whoever reads a
body `[[[[...` 3,000 deep dies with a traceback (a console page answers 500, a CLI command
crashes). Nesting is measured here without recursion (a linear scan), and anything deeper than
MAX_JSON_DEPTH is refused at the door (events/decoding.py, reason invalid_json) and shown as text
wherever a stored body or detail is shown (`loads`, `parsed_or_text`, `pretty`, `detail_of`).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 64
"""Arrays and objects nested deeper than this are not parsed. No message body nests more than
two levels (an array in an object), nor does anything pkgq stores as JSON (headers are cut at
events.envelope.MAX_HEADER_DEPTH, 16), so the bound only ever refuses an outsider's garbage."""

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
"""A JSON string (escapes included); possessive, so no backtracking on any input."""
_NOT_BRACKET = re.compile(rb"[^\[\]{}]++")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class TooDeepError(ValueError):
    """JSON nested deeper than the limit (a ValueError, as invalid JSON is)."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(f"JSON nested {depth} deep, deeper than the limit of {limit}")
        self.depth = depth
        self.limit = limit


def depth_over(text: bytes | str, limit: int = MAX_JSON_DEPTH) -> int | None:
    """How deep `text` nests arrays and objects, when that is more than `limit`; else None.

    Linear and without recursion, in C loops: brackets inside strings are not counted. Text that
    is not JSON gets a depth all the same (its brackets outside what reads as strings), so
    garbage 3,000 brackets deep is told apart from other garbage."""
    if isinstance(text, str):
        if text.count("[") + text.count("{") <= limit:
            return None  # the common case: too few brackets to nest that deep
        data = text.encode("utf-8", "surrogatepass")
    elif text.count(b"[") + text.count(b"{") <= limit:
        return None
    else:
        data = text
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data))
    depth = max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
    return depth if depth > limit else None


def check_depth(text: bytes | str, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise TooDeepError when `text` nests deeper than `limit`."""
    depth = depth_over(text, limit)
    if depth is not None:
        raise TooDeepError(depth, limit)


def loads(text: bytes | str, limit: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, but ValueError (TooDeepError) rather than RecursionError for deep JSON."""
    check_depth(text, limit)
    return json.loads(text)


def as_text(raw: bytes | str) -> str:
    """Stored bytes as text to show (bytes that are not UTF-8 replaced)."""
    return raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")


def parsed_or_text(raw: bytes | str) -> Any:
    """A stored body or value to show: its JSON value when it parses within MAX_JSON_DEPTH, else
    its text as it is (never an exception, whatever the bytes)."""
    try:
        return loads(raw)
    except ValueError:  # invalid JSON, too deep, or bytes that are not UTF-8
        return as_text(raw)


def pretty(raw: bytes | str) -> str:
    """A stored body as text to show or edit: indented JSON when it parses within
    MAX_JSON_DEPTH, else its text as it is."""
    try:
        return json.dumps(loads(raw), indent=2, ensure_ascii=False)
    except ValueError:
        return as_text(raw)


def detail_of(value: Any) -> dict[str, Any]:
    """A jsonb detail as a dict, whether the connection's codec parsed it (a dict) or not (its
    text); text that is no object, or too deep to parse, as {"text": ...}."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, str | bytes):
        return {"value": value}
    parsed = parsed_or_text(value)
    return parsed if isinstance(parsed, dict) else {"text": as_text(value)}
