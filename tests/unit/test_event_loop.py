"""The CLI's event loop: uvloop unless PKGQ_EVENT_LOOP=asyncio (infra/event_loop.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import uvloop

from consumers.cli import running
from infra import event_loop
from infra.settings import Settings


@pytest.fixture(autouse=True)
def _restore_choice() -> Iterator[None]:
    before = event_loop.chosen()
    yield
    event_loop.choose(before)


async def _loop_type() -> type[asyncio.AbstractEventLoop]:
    return type(asyncio.get_running_loop())


def test_commands_run_on_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PKGQ_EVENT_LOOP", raising=False)
    assert Settings.model_fields["event_loop"].default == "uvloop"
    event_loop.choose(Settings().event_loop)
    assert running.run(_loop_type()) is uvloop.Loop


def test_event_loop_asyncio_runs_commands_on_the_standard_library_loop() -> None:
    event_loop.choose("asyncio")
    loop_type = running.run(_loop_type())
    assert loop_type is not uvloop.Loop
    assert issubclass(loop_type, asyncio.BaseEventLoop)


def test_load_settings_chooses_the_configured_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKGQ_EVENT_LOOP", "asyncio")
    running.load_settings()
    assert event_loop.chosen() == "asyncio"
    monkeypatch.setenv("PKGQ_EVENT_LOOP", "uvloop")
    running.load_settings()
    assert event_loop.chosen() == "uvloop"


def test_an_unknown_event_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKGQ_EVENT_LOOP", "trio")
    with pytest.raises(ValueError, match="event_loop"):
        Settings()
