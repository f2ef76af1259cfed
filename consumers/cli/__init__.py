"""The `pkgq` command line: one module per command group, assembled in app.py.

Importing a helper module (durations, output, exit_codes, …) does not build the app; `main`,
the console script's entry point, does.
"""


def main() -> None:
    """`pkgq`: run the command line."""
    from consumers.cli.app import app

    app()
