"""How every command prints: JSON with `--json`, otherwise text or a table; data from messages
always as literal, printable text (never rich markup, never terminal control characters)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table
from rich.text import Text

from infra.terminal import printable

T = TypeVar("T")
Cell = str | Text
Column = tuple[str, Callable[[Any], Cell]]
"""A table column: its heading, and how a row's cell is made."""


@functools.cache
def console() -> Console:
    """The terminal a command prints to, made when it first prints: its width and colours come
    from the environment the command runs in (COLUMNS, NO_COLOR, ...), not the one pkgq was
    imported in."""
    return Console()


def clean(value: object) -> str:
    """Data from a message or another process (type, route, error text, traceback) as printable
    text: control characters shown as their escapes (infra/terminal.py)."""
    return printable(value)


def text(value: object, style: str = "") -> Text:
    """`clean(value)` as a rich Text: printed literally, never parsed as rich markup (a message
    type of `[/]` would otherwise crash the command, and `[bold]` would restyle the output)."""
    return Text(clean(value), style=style)


def short(value: str | None, width: int) -> Text:
    """One table cell of message data: one line, at most `width` characters, literal."""
    line = (value or "").replace("\n", " ")
    return text(line if len(line) <= width else line[: width - 1] + "…")


def say(*parts: object) -> None:
    """One line of text output, every part literal (no markup), never wrapped (scripts read it)."""
    line = Text.assemble(*(part if isinstance(part, Text) else clean(part) for part in parts))
    console().print(line, soft_wrap=True)


def print_json(value: Any, *, indent: int | None = 2) -> None:
    """JSON on stdout: dates and UUIDs as strings; JSON escapes every control character."""
    print(json.dumps(value, default=str, indent=indent))


def show(value: T, as_json: bool, render: Callable[[T], None], *, data: Any = None) -> None:
    """`--json` prints `data` (default: `value`) as JSON, otherwise `render(value)` prints text."""
    if as_json:
        print_json(value if data is None else data)
    else:
        render(value)


def table(rows: Iterable[Any], columns: Sequence[Column]) -> Table:
    """A table of `rows`, one cell per column."""
    view = Table(*(heading for heading, _ in columns))
    for row in rows:
        view.add_row(*(cell(row) for _, cell in columns))
    return view


def show_table(
    rows: Sequence[Any], as_json: bool, columns: Sequence[Column], *, footer: str | None = None
) -> None:
    """The commands' usual output: the rows as JSON with `--json`, else a table (and a footer)."""

    def render(found: Sequence[Any]) -> None:
        console().print(table(found, columns))
        if footer is not None:
            say(footer)

    show(rows, as_json, render)


def field(key: str, width: int | None = None) -> Callable[[Any], Cell]:
    """A cell showing `row[key]` literally (cut to `width` characters on one line, if given)."""
    if width is None:
        return lambda row: text("" if row[key] is None else row[key])
    return lambda row: short(None if row[key] is None else str(row[key]), width)


def moment(key: str, layout: str = "%Y-%m-%d %H:%M:%S") -> Callable[[Any], Cell]:
    """A cell showing the time `row[key]` (empty when it has none)."""
    return lambda row: row[key].strftime(layout) if row[key] is not None else ""
