"""What becomes of one delivery on a route: applied once, parked, retried later, or buried.

For each delivery, in one Postgres transaction:
1. decode it; bad input is buried in the dead-letter store with its reason (never retried);
2. a message the consumer applied before is a duplicate: nothing to do;
3. if the user's messages on this consumer are held behind an earlier failure, park it;
4. otherwise apply it (inbox claim + handler) inside a savepoint. Blips (deadlocks,
   serialization failures) are retried in the savepoint with tenacity. If the handler still fails:
   - a broken domain rule is permanent: bury it at once;
   - any other error: schedule the same message again through the outbox at
     now + backoff(attempt), with the attempt count in `x-attempt`, and hold the user's later
     messages behind it; after the policy's last attempt, bury it (the hold stays until an
     operator replays or discards it).
Outages (the database unreachable) leave the savepoint and the transaction: the caller waits
them out and tries the whole delivery again, so nothing is recorded as a failure of the message.

After a blocker is applied (or discarded by an operator), `release` applies the user's parked
messages one transaction each, in order, until one fails (it becomes the new blocker) or none
is left (the hold is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import structlog
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from consumers.handler_errors import Bury, Retry, TTRExceededError
from consumers.retry_policy import RetryPolicy
from consumers.unit_of_work import Handler, HandlerContext
from domain.errors import DomainError
from events.decoding import BadMessageError, Decoded, RawDelivery, decode
from events.envelope import (
    CONTENT_TYPE,
    H_ATTEMPT,
    H_FIRST_FAILED_AT,
    H_LAST_ERROR,
    H_PRIORITY,
    H_REPLAY_GENERATION,
    H_USER_ID,
    Envelope,
    job_marks,
    jsonable,
    republished_headers,
)
from events.routes import Route
from infra import tracing
from infra.postgres import dead_letters, holds, inbox, job_state, outbox, transitions
from infra.postgres.pool import Conn
from infra.rabbit.consumer import MESSAGE_TIMES, MESSAGE_TRACES, Outcome
from infra.transient import is_outage, is_transient

log = structlog.get_logger(__name__)

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    error_type: str
    message: str
    location: str
    """Where it was raised: `path:line in function` (the key `pkgq dlq groups` groups by)."""
    traceback: str


def describe(exc: BaseException) -> ErrorInfo:
    """Name, message and origin of an error. The origin is the innermost frame in pkgq's own
    code (a driver's internals say little about which of our lines went wrong)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [
        f
        for f in frames
        if Path(f.filename).is_relative_to(ROOT)
        and not {".venv", "site-packages"} & set(Path(f.filename).parts)
    ]
    location = ""
    if ours or frames:
        last = (ours or frames)[-1]
        path = Path(last.filename)
        shown = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        location = f"{shown}:{last.lineno} in {last.name}"
    return ErrorInfo(
        error_type=type(exc).__qualname__,
        message=str(exc) or type(exc).__name__,
        location=location,
        traceback="".join(traceback.format_exception(exc)),
    )


class _HandlerFailedError(Exception):
    """A handler raised in an unguarded batch: run the batch again with savepoints."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(f"handler failed on delivery {index} of the batch: {error!r}")
        self.index = index
        self.error = error


class DatabaseUnavailableError(ConnectionError):
    """No pooled connection could be had in time (an outage: see infra/transient.py)."""


def _is_blip(exc: BaseException) -> bool:
    return is_transient(exc) and not is_outage(exc)


@dataclass
class _BatchJobs:
    """What a batch does for grouped and addressed messages with one statement each: their
    group members are locked (and read) at the start, and what finished is recorded at the end."""

    members: dict[UUID, str]
    finished: list[job_state.Finished]


@dataclass
class _Result:
    outcome: Outcome
    release: bool = False
    """The user's parked messages may go now."""
    held: bool = False
    """The message now holds its user's later messages back (retrying or buried)."""


class DeliveryPipeline:
    """The processor of one route's consumer (see infra/rabbit/consumer.py)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        route: Route,
        handler: Handler,
        policy: RetryPolicy,
        *,
        max_body_bytes: int,
        kill_before_commit: bool = False,
        ttr: float | None = None,
    ) -> None:
        self._pool = pool
        self.route = route
        self.consumer = route.short_name
        self._handler = handler
        self.policy = policy
        self._max_body_bytes = max_body_bytes
        self._kill_before_commit = kill_before_commit
        self.ttr = ttr
        """Seconds a handler may run on one message (None: no limit)."""
        self._release_polled_at = -1e9

    async def __call__(self, raw: RawDelivery) -> Outcome:
        (outcome,) = await self.process_batch([raw])
        return outcome

    async def process_batch(self, raws: Sequence[RawDelivery]) -> list[Outcome]:
        """Decide the fate of deliveries in one transaction; outcomes in delivery order.

        The batch is first applied without savepoints (the common case: nothing fails, and a
        savepoint costs two round trips per message). If any handler raises, that transaction
        is rolled back and the batch is run again with a savepoint per message, so the one that
        fails is retried or buried alone while its neighbours commit. Messages are taken user
        by user (in user_id order, each user's in delivery order), so concurrent batches lock
        users in the same order."""
        try:
            return await self._process_batch(raws, guarded=False)
        except _HandlerFailedError as failed:
            if isinstance(failed.error, TTRExceededError):
                return await self._released(raws, failed.index, failed.error)
            # The handler is not called again for the failure (one call per delivery attempt),
            # unless it was a blip worth retrying at once.
            known = {} if _is_blip(failed.error) else {failed.index: failed.error}
        return await self._guarded(raws, known)

    async def _guarded(
        self, raws: Sequence[RawDelivery], known: dict[int, Exception]
    ) -> list[Outcome]:
        try:
            return await self._process_batch(raws, guarded=True, known=known)
        except _HandlerFailedError as failed:  # only a TTR leaves a guarded run
            return await self._released(raws, failed.index, failed.error, known)

    async def _released(
        self,
        raws: Sequence[RawDelivery],
        index: int,
        error: Exception,
        known: dict[int, Exception] | None = None,
    ) -> list[Outcome]:
        """Delivery `index` ran past the TTR (everything was rolled back). The deliveries before
        it are applied again; it and the ones after it go back to the queue in their places
        (seed 001: [A, B, C], A times out while B is done: the queue is [A, C], not [C, A]).
        After max_attempts strikes it is buried instead (reason `ttr`). `known`: failures this
        delivery attempt already met, recorded again rather than the handler called twice."""
        decoded = decode(self.route, raws[index], max_body_bytes=self._max_body_bytes)
        async with self._connection() as conn, conn.transaction():
            strikes = await _strike(conn, self.consumer, decoded.envelope.message_id)
            await transitions.count_one(conn, self.route.name, "ttr")
        if strikes >= self.policy.max_attempts:
            log.error("ttr_exhausted", strikes=strikes, error=str(error))
            return await self._guarded(raws, {**(known or {}), index: error})
        log.warning(
            "ttr_exceeded_released",
            message_id=str(decoded.envelope.message_id),
            strikes=strikes,
            given_back=len(raws) - index,
            error=str(error),
        )
        earlier = {i: e for i, e in (known or {}).items() if i < index}
        if not index:
            head: list[Outcome] = []
        elif earlier:
            head = await self._guarded(raws[:index], earlier)
        else:
            head = await self.process_batch(raws[:index])
        return head + [Outcome.RELEASED] * (len(raws) - index)

    async def _process_batch(
        self,
        raws: Sequence[RawDelivery],
        *,
        guarded: bool,
        known: dict[int, Exception] | None = None,
    ) -> list[Outcome]:
        """`known`: failures this delivery attempt already met, by index; a guarded run adds
        the ones it meets, so that a later re-run (after a TTR) records them again instead of
        calling their handlers twice."""
        known = {} if known is None else known
        outcomes: list[Outcome | None] = [None] * len(raws)
        ready: list[tuple[int, Decoded]] = []
        bad: list[tuple[int, BadMessageError]] = []
        for index, raw in enumerate(raws):
            try:
                decoded = decode(self.route, raw, max_body_bytes=self._max_body_bytes)
                ready.append((index, decoded))
            except BadMessageError as exc:
                bad.append((index, exc))
        ready.sort(key=lambda item: (str(item[1].envelope.user_id), item[0]))
        to_release: set[UUID] = set()
        async with self._connection() as conn, conn.transaction():
            times = MESSAGE_TIMES.get()
            for index, problem in bad:
                started = time.perf_counter()
                await self._bury(conn, raws[index], problem.reason, problem, attempts=1)
                log.warning(
                    "dead_lettered",
                    route=self.route.name,
                    message_id=raws[index].message_id,
                    reason=problem.reason,
                    error=str(problem),
                )
                outcomes[index] = Outcome.DEAD_LETTERED
                if times is not None:
                    times[index] = time.perf_counter() - started
            ids = [d.envelope.message_id for _, d in ready]
            users = sorted({d.envelope.user_id for _, d in ready if d.envelope.user_id})
            # One statement each for the whole batch: which were applied, which users are held.
            seen = await inbox.seen_many(conn, self.consumer, ids) if ids else set()
            held = await holds.lock_many(conn, self.consumer, users) if users else {}
            now: datetime = await conn.fetchval("SELECT now()")
            claimed: set[UUID] | None = None
            if not guarded:
                # Unguarded, nothing changes a hold mid-batch (a failure aborts the run), so the
                # messages to apply are known now: claim them in the inbox in one statement.
                claimed = await inbox.claim_many(
                    conn,
                    self.consumer,
                    [
                        d.envelope.message_id
                        for _, d in ready
                        if d.envelope.message_id not in seen
                        and _free(held, d.envelope.user_id, d.envelope.message_id)
                        and not _expired(d, now)
                    ],
                )
            # Unguarded, the follow-up events of the whole batch are written in one statement
            # at the end (guarded, each message's are written in its savepoint).
            sink: list[outbox.OutboxMessage] | None = None if guarded else []
            jobs = _BatchJobs(
                await job_state.lock_members(
                    conn, [d.envelope.message_id for _, d in ready if d.envelope.group_id]
                ),
                [],
            )
            for index, decoded in ready:
                started = time.perf_counter()
                envelope = decoded.envelope
                with structlog.contextvars.bound_contextvars(
                    route=self.route.name,
                    message_id=str(envelope.message_id),
                    user_id=str(envelope.user_id) if envelope.user_id else None,
                    trace_id=tracing.trace_id_of(envelope.traceparent),
                ):
                    result = await self._one(
                        conn,
                        now,
                        index,
                        raws[index],
                        decoded,
                        seen,
                        held,
                        known,
                        claimed,
                        sink,
                        jobs,
                    )
                if times is not None:  # this message's own share, for its log line
                    times[index] = time.perf_counter() - started
                outcomes[index] = result.outcome
                if result.release and decoded.envelope.user_id is not None:
                    to_release.add(decoded.envelope.user_id)
            if sink:
                await outbox.enqueue(conn, sink)
            await job_state.finish(conn, jobs.finished)  # addresses done, groups completed
            await transitions.count(conn, _moves(self.route.name, len(raws), outcomes))
        for user in sorted(to_release):
            try:
                await self.release(user)
            except Exception as exc:  # noqa: BLE001  (these deliveries are done; the poll retries)
                log.warning("release_deferred", user_id=str(user), error=repr(exc))
        return [o if o is not None else Outcome.DEAD_LETTERED for o in outcomes]

    async def _one(
        self,
        conn: Conn,
        now: datetime,
        index: int,
        raw: RawDelivery,
        decoded: Decoded,
        seen: set[UUID],
        held: dict[UUID, holds.Hold],
        known: dict[int, Exception],
        claimed: set[UUID] | None,
        sink: list[outbox.OutboxMessage] | None = None,
        jobs: _BatchJobs | None = None,
    ) -> _Result:
        """One decoded message of a batch. `seen` and `held` are kept up to date as it goes.
        `claimed`: the inbox claims made for an unguarded run (None: guarded, claim each in
        its savepoint)."""
        message_id = decoded.envelope.message_id
        user = decoded.envelope.user_id
        hold = held.get(user) if user is not None else None
        if message_id in seen:
            return _Result(Outcome.DUPLICATE, await self._done_with_blocker(conn, message_id, hold))
        if _expired(decoded, now):
            # Not taken within its TTL: never applied, whatever holds its user.
            expired = ExpiredError(decoded.envelope.expires_at)
            await self._bury(conn, raw, "expired", expired, attempts=1, decoded=decoded)
            log.warning("expired", error=str(expired))
            seen.add(message_id)
            return _Result(Outcome.EXPIRED, await self._done_with_blocker(conn, message_id, hold))
        if hold is not None and hold.blocker != message_id:
            await holds.park(
                conn,
                self.consumer,
                hold.user_id,
                message_id,
                self.route.name,
                self.route.message_type,
                raw.body,
                _headers_json(raw),
            )
            return _Result(Outcome.PARKED, release=hold.blocker is None)
        if claimed is None:
            failure = known.get(index)
            try:
                result = await self._attempt(
                    conn,
                    decoded,
                    raw,
                    hold,
                    now=now,
                    failure=failure,
                    met=known,
                    index=index,
                    jobs=jobs,
                )
            except TTRExceededError as exc:
                raise _HandlerFailedError(index, exc) from exc  # give it back in its place
        elif message_id not in claimed:  # another consumer claimed it meanwhile
            result = _Result(Outcome.DUPLICATE)
        else:
            try:
                outcome = await self._apply(conn, decoded, now, claim=False, sink=sink, jobs=jobs)
            except Exception as exc:
                if is_outage(exc):
                    raise
                raise _HandlerFailedError(index, exc) from exc  # run again, guarded
            result = _Result(outcome, await self._done_with_blocker(conn, message_id, hold))
        if result.outcome in (Outcome.ACKED, Outcome.DUPLICATE, Outcome.CANCELLED):
            # Only a message that is done counts as seen: a second copy of one that failed in
            # this batch (a relay re-publish, or a redelivery next to its own retry) must meet
            # the hold it left, not pass as a duplicate and release it.
            seen.add(message_id)
        if user is not None:
            if result.held:  # it failed: the user's next messages in this batch wait behind it
                held[user] = holds.Hold(self.consumer, user, message_id, "retrying")
            elif hold is not None and hold.blocker == message_id:
                held[user] = holds.Hold(self.consumer, user, None, "releasing")
        return result

    async def _attempt(
        self,
        conn: Conn,
        decoded: Decoded,
        raw: RawDelivery,
        hold: holds.Hold | None,
        *,
        now: datetime,
        failure: Exception | None = None,
        met: dict[int, Exception] | None = None,
        index: int = 0,
        jobs: _BatchJobs | None = None,
    ) -> _Result:
        """Apply the message in a savepoint; on failure, retry it later or bury it.
        `failure`: how this attempt already failed (in an unguarded batch): record that.
        `met`: where a new failure is noted, as delivery `index` of its batch."""
        if failure is not None:
            return await self._failed(conn, decoded, raw, hold, failure, now)
        try:
            async for retrying in AsyncRetrying(
                retry=retry_if_exception(_is_blip),
                stop=stop_after_attempt(4),
                wait=wait_random_exponential(multiplier=0.05, max=1.0),
                reraise=True,
            ):
                with retrying:
                    async with conn.transaction():  # a savepoint in the delivery's transaction
                        outcome = await self._apply(conn, decoded, now, jobs=jobs)
        except TTRExceededError:
            raise  # given back to the queue by the caller, not failed
        except Exception as exc:
            if is_outage(exc):
                raise  # not the message's fault: the whole delivery is tried again
            if met is not None:
                met[index] = exc
            return await self._failed(conn, decoded, raw, hold, exc, now)
        message_id = decoded.envelope.message_id
        return _Result(outcome, await self._done_with_blocker(conn, message_id, hold))

    async def _failed(
        self,
        conn: Conn,
        decoded: Decoded,
        raw: RawDelivery,
        hold: holds.Hold | None,
        exc: Exception,
        now: datetime,
    ) -> _Result:
        """The handler failed this attempt: bury a broken domain rule or a `Bury`, retry
        anything else (`Retry` with its own delay)."""
        if isinstance(exc, DomainError | Bury):
            reason = exc.reason if isinstance(exc, Bury) else "domain_rule"
            attempt = decoded.envelope.attempt
            await self._bury(conn, raw, reason, exc, attempts=attempt, decoded=decoded)
            log.warning("dead_lettered", reason=reason, error=str(exc))
            release = await self._done_with_blocker(conn, decoded.envelope.message_id, hold)
            return _Result(Outcome.DEAD_LETTERED, release)
        if isinstance(exc, TTRExceededError):  # struck out: see _released
            return await self._give_up(conn, decoded, raw, exc, "ttr", None)
        delay = exc.delay if isinstance(exc, Retry) else None
        return await self._retry_or_bury(conn, decoded, raw, exc, now, delay=delay, hold=hold)

    async def _apply(
        self,
        conn: Conn,
        decoded: Decoded,
        now: datetime,
        *,
        claim: bool = True,
        sink: list[outbox.OutboxMessage] | None = None,
        jobs: _BatchJobs | None = None,
    ) -> Outcome:
        """Claim the message in the inbox (unless claimed already) and run the handler:
        ACKED, or DUPLICATE (it was applied before), or CANCELLED (a member of a cancelled
        group: the claim is kept, the handler is not run). `jobs`: the batch's group members,
        locked, and where what finished is noted (None: locked and recorded here, alone)."""
        envelope = decoded.envelope
        if claim and not await inbox.claim(conn, self.consumer, envelope.message_id):
            return Outcome.DUPLICATE
        # A group member's row is locked until commit: a cancel waits for this delivery, or
        # this delivery sees the cancel.
        if envelope.group_id is not None:
            state = (
                jobs.members.get(envelope.message_id)
                if jobs is not None
                else await job_state.member_state(conn, envelope.message_id)
            )
            if state == "cancelled":
                log.info("group_member_cancelled", group_id=str(envelope.group_id))
                return Outcome.CANCELLED
        with tracing.consuming(
            self.route.name, str(envelope.message_id), envelope.traceparent
        ) as traceparent:
            traces = MESSAGE_TRACES.get()
            trace_id = tracing.trace_id_of(traceparent)
            if traces is not None and trace_id is not None:  # for the message's log line
                traces[str(envelope.message_id)] = trace_id
            context = HandlerContext(conn, now, envelope, sink, traceparent)
            if self.ttr is None:
                await self._handler(context, decoded.body)
            else:
                deadline = asyncio.timeout(self.ttr)
                try:
                    async with deadline:
                        await self._handler(context, decoded.body)
                except TimeoutError as exc:
                    if deadline.expired():  # ours, not one the handler met on its own
                        raise TTRExceededError(self.ttr) from exc
                    raise
        if envelope.address is not None or envelope.group_id is not None:
            finished = job_state.Finished(
                envelope.message_id, envelope.address, envelope.group_id, ok=True
            )
            if jobs is not None:
                jobs.finished.append(finished)  # recorded once for the batch, at its end
            else:
                await job_state.finish(conn, [finished])
        if self._kill_before_commit:
            os.kill(os.getpid(), signal.SIGKILL)  # crash test: applied, not committed
        return Outcome.ACKED

    async def _done_with_blocker(
        self, conn: Conn, message_id: UUID, hold: holds.Hold | None
    ) -> bool:
        """The message blocks nothing any more: release its hold. True: parked ones may go."""
        if hold is not None and hold.blocker == message_id:
            await holds.release(conn, self.consumer, hold.user_id)
            return True
        return hold is not None and hold.blocker is None

    async def _give_up(
        self,
        conn: Conn,
        decoded: Decoded,
        raw: RawDelivery,
        exc: Exception,
        reason: str,
        first_failed: datetime | None,
    ) -> _Result:
        """Bury a message that used up its attempts; its user's later messages wait behind it
        until an operator replays or discards it."""
        envelope = decoded.envelope
        attempt = envelope.attempt
        info = describe(exc)
        await self._bury(
            conn, raw, reason, exc, attempts=attempt, first_failed_at=first_failed, decoded=decoded
        )
        await self._hold(conn, envelope, "buried", info)
        log.error("dead_lettered", reason=reason, attempts=attempt, error=info.message)
        return _Result(Outcome.DEAD_LETTERED, held=envelope.user_id is not None)

    async def _retry_or_bury(
        self,
        conn: Conn,
        decoded: Decoded,
        raw: RawDelivery,
        exc: Exception,
        now: datetime,
        *,
        delay: float | None = None,
        hold: holds.Hold | None = None,
    ) -> _Result:
        """Schedule the next attempt after `delay` s (None: the policy's backoff), or bury the
        message if this was its last attempt (or its next one would come after its TTL)."""
        envelope = decoded.envelope
        attempt = envelope.attempt
        info = describe(exc)
        headers = jsonable(dict(raw.headers))
        first_failed = _first_failed_at(headers)
        backoff = self.policy.delay_after(attempt)
        user = envelope.user_id
        if backoff is None:
            return await self._give_up(conn, decoded, raw, exc, "max_attempts", first_failed)
        if delay is not None:
            backoff = delay
        delay = backoff
        expires_at = envelope.expires_at
        if expires_at is not None and now + timedelta(seconds=delay) >= expires_at:
            # Its next attempt would come after its TTL: it will never be taken in time.
            expired = ExpiredError(expires_at)
            await self._bury(conn, raw, "expired", expired, attempts=attempt, decoded=decoded)
            log.warning("expired", error=f"next attempt would be after the TTL: {info.message}")
            return _Result(
                Outcome.EXPIRED, await self._done_with_blocker(conn, envelope.message_id, hold)
            )
        retry = outbox.OutboxMessage(
            route=self.route.name,
            message_type=self.route.message_type,
            schema_version=envelope.schema_version,
            body=raw.body,
            user_id=user,
            seq=envelope.seq,
            message_id=envelope.message_id,
            headers=republished_headers(
                headers,
                {
                    H_ATTEMPT: attempt + 1,
                    H_FIRST_FAILED_AT: (first_failed or now).isoformat(),
                    H_LAST_ERROR: f"{info.error_type}: {info.message}"[:500],
                },
            ),
            available_at=now + timedelta(seconds=delay),
            priority=_priority(headers),
            expires_at=envelope.expires_at,
            # A replay starts a new generation of attempts, with retries of its own.
            dedup_key=(
                f"retry:{self.consumer}:{envelope.message_id}:"
                f"{headers.get(H_REPLAY_GENERATION, 0)}:{attempt + 1}"
            ),
        )
        if not await outbox.enqueue(conn, [retry]):
            # This attempt failed before and its retry is already scheduled (a redelivery after
            # a crash before the ack): the hold is as that first failure left it.
            log.info("retry_already_scheduled", attempt=attempt)
            return _Result(Outcome.RETRY_SCHEDULED, held=user is not None)
        await self._hold(conn, envelope, "retrying", info)
        log.warning(
            "retry_scheduled",
            attempt=attempt,
            retry_in_s=round(delay, 3),
            error=f"{info.error_type}: {info.message}",
            at=info.location,
        )
        return _Result(Outcome.RETRY_SCHEDULED, held=user is not None)

    async def _hold(self, conn: Conn, envelope: Envelope, state: str, info: ErrorInfo) -> None:
        """The message holds its user's later messages back while it is `state`."""
        if envelope.user_id is not None:
            await holds.hold(
                conn,
                self.consumer,
                envelope.user_id,
                envelope.message_id,
                state=state,
                attempts=envelope.attempt,
                error=f"{info.error_type}: {info.message}",
            )

    async def _bury(
        self,
        conn: Conn,
        raw: RawDelivery,
        reason: str,
        exc: BaseException,
        *,
        attempts: int,
        first_failed_at: datetime | None = None,
        decoded: Decoded | None = None,
    ) -> None:
        """Store the message in the dead-letter store. Once it decoded, its ids are the
        envelope's (the body's user, the canonical message_id) so that holds match them."""
        info = describe(exc)
        message_id, user_id = raw.message_id, _user_of(raw)
        if decoded is not None:
            message_id, user_id = str(decoded.envelope.message_id), decoded.envelope.user_id
        if isinstance(exc, BadMessageError):
            info = ErrorInfo(info.error_type, exc.detail, f"decode:{reason}", info.traceback)
        headers = jsonable(dict(raw.headers))
        await dead_letters.bury(
            conn,
            dead_letters.NewDeadLetter(
                source="consumer",
                route=self.route.name,
                consumer=self.consumer,
                message_id=message_id,
                user_id=user_id,
                message_type=raw.message_type,
                content_type=raw.content_type,
                body=raw.body,
                headers=headers,
                reason=reason,
                error_type=info.error_type,
                error_message=info.message,
                error_location=info.location,
                traceback=info.traceback,
                attempts=attempts,
                first_failed_at=first_failed_at,
            ),
        )
        address, group = _job_marks(raw, decoded)
        await job_state.finish_failed(
            conn, message_id, address, group, error=f"{reason}: {info.message}"
        )

    async def release(self, user_id: UUID) -> int:
        """Apply the user's parked messages in order while the hold stays released."""
        applied = 0
        while True:
            try:
                if await self._release_one(user_id):
                    applied += 1
                    continue
            except _ParkedTimedOutError as timed_out:
                # Rolled back, so still parked (it is not on the broker): count the strike,
                # and bury it once it has struck out.
                await self._strike_parked(user_id, timed_out.parked, timed_out.raw, timed_out.error)
                return applied
            log.info("hold_released_or_blocked", user_id=str(user_id), applied=applied)
            return applied

    async def _release_one(self, user_id: UUID) -> bool:
        """Apply the user's first parked message. False: none left (the hold is dropped), or
        the hold is blocked again."""
        while True:
            async with self._connection() as conn, conn.transaction():
                hold = await holds.lock(conn, self.consumer, user_id)
                if hold is None or hold.blocker is not None:
                    return False
                parked = await holds.pop_parked(conn, self.consumer, user_id)
                if parked is None:
                    await holds.drop(conn, self.consumer, user_id)
                    return False
                raw = RawDelivery(
                    body=parked.body,
                    message_id=str(parked.message_id),
                    message_type=parked.message_type,
                    content_type=CONTENT_TYPE,
                    timestamp=None,
                    headers=parked.headers,
                )
                try:
                    decoded = decode(self.route, raw, max_body_bytes=self._max_body_bytes)
                except BadMessageError as exc:  # it decoded when parked; a newer pkgq may differ
                    await self._bury(conn, raw, exc.reason, exc, attempts=1)
                    continue
                if await inbox.seen(conn, self.consumer, parked.message_id):
                    continue
                now = await conn.fetchval("SELECT now()")
                if _expired(decoded, now):  # its TTL ran out while it waited
                    expired = ExpiredError(decoded.envelope.expires_at)
                    await self._bury(conn, raw, "expired", expired, attempts=1, decoded=decoded)
                    continue
                try:
                    result = await self._attempt(conn, decoded, raw, hold, now=now)
                except TTRExceededError as exc:
                    raise _ParkedTimedOutError(parked, raw, exc) from exc  # rolls back the pop
                await transitions.count(conn, _moves(self.route.name, 0, [result.outcome]))
                return True

    async def release_pending(self) -> int:
        """Apply what operators released (a discarded blocker) or a crash left half-released.

        One user's trouble does not stop the others: a failing user goes to the back of the
        line (its hold's `updated_at` moves) and is tried again on the next round.

        Every partition consumer of the route calls this when idle; they share this pipeline,
        so it looks at most once a second however many partitions there are."""
        if time.monotonic() - self._release_polled_at < 1.0:
            return 0
        self._release_polled_at = time.monotonic()
        async with self._connection() as conn:
            users = await holds.releasing_users(conn, self.consumer)
        total = 0
        for user in users:
            try:
                total += await self.release(user)
            except Exception as exc:  # noqa: BLE001  (logged; the next round tries again)
                log.warning("release_failed", user_id=str(user), error=repr(exc))
                with contextlib.suppress(Exception):
                    async with self._connection() as conn:
                        await holds.touch(conn, self.consumer, user)
        return total

    async def _strike_parked(
        self, user_id: UUID, parked: holds.ParkedMessage, raw: RawDelivery, exc: TTRExceededError
    ) -> None:
        """A parked message ran past the TTR while being released: the transaction was rolled
        back (it is still parked); count the strike, and bury it once it has struck out."""
        async with self._connection() as conn, conn.transaction():
            strikes = await _strike(conn, self.consumer, parked.message_id)
            await transitions.count_one(conn, self.route.name, "ttr")
            if strikes < self.policy.max_attempts:
                log.warning("ttr_exceeded_parked", user_id=str(user_id), strikes=strikes)
                return
            await holds.lock(conn, self.consumer, user_id)  # the lock order of a delivery
            first = await holds.pop_parked(conn, self.consumer, user_id)
            if first is None or first.message_id != parked.message_id:
                return  # released meanwhile by someone else
            decoded = decode(self.route, raw, max_body_bytes=self._max_body_bytes)
            await self._give_up(conn, decoded, raw, exc, "ttr", None)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Conn]:
        """A pooled connection. Waiting too long for one is an outage (the pool is exhausted or
        the server hangs), to be waited out in place, not a failure of the message."""
        try:
            conn = await self._pool.acquire(timeout=10)
        except TimeoutError as exc:
            raise DatabaseUnavailableError("no Postgres connection within 10 s") from exc
        try:
            yield conn
        finally:
            await self._pool.release(conn)


class _ParkedTimedOutError(Exception):
    def __init__(
        self, parked: holds.ParkedMessage, raw: RawDelivery, error: TTRExceededError
    ) -> None:
        super().__init__(str(error))
        self.parked = parked
        self.raw = raw
        self.error = error


class ExpiredError(Exception):
    """The message was delivered after its TTL ran out."""

    def __init__(self, expires_at: datetime | None) -> None:
        super().__init__(f"delivered after its TTL ran out at {expires_at}")


def _expired(decoded: Decoded, now: datetime) -> bool:
    expires_at = decoded.envelope.expires_at
    return expires_at is not None and expires_at <= now


def _moves(
    route: str, taken: int, outcomes: Sequence[Outcome | None]
) -> dict[tuple[str, str], int]:
    """Transition counts of a batch (bury and ttl are counted by a trigger on the store)."""
    acked = sum(1 for o in outcomes if o is Outcome.ACKED)
    released = sum(1 for o in outcomes if o is Outcome.RETRY_SCHEDULED)
    return {(route, "take"): taken, (route, "ack"): acked, (route, "release"): released}


async def _strike(conn: Conn, consumer: str, message_id: UUID) -> int:
    strikes: int = await conn.fetchval(
        """
        INSERT INTO telecom.ttr_strikes (consumer, message_id) VALUES ($1, $2)
        ON CONFLICT (consumer, message_id)
            DO UPDATE SET strikes = ttr_strikes.strikes + 1, last_at = now()
        RETURNING strikes
        """,
        consumer,
        message_id,
    )
    return strikes


def _priority(headers: dict[str, Any]) -> int:
    value = headers.get(H_PRIORITY, 0)
    return value if isinstance(value, int) and 0 <= value <= 2 else 0


def _job_marks(raw: RawDelivery, decoded: Decoded | None) -> tuple[str | None, UUID | None]:
    """The address and group of a message (from its headers when it did not decode)."""
    if decoded is not None:
        return decoded.envelope.address, decoded.envelope.group_id
    return job_marks(raw.headers)


def _free(held: dict[UUID, holds.Hold], user: UUID | None, message_id: UUID) -> bool:
    """Whether the message may be applied now: its user is not held behind another one."""
    hold = held.get(user) if user is not None else None
    return hold is None or hold.blocker == message_id


def _user_of(raw: RawDelivery) -> UUID | None:
    value = raw.headers.get(H_USER_ID)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    try:
        return UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def _headers_json(raw: RawDelivery) -> str:
    return json.dumps(jsonable(dict(raw.headers)))


def _first_failed_at(headers: dict[str, Any]) -> datetime | None:
    value = headers.get(H_FIRST_FAILED_AT)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
