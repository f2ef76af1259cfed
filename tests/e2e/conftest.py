from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator

import pytest

from infra.settings import Settings
from tests.support.processes import PkgqProcess


@pytest.fixture
def spawn(settings: Settings) -> Iterator[Callable[..., PkgqProcess]]:
    """Start real `pkgq` processes; whatever still runs at the end is resumed and stopped."""
    started: list[PkgqProcess] = []

    def start(*args: str, **env: str) -> PkgqProcess:
        process = PkgqProcess(settings, *args, **env)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.proc.poll() is None:
            os.kill(process.proc.pid, signal.SIGCONT)  # a test may have frozen it (SIGSTOP)
        try:
            process.terminate(timeout=20)
        except Exception:  # noqa: BLE001  (teardown must stop the rest)
            process.kill()
