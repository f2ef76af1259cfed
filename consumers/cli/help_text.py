"""Help texts as sentences: a docstring or an option's help is written wrapped at the source's
line length, and rich/click keep those newlines, so `pkgq --help` broke sentences mid-line at
every terminal width. `ReflowedGroup` (the app's group class) joins each paragraph's lines into
one when the command tree is built, for every command and option below it (lazy.py's group: as
it builds each command), and the terminal wraps them. Paragraphs (blank lines), list items and
click's `\\b` no-rewrap blocks stay as written."""

from __future__ import annotations

import inspect
import re
from typing import Any

from typer.core import TyperGroup

_LIST_ITEM = re.compile(r"^(?:[-*•] |\d+[.)] )")


def reflow(text: str) -> str:
    """`text` with each paragraph's wrapped lines joined (a list item's continuation lines into
    the item); what follows a form feed (click's cut-off for the help) is left alone."""
    head, cut, tail = text.partition("\f")
    paragraphs = []
    for paragraph in inspect.cleandoc(head).split("\n\n"):
        if paragraph.startswith("\b"):
            paragraphs.append(paragraph)
            continue
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not _LIST_ITEM.match(line.strip()):
                lines[-1] = f"{lines[-1]} {line.strip()}"
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs) + cut + tail


def reflow_tree(command: Any) -> None:
    """Reflow the help of `command`, its options and every command below it, in place."""
    for attribute in ("help", "short_help"):
        value = getattr(command, attribute, None)
        if isinstance(value, str):
            setattr(command, attribute, reflow(value))
    for param in getattr(command, "params", []):
        if isinstance(getattr(param, "help", None), str):
            param.help = reflow(param.help)
    for sub in (getattr(command, "commands", None) or {}).values():
        reflow_tree(sub)


class ReflowedGroup(TyperGroup):
    """A root group built last, with every command and group under it already built, so
    reflowing from here covers the whole tree (its subclass lazy.LazyGroup reflows each command
    it builds later)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reflow_tree(self)
