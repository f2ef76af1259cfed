"""The `pkgq` command line: one module per command group, assembled in app.py.

Importing a helper module (durations, output, exit_codes, …) does not build the app; `main`,
the console script's entry point, does.
"""


def main() -> None:
    """`pkgq`: run the command line."""
    import sys

    from consumers.cli import exit_codes
    from consumers.cli.app import app
    from infra.terminal import printable
    from infra.tls import TlsError

    try:
        app()
    except TlsError as exc:  # any command, long-running ones too: one line, no traceback
        print(f"error: {printable(exc)}", file=sys.stderr)
        sys.exit(exit_codes.USAGE)
