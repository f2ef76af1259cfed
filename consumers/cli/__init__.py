"""The `pkgq` command line: one module per command group (see app.py)."""

from consumers.cli.app import app, main

__all__ = ["app", "main"]
