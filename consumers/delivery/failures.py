"""The failure stage: what becomes of a message its handler could not apply.

- a broken domain rule or a `Bury` from the handler: buried at once, holding nothing back;
- anything else (`Retry` with its own delay): the same message is scheduled again through the
  outbox at now + backoff(attempt), and the user's later
  messages are held behind it; after the policy's last attempt (or when the next attempt would
  come after its TTL) it is buried, and a buried message keeps holding its user until an
  operator replays or discards it.
Every statement here runs in the delivery's transaction: a rollback undoes the verdict too.

The attempt is the count in Postgres (infra/postgres/attempts.py), one more per failure of the
message in its replay generation; `x-attempt` on a retry is for people to read, and is never
believed, since whoever publishes can set it.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import structlog

from consumers.handler_errors import Bury, Retry, TTRExceededError
from consumers.retry_policy import RetryPolicy
from domain.errors import DomainError
from events.decoding import BadMessageError, Decoded, RawDelivery
from events.envelope import (
    H_ATTEMPT,
    H_FIRST_FAILED_AT,
    H_LAST_ERROR,
    H_PRIORITY,
    H_REPLAY_GENERATION,
    H_USER_ID,
    Envelope,
    header_text,
    job_marks,
    jsonable,
    republished_headers,
)
from events.routes import UNTRUSTED_PUBLISHER, Route
from infra.postgres import attempts, dead_letters, holds, job_state, outbox
from infra.postgres.pool import Conn
from infra.rabbit.outcomes import Outcome

log = structlog.get_logger(__name__)

ROOT = Path(__file__).resolve().parent.parent.parent


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


class ExpiredError(Exception):
    """The message was delivered after its TTL ran out."""

    def __init__(self, expires_at: datetime | None) -> None:
        super().__init__(f"delivered after its TTL ran out at {expires_at}")


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    drain: bool = False
    """The user's parked messages may go now (their hold was lifted)."""
    holds_user: bool = False
    """The message now holds its user's later messages back (retrying or buried)."""


class Failures:
    """The failure policy of one route's consumer."""

    def __init__(self, route: Route, policy: RetryPolicy) -> None:
        self.route = route
        self.consumer = route.short_name
        self.policy = policy

    async def failed(
        self,
        conn: Conn,
        decoded: Decoded,
        raw: RawDelivery,
        hold: holds.Hold | None,
        exc: Exception,
        now: datetime,
    ) -> Verdict:
        """The handler failed this attempt: bury a broken domain rule or a `Bury`, retry
        anything else (`Retry` with its own delay)."""
        envelope = decoded.envelope
        attempt = await attempts.count_failure(
            conn, self.consumer, envelope.message_id, _generation(raw.headers), envelope.attempt
        )
        if isinstance(exc, DomainError | Bury):
            reason = exc.reason if isinstance(exc, Bury) else "domain_rule"
            await self.bury(conn, raw, reason, exc, attempts=attempt, decoded=decoded)
            log.warning("dead_lettered", reason=reason, error=str(exc))
            drain = await self.done_with_blocker(conn, decoded.envelope.message_id, hold)
            return Verdict(Outcome.DEAD_LETTERED, drain)
        if isinstance(exc, TTRExceededError):  # struck out: see the pipeline's TTR loop
            return await self.give_up(conn, decoded, raw, exc, "ttr", None, attempt)
        delay = exc.delay if isinstance(exc, Retry) else None
        return await self._retry_or_bury(
            conn, decoded, raw, exc, now, attempt, delay=delay, hold=hold
        )

    async def expired(
        self, conn: Conn, decoded: Decoded, raw: RawDelivery, hold: holds.Hold | None
    ) -> Verdict:
        """Not taken within its TTL: never applied, whatever holds its user."""
        error = ExpiredError(decoded.envelope.expires_at)
        await self.bury(conn, raw, "expired", error, attempts=1, decoded=decoded)
        log.warning("expired", error=str(error))
        drain = await self.done_with_blocker(conn, decoded.envelope.message_id, hold)
        return Verdict(Outcome.EXPIRED, drain)

    async def give_up(
        self,
        conn: Conn,
        decoded: Decoded,
        raw: RawDelivery,
        exc: Exception,
        reason: str,
        first_failed: datetime | None,
        attempt: int,
    ) -> Verdict:
        """Bury a message that used up its attempts; its user's later messages wait behind it
        until an operator replays or discards it."""
        envelope = decoded.envelope
        info = describe(exc)
        await self.bury(
            conn, raw, reason, exc, attempts=attempt, first_failed_at=first_failed, decoded=decoded
        )
        await self._hold(conn, envelope, "buried", info, attempt)
        log.error("dead_lettered", reason=reason, attempts=attempt, error=info.message)
        return Verdict(Outcome.DEAD_LETTERED, holds_user=envelope.user_id is not None)

    async def _retry_or_bury(
        self,
        conn: Conn,
        decoded: Decoded,
        raw: RawDelivery,
        exc: Exception,
        now: datetime,
        attempt: int,
        *,
        delay: float | None,
        hold: holds.Hold | None,
    ) -> Verdict:
        """Schedule the next attempt after `delay` s (None: the policy's backoff), or bury the
        message if this was its last attempt (or its next one would come after its TTL)."""
        envelope = decoded.envelope
        info = describe(exc)
        headers = jsonable(dict(raw.headers))
        first_failed = _first_failed_at(headers)
        backoff = self.policy.delay_after(attempt)
        user = envelope.user_id
        if backoff is None:
            return await self.give_up(
                conn, decoded, raw, exc, "max_attempts", first_failed, attempt
            )
        wait = backoff if delay is None else delay
        expires_at = envelope.expires_at
        if expires_at is not None and now + timedelta(seconds=wait) >= expires_at:
            # Its next attempt would come after its TTL: it will never be taken in time.
            expired = ExpiredError(expires_at)
            await self.bury(conn, raw, "expired", expired, attempts=attempt, decoded=decoded)
            log.warning("expired", error=f"next attempt would be after the TTL: {info.message}")
            drain = await self.done_with_blocker(conn, envelope.message_id, hold)
            return Verdict(Outcome.EXPIRED, drain)
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
            available_at=now + timedelta(seconds=wait),
            priority=_priority(headers),
            expires_at=envelope.expires_at,
            # A replay starts a new generation of attempts, with retries of its own.
            dedup_key=(
                f"retry:{self.consumer}:{envelope.message_id}:"
                f"{_generation(raw.headers)}:{attempt + 1}"
            ),
        )
        if not await outbox.enqueue(conn, [retry]):
            # This attempt failed before and its retry is already scheduled (a redelivery after
            # a crash before the ack): the hold is as that first failure left it.
            log.info("retry_already_scheduled", attempt=attempt)
            return Verdict(Outcome.RETRY_SCHEDULED, holds_user=user is not None)
        await self._hold(conn, envelope, "retrying", info, attempt)
        log.warning(
            "retry_scheduled",
            attempt=attempt,
            retry_in_s=round(wait, 3),
            error=f"{info.error_type}: {info.message}",
            at=info.location,
        )
        return Verdict(Outcome.RETRY_SCHEDULED, holds_user=user is not None)

    async def done_with_blocker(
        self, conn: Conn, message_id: UUID, hold: holds.Hold | None
    ) -> bool:
        """The message blocks nothing any more: lift its hold. True: parked ones may go."""
        if hold is not None and hold.blocker == message_id:
            await holds.lift(conn, self.consumer, hold.user_id)
            return True
        return hold is not None and hold.blocker is None

    async def _hold(
        self, conn: Conn, envelope: Envelope, state: str, info: ErrorInfo, attempt: int
    ) -> None:
        """The message holds its user's later messages back while it is `state`."""
        if envelope.user_id is not None:
            await holds.hold(
                conn,
                self.consumer,
                envelope.user_id,
                envelope.message_id,
                state=state,
                attempts=attempt,
                error=f"{info.error_type}: {info.message}",
            )

    async def bury(
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
        if reason == UNTRUSTED_PUBLISHER:
            return  # its address and group headers are an outsider's word: no job fails by it
        address, group = (
            (decoded.envelope.address, decoded.envelope.group_id)
            if decoded is not None
            else job_marks(raw.headers)
        )
        await job_state.finish_failed(
            conn, message_id, address, group, error=f"{reason}: {info.message}"
        )


def _generation(headers: Any) -> int:
    """The replay generation a message is in (set by `pkgq dlq dig`); 0 if none or unreadable."""
    value = headers.get(H_REPLAY_GENERATION, 0)
    readable = isinstance(value, int) and not isinstance(value, bool)
    return value if readable and 0 <= value < 2**31 else 0


def _priority(headers: dict[str, Any]) -> int:
    value = headers.get(H_PRIORITY, 0)
    return value if isinstance(value, int) and 0 <= value <= 2 else 0


def _user_of(raw: RawDelivery) -> UUID | None:
    value = header_text(raw.headers, H_USER_ID, 64)
    try:
        return UUID(value) if value is not None else None
    except ValueError:
        return None


def _first_failed_at(headers: dict[str, Any]) -> datetime | None:
    value = headers.get(H_FIRST_FAILED_AT)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
