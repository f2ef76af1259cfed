"""`pkgq workers` and `pkgq prune` (being written)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the commands of this module to the `pkgq` app."""
