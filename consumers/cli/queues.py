"""`pkgq queues convert`: move the broker's queues to the type these settings declare (classic
to quorum, the replicated profile) by drain-and-recreate (infra/rabbit/convert.py,
docs/how-to/replicated.md)."""

from __future__ import annotations

import sys
from typing import Annotated, Literal

import structlog
import typer

from consumers.cli.output import console, say
from consumers.cli.running import load_routing_settings, run
from infra.rabbit.connection import open_amqp
from infra.rabbit.convert import Progress, convert
from infra.settings import Settings

log = structlog.get_logger(__name__)

queues_app = typer.Typer(help="The broker's queues: move them to another queue type.")

_SAY = {
    "holding": "new messages now wait in {queue}.converting; {queue} only drains",
    "declared": "{queue} declared anew",
    "converted": "{queue} converted ({moved} held message(s) moved in)",
}


class _Shown:
    """One line per step; while a queue drains, a status line on a terminal (a log line per
    change otherwise)."""

    def __init__(self) -> None:
        self._draining: tuple[str, int | None, int | None] | None = None
        self._status = console().status("") if sys.stdout.isatty() else None

    def __call__(self, progress: Progress) -> None:
        if progress.step == "draining":
            state = (progress.queue, progress.ready, progress.consumers)
            if state == self._draining:
                return
            self._draining = state
            text = (
                f"waiting for {progress.queue}: {progress.ready} message(s), "
                f"{progress.consumers} consumer(s); it is replaced once both are 0 (let its "
                "consumers drain it, then stop them)"
            )
            if self._status is not None:
                self._status.update(text)
                self._status.start()
            else:
                log.info("queue_draining", **_fields(progress))
            return
        if self._status is not None:
            self._status.stop()
        if progress.step in _SAY:
            say(_SAY[progress.step].format(queue=progress.queue, moved=progress.moved))
        log.debug("queue_" + progress.step, **_fields(progress))


def _fields(progress: Progress) -> dict[str, object]:
    return {
        "queue": progress.queue,
        "ready": progress.ready,
        "consumers": progress.consumers,
        "moved": progress.moved,
    }


async def _convert(settings: Settings) -> dict[str, int]:
    connection = await open_amqp(settings, "pkgq-queues-convert")
    try:
        return await convert(connection, settings, _Shown())
    finally:
        await connection.close()


@queues_app.command("convert")
def convert_cmd(
    to: Annotated[
        Literal["classic", "quorum"] | None,
        typer.Option(help="The queue type to move to (default: PKGQ_QUEUE_TYPE)."),
    ] = None,
) -> None:
    """Bring every queue pkgq declares to the type and arguments these settings give, by
    drain-and-recreate: new messages wait in a holding queue while the old queue drains; once
    it is empty and its consumers are stopped it is declared anew and the held messages move
    in, as they were. Run it while the route's consumers still run with the old settings;
    pause pkgq's relay for the route first (`pkgq partitions pause`) to keep the order exact.
    Safe to run again: it resumes an interrupted conversion, and converts nothing twice."""
    settings = load_routing_settings()
    if to is not None:
        settings = settings.with_queue_type(to)
    converted = run(_convert(settings))
    if not converted:
        say("every queue already has the arguments these settings declare: nothing to do")
