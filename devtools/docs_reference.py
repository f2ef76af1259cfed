"""The documentation site's generated references (docs/reference/*.md), read from the code itself:
every `PKGQ_*` setting (the pydantic settings and their attribute docstrings), every `pkgq`
command and option (the typer app's click tree), every metric (the prometheus registry), every
route (events/routes.py), every dead-letter reason (REASONS, checked against the code) and every
package and module (their docstrings). Each page is made by a module of devtools/reference/.

    .venv/bin/python -m devtools.docs_reference          # rewrite docs/reference/*.md
    .venv/bin/python -m devtools.docs_reference --check  # exit 1 and name the stale pages

tests/unit/test_docs_reference.py fails when a committed page differs from what this writes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from devtools.reference.cli_page import cli_page
from devtools.reference.common import COMMAND, REFERENCE
from devtools.reference.dead_letters_page import (
    NOT_REASONS,
    REASONS,
    _reason_literals,
    dead_letters_page,
    reasons_in_code,
)
from devtools.reference.layout_page import layout_page
from devtools.reference.settings_page import settings_page
from devtools.reference.wire_pages import metrics_page, routes_page

__all__ = ["COMMAND", "NOT_REASONS", "REASONS", "_reason_literals", "reasons_in_code", "stale"]

PAGES: dict[str, Callable[[], str]] = {
    "settings.md": settings_page,
    "cli.md": cli_page,
    "metrics.md": metrics_page,
    "routes.md": routes_page,
    "dead-letters.md": dead_letters_page,
    "layout.md": layout_page,
}


def pages() -> dict[str, str]:
    """Every generated page by file name, as this checkout's code makes it."""
    return {name: make() for name, make in PAGES.items()}


def stale(target: Path = REFERENCE) -> list[str]:
    """The generated pages that differ from their committed files, or are missing."""
    return [
        name
        for name, text in pages().items()
        if not (target / name).exists() or (target / name).read_text() != text
    ]


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        bad = stale()
        for name in bad:
            print(f"docs/reference/{name} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if bad else 0
    if argv:
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (REFERENCE / name).write_text(text)
        print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
