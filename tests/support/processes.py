"""Real `pkgq` processes started through the CLI, their environment, and their status port."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile

from infra.settings import Settings
from tests.support import pg_roles
from tests.support.zygote import Forked, zygote


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """A spawned `pkgq` process's environment: it connects as the session's runtime role (the
    owner for `pkgq migrate`), as in production, whatever role the test's fixtures use."""
    return {
        **os.environ,
        **settings.child_env(),
        "PKGQ_POSTGRES_DSN": pg_roles.as_role(settings.postgres_dsn, pg_roles.RUNTIME),
        "PKGQ_LOG_FORMAT": "json",
        "PKGQ_LOG_LEVEL": "info",
        **extra,
    }


def pkgq(
    settings: Settings, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run one `pkgq` command (python -m consumers ...) against the test's namespace, with
    `env` added to its environment: forked from the worker's fork server, which has the
    command line imported already (tests/support/zygote.py), unless PKGQ_TEST_ZYGOTE=0."""
    forks = zygote()
    if forks is not None:
        return forks.run(list(args), settings_env(settings, **env), stdin, timeout=120)
    return subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env=settings_env(settings, **env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def cli(
    settings: Settings, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(pkgq, settings, *args, stdin=stdin, **env)


class PkgqProcess:
    """A real `pkgq` process started through the CLI (python -m consumers ...)."""

    def __init__(
        self, settings: Settings, *args: str, python: str = sys.executable, **env: str
    ) -> None:
        """`python`: the interpreter (another release's, for the rolling-upgrade test)."""
        self.args = args
        self.log = tempfile.NamedTemporaryFile(prefix="pkgq-", suffix=".log")  # noqa: SIM115
        forks = zygote() if python == sys.executable else None
        self.proc: subprocess.Popen[bytes] | Forked
        if forks is not None:  # a fork of the worker's fork server (tests/support/zygote.py)
            self.proc = forks.start(list(args), settings_env(settings, **env), self.log.name, None)
            return
        self.proc = subprocess.Popen(
            [python, "-m", "consumers", *args],
            env=settings_env(settings, **env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def logs(self) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read().decode(errors="replace")


STATUS_PORTS = range(20_000, 25_000)
"""Where free_port looks: below the kernel's ephemeral range (32768-60999 by default), where
other programs' short-lived listeners come and go. A port the kernel picked there was once
taken by something else between the probe and the process's bind (the test read a binary
handshake, likely from the Erlang node a chaos test's rabbitmqctl starts). Above the dev and
HA-lab brokers' ports (5672-5690, 15672-15690), below the lab's distribution ports (25680 and
up)."""


def free_port() -> int:
    """A TCP port nothing listens on now (for a process's status port)."""
    for port in random.sample(STATUS_PORTS, 100):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port among 100 tried in {STATUS_PORTS}")


async def http_get(port: int, path: str) -> tuple[int, str]:
    """GET a path of a local status port: (status code, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    response = (await reader.read()).decode()
    writer.close()
    head, _, body = response.partition("\r\n\r\n")
    return int(head.split()[1]), body


async def assert_doctor_clean(settings: Settings) -> None:
    """`pkgq doctor` finds every invariant holding (exit 0) on the test's database."""
    doctor = await cli(settings, "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
