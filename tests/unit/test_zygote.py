"""The test workers' fork server runs a `pkgq` command as a fresh `python -m consumers`
process does: the same status, output and error output, its own environment, working
directory and input, and a command killed at its timeout is reported as subprocess does."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.zygote import Zygote


@pytest.fixture(scope="module")
def forks() -> Iterator[Zygote]:
    server = Zygote()
    yield server
    server.close()


def _fresh(
    args: list[str], env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["no-such-command"],
        ["dlq", "--help"],
        ["route", "pause", "--help"],
        ["route", "pause"],  # a missing argument: usage error, status 2
        ["publish", "--help"],
    ],
)
def test_a_forked_command_prints_and_exits_as_a_fresh_process(
    forks: Zygote, args: list[str]
) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    forked = forks.run(args, env, None, timeout=60)
    fresh = _fresh(args, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert forked.args == [sys.executable, "-m", "consumers", *args]


def test_a_forked_command_reads_its_own_environment_and_input(forks: Zygote) -> None:
    env = {**os.environ, "PKGQ_AMQP_URL": "not a url at all"}
    forked = forks.run(["publish", "package_purchase", "-"], env, "{}", timeout=60)
    fresh = _fresh(["publish", "package_purchase", "-"], env, "{}")
    assert forked.returncode == fresh.returncode != 0
    assert forked.stderr == fresh.stderr


BODY = '{"user_id": "00000000-0000-0000-0000-000000000001", "package_id": 1}'
"""A purchase body that `pkgq publish` accepts."""


@contextlib.contextmanager
def a_silent_broker() -> Iterator[dict[str, str]]:
    """An environment whose broker takes the connection and never answers the AMQP handshake,
    so a publish waits until it is stopped."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        yield {**os.environ, "PKGQ_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{port}/"}


def test_a_forked_command_over_its_timeout_is_killed_and_reported_as_subprocess_does(
    forks: Zygote,
) -> None:
    with a_silent_broker() as env, pytest.raises(subprocess.TimeoutExpired):
        forks.run(["publish", "package_purchase", "-"], env, BODY, timeout=1)
    after = forks.run(["--version"], dict(os.environ), None, timeout=60)
    assert after.returncode == 0


def test_a_forked_long_running_command_logs_to_one_file_and_is_signalled_by_pid(
    forks: Zygote, tmp_path: Path
) -> None:
    """A long-running command (as PkgqProcess starts one) writes its output and its errors
    into one log, is signalled by pid, and reports its status as Popen does."""
    log = tmp_path / "child.log"
    log.touch()
    with a_silent_broker() as env:
        child = forks.start(["publish", "package_purchase", BODY], env, str(log), None)
        assert child.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.2)
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    assert child.poll() == -signal.SIGKILL
    # Output and error output in one file: a usage error prints to stderr.
    wrong = forks.start(["route", "pause"], dict(os.environ), str(log), None)
    assert wrong.wait(60) == 2
    assert "Usage:" in log.read_text()


def test_the_commands_a_worker_left_running_are_stopped_when_the_worker_goes(
    tmp_path: Path,
) -> None:
    """The server ends once the worker's end of the requests pipe closes, and takes down
    what that worker still had running, so nothing outlives a test session."""
    server = Zygote()
    log = tmp_path / "left.log"
    log.touch()
    with a_silent_broker() as env:
        left = server.start(["publish", "package_purchase", BODY], env, str(log), None)
        server.close()
    assert not server.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(left.pid, 0)  # gone, and reaped
