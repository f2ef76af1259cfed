"""A replay run (`pkgq dlq replay`, `plow`, the console's bulk replay): sends its frozen set of
dead letters back through the outbox at its rate, watches what becomes of them, and stops by
itself when they fail again or when a route's circuit breaker trips; resumed later, it sends
only what it has not sent (infra/postgres/replay_runs.py holds the record; domain/replay_pace.py
the pace and the verdict).

Each batch is one transaction (consumers/operations.replay_batch, the same as the console's):
its letters are marked `replayed` and the run's letters `sent` together, so a run killed
half-way and resumed sends each message once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

import structlog

from consumers import operations
from domain.replay_pace import Limits, Pacer, Progress, Window, awaiting_verdict, batch_size
from domain.replay_pace import failing as failing_verdict
from infra.postgres import replay, replay_runs
from infra.postgres.pool import Conn
from infra.transient import transient_retrying

log = structlog.get_logger(__name__)

Connect = Callable[[], AbstractAsyncContextManager[Conn]]
"""A connection for one step (the CLI's one connection, or the console's pool)."""
CHECK_EVERY_S = 1.0
"""How often a run looks at what became of its messages, its breakers and its state."""
WAITING_CHECK_S = 0.25
SUPERSEDED = "superseded"
"""What a runner stops as when its run was resumed by another (never stored: the run goes on)."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    who: str
    pkgq_user: str
    """pkgq's AMQP user (see replay.replay_message: who may be replayed on a pkgq-only route)."""
    force: bool = False
    verdict_wait_s: float = 120.0
    """How long a run holds back, once it sent its first check_first messages, for all of
    them to be decided; then it goes on, still watching them."""


@dataclass(slots=True)
class Outcome:
    progress: Progress
    skipped: list[replay.ReplayResult] = field(default_factory=list)


async def start(
    conn: Conn,
    ids: Sequence[int],
    who: str,
    *,
    description: str,
    transition: str = "dig",
    rate: float | None = None,
    limits: Limits | None = None,
) -> int:
    """Record a run over these dead letters (its frozen set, in this order). Returns its id."""
    if rate is not None and rate <= 0:
        raise ValueError("a rate is a number of messages a second, above 0")
    limits = limits or Limits()
    new = replay_runs.NewRun(
        ids=list(dict.fromkeys(ids)),
        started_by=who,
        description=description,
        transition=transition,
        rate=rate,
        check_first=limits.check_first,
        max_failed=limits.max_failed,
        min_decided=limits.min_decided,
    )
    return await replay_runs.create(conn, new)


class _Run:
    def __init__(
        self,
        connect: Connect,
        run: dict[str, object],
        options: RunOptions,
        on_progress: Callable[[Progress], None],
    ) -> None:
        self._connect = connect
        self._options = options
        self._on_progress = on_progress
        self.id = int(str(run["id"]))
        self.leg = int(str(run["leg"]))
        self.total = int(str(run["total"]))
        self.sent = int(str(run["sent"]))
        self.skipped = int(str(run["skipped"]))
        self.transition = str(run["transition"])
        rate = run["rate"]
        self.rate = None if rate is None else float(str(rate))
        self.limits = Limits(
            int(str(run["check_first"])),
            float(str(run["max_failed"])),
            int(str(run["min_decided"])),
        )
        self.leg_sent = 0
        self.started = time.monotonic()
        self.pacer = Pacer(self.rate, self.started)
        self.failed_again = int(str(run["failed_again"]))
        self.applied = int(str(run["applied"]))
        self.window = Window(0, 0, 0)
        self.skipped_now: list[replay.ReplayResult] = []

    def progress(self, state: str = "running", reason: str | None = None) -> Progress:
        return Progress(
            run_id=self.id,
            state=state,
            total=self.total,
            sent=self.sent,
            skipped=self.skipped,
            failed_again=self.failed_again,
            applied=self.applied,
            leg_sent=self.leg_sent,
            leg_seconds=time.monotonic() - self.started,
            reason=reason,
        )

    async def look(self) -> tuple[str, str] | None:
        """Read what became of the sent messages, and whether the run must stop: (state,
        reason), or None to go on."""
        async with self._connect() as conn:
            stored = await replay_runs.get(conn, self.id)
            if stored is not None and int(stored["leg"]) != self.leg:
                # Resumed meanwhile (this runner was taken for gone): the new leg's runner
                # drives the run now; this one stops and writes nothing of the run's state.
                return (SUPERSEDED, f"resumed meanwhile as leg {stored['leg']}")
            if stored is None or stored["state"] != "running":
                # cancelled by an operator meanwhile (the console), or gone
                state = "cancelled" if stored is None else str(stored["state"])
                return (
                    state,
                    "stopped from outside the run" if stored is None else stored["reason"],
                )
            seen = await replay_runs.outcomes(conn, self.id)
            tripped = await replay_runs.tripped_breakers(conn, self.id)
        self.failed_again, self.applied = seen.failed_again, seen.applied
        self.window = Window(seen.window_sent, seen.window_applied, seen.window_failed)
        if tripped:
            routes = ", ".join(str(t["route"]) for t in tripped)
            why = "; ".join(str(t["reason"]) for t in tripped)
            return (
                "stopped_breaker",
                f"the circuit breaker of {routes} tripped ({why}): fix the cause, resume the "
                f"route (`pkgq route resume`), then resume the run (`pkgq dlq replay --resume "
                f"{self.id}`)",
            )
        failing = failing_verdict(self.window, self.limits)
        if failing is not None:
            return ("stopped_failing", f"{failing} (`pkgq dlq replay --resume {self.id}`)")
        return None

    async def send(self, ids: list[int]) -> None:
        async for attempt in transient_retrying():
            with attempt:
                async with self._connect() as conn, conn.transaction():
                    results = await operations.replay_batch(
                        conn,
                        ids,
                        self._options.who,
                        pkgq_user=self._options.pkgq_user,
                        force=self._options.force,
                        transition=self.transition,
                    )
                    sent = [r.id for r in results if r.replayed]
                    # A letter no longer there to lock (purged, or not buried any more) is
                    # skipped too: the run never comes back to it.
                    found = {r.id for r in results}
                    skipped = [(r.id, r.detail) for r in results if not r.replayed]
                    skipped += [(i, "not buried any more") for i in ids if i not in found]
                    await replay_runs.mark(conn, self.id, self.leg, sent, skipped)
        self.sent += len(sent)
        self.leg_sent += len(sent)
        self.skipped += len(skipped)
        self.pacer.record(len(sent))
        self.skipped_now += [r for r in results if not r.replayed]
        self.skipped_now += [
            replay.ReplayResult(i, None, False, "not buried any more")
            for i in ids
            if i not in found
        ]

    async def finish(self, state: str, reason: str | None) -> Outcome:
        if state != SUPERSEDED:
            async with self._connect() as conn:
                await replay_runs.finish(conn, self.id, self.leg, state, reason)
        progress = self.progress(state, reason)
        self._on_progress(progress)
        if state != "done":
            log.warning("replay_stopped", reason=reason, **progress.fields())
        return Outcome(progress, self.skipped_now)

    async def drive(self) -> Outcome:
        size = batch_size(self.rate)
        next_look = 0.0
        waiting_since: float | None = None
        gave_up_waiting = False
        while True:
            now = time.monotonic()
            if now >= next_look:
                stop = await self.look()
                if stop is not None:
                    return await self.finish(*stop)
                self._on_progress(self.progress())
                next_look = now + CHECK_EVERY_S
            left = self.total - self.sent - self.skipped
            if not gave_up_waiting and awaiting_verdict(self.window, self.limits, left):
                if waiting_since is None:
                    waiting_since = now
                    log.info("replay_awaiting_verdict", **self.progress().fields())
                if now - waiting_since < self._options.verdict_wait_s:
                    await asyncio.sleep(WAITING_CHECK_S)
                    next_look = 0.0
                    continue
                gave_up_waiting = True
                log.warning(
                    "replay_verdict_timeout",
                    undecided=self.window.sent - self.window.decided,
                    waited_s=self._options.verdict_wait_s,
                    **self.progress().fields(),
                )
            # The window's last batch ends at its edge: the run judges exactly its first K.
            room = self.limits.check_first - self.leg_sent
            wanted = min(size, room) if room > 0 else size
            wait = self.pacer.wait_before(time.monotonic(), wanted)
            if wait > 0:
                await asyncio.sleep(min(wait, CHECK_EVERY_S))  # and look meanwhile, when due
                continue
            async with self._connect() as conn:
                ids = await replay_runs.pending(conn, self.id, wanted)
            if not ids:
                await self.look()  # the last word on what became of them, for the record
                return await self.finish("done", None)
            await self.send(ids)
            if room > 0 and self.leg_sent >= self.limits.check_first:
                next_look = 0.0  # its window is sent: look at it before going on
            self._on_progress(self.progress())


async def drive(
    connect: Connect,
    run_id: int,
    options: RunOptions,
    on_progress: Callable[[Progress], None] = lambda _: None,
) -> Outcome:
    """Run a started (or resumed) run to its end: done, or stopped with the reason. A run
    interrupted (Ctrl-C, the process stopping) is recorded as cancelled, and can be resumed."""
    async with connect() as conn:
        row = await replay_runs.get(conn, run_id)
    if row is None or row["state"] != "running":
        raise LookupError(f"replay run {run_id} is not running")
    run = _Run(connect, row, options, on_progress)
    log.info("replay_started", leg=run.leg, **run.progress().fields())
    try:
        return await run.drive()
    except asyncio.CancelledError:
        try:
            async with asyncio.timeout(5):
                await run.finish("cancelled", "interrupted: the replaying process stopped")
        except Exception as exc:  # noqa: BLE001  (the run stays `running`; stale, resumable)
            log.warning("replay_cancel_not_recorded", run_id=run_id, error=repr(exc))
        raise


async def resume(conn: Conn, run_id: int, who: str, rate: float | None = None) -> dict[str, object]:
    """Make a stopped run `running` again, on a new leg (`rate`: a new rate, else its own).
    LookupError when it cannot be resumed, with why."""
    row = await replay_runs.begin_leg(conn, run_id, who, rate)
    if row is None:
        found = await replay_runs.get(conn, run_id)
        if found is None:
            raise LookupError(f"no replay run {run_id}")
        raise LookupError(
            f"replay run {run_id} is {found['state']}"
            + (" (its runner is still at work)" if found["state"] == "running" else "")
            + ": only a stopped or cancelled run is resumed"
        )
    return row
