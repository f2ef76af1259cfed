"""Text bound for a terminal (operator commands, console logs) that may carry data from messages.

C0 controls but tab and newline, DEL, C1 controls, and the Unicode bidi overrides and isolates
can rewrite or hide what an operator sees (ESC starts ANSI sequences, CR overwrites a line,
U+202E reverses text). Anyone who can publish chooses a message's type, headers and body, and
so the error text and traceback they cause: such characters are shown as their escapes.
"""

from __future__ import annotations

import re

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    """`value` as text with every control character but tab and newline shown as its escape
    (`\\x1b`), so it can neither drive the terminal nor vanish from what the operator reads."""
    return _CONTROLS.sub(_visible, "" if value is None else str(value))
