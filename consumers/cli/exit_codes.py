"""What a `pkgq` command's exit status means: one meaning per number (the table in
docs/explanation/cli.md).

Errors that stop a command before it does anything (a usage error, something not found, a
broker or database that is not as pkgq needs it) are printed on stderr; a command's outcome
(what it did, or why it did less) is printed on stdout, whatever its status.
"""

from __future__ import annotations

from typing import NoReturn

import typer

from infra.terminal import printable

OK = 0
FAILED = 1
USAGE = 2
NOT_FOUND = 3
DROPPED = 4
TIMEOUT = 5
MISMATCH = 6
NOT_CONFIRMED = 7
VIOLATIONS = 8
UNREACHABLE = 9

MEANINGS: dict[int, str] = {
    OK: "ok: done as asked",
    FAILED: "failed: the command ran and did less than asked (a message failed, a dead letter "
    "was not replayed, a group was already finished, a consumer stopped)",
    USAGE: "usage error: an unknown option, route or value, a body its route refuses, or TLS "
    "settings that cannot work (an unreadable CA, certificate or key file, or a server whose "
    "certificate that CA does not verify)",
    NOT_FOUND: "not found: no such dead letter, item, package, group or address",
    DROPPED: "dropped or duplicate: a repeat within its unique window, or an address in use",
    TIMEOUT: "timeout: still not finished when the command stopped waiting",
    MISMATCH: "mismatch: the broker or the database is not as pkgq needs it (a queue declared "
    "with other arguments, the topology not provisioned, the runtime role missing)",
    NOT_CONFIRMED: "not confirmed: a destructive command was declined at its prompt, or had no "
    "terminal to ask on and no --yes; nothing was changed",
    VIOLATIONS: "violations: an invariant does not hold (`pkgq doctor` found rows that break it, "
    "and names them)",
    UNREACHABLE: "unreachable: RabbitMQ or PostgreSQL did not answer at the configured address "
    "(down, or a wrong address) or went away during the command",
}


def fail(code: int, message: object) -> NoReturn:
    """Stop the command with `code`, saying why on stderr (as printable text)."""
    typer.echo(f"error: {printable(message)}", err=True)
    raise typer.Exit(code)
