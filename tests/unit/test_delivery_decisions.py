"""The pure decisions of domain/delivery.py and the error kinds of consumers/delivery/errors.py.

No I/O: a Gate over a snapshot made up here, the handler's result drawn by hypothesis.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.delivery.errors import failure_of
from consumers.handler_errors import Bury, Retry, TTRExceededError
from domain.delivery import DONE, Decision, ErrorKind, Facts, Failure, Fate, Gate, Hold, Source
from domain.errors import NegativeUsageError
from events.decoding import BadMessageError

NOW = datetime(2026, 11, 25, tzinfo=UTC)
MAX_ATTEMPTS = 4


def backoff(attempt: int) -> float | None:
    return None if attempt >= MAX_ATTEMPTS else 30.0


def failure(kind: ErrorKind) -> Failure:
    reason = {ErrorKind.RULE: "domain_rule", ErrorKind.PERMANENT: "data_error"}.get(
        kind, "handler_error"
    )
    return Failure(kind, reason, "Error", "injected")


kinds = st.sampled_from([*(k for k in ErrorKind if k is not ErrorKind.NEWER), None])
"""Every kind of failure that counts (a newer version never does: tested on its own below)."""


@given(results=st.lists(kinds, min_size=1, max_size=12), attempts=st.integers(0, 3))
def test_every_failure_moves_the_count_by_one_or_buries_and_nothing_follows_the_end(
    results: list[ErrorKind | None], attempts: int
) -> None:
    user, message = uuid4(), uuid4()
    gate = Gate(NOW, Source.QUEUE, set(), {}, {message: attempts} if attempts else {})
    facts = Facts(0, message, user)
    count, ended = attempts, False
    for kind in results:
        decision = gate.admit(facts)
        if decision is not None and decision.fate is Fate.PARKED:
            # Only behind a lifted hold (a buried copy of it lifted by a later one): with
            # nothing else parked, the writer drops it (holds.drop_lifted).
            assert gate.holds[user].blocker is None
            del gate.holds[user]
            decision = gate.admit(facts)
        if ended:
            # Applied (a duplicate now), or buried (its copy is the blocker: let through).
            assert decision is None or decision.fate is Fate.DUPLICATE
            if decision is not None:
                continue
        assert decision is None
        decision = gate.decide(facts, failure(kind) if kind else None, backoff)
        gate.note(facts, decision)
        if kind is None:
            assert decision.fate is Fate.ACKED
            assert not decision.counted
            ended = True
            continue
        assert decision.counted
        assert decision.attempt == count + 1
        count += 1
        assert gate.attempts[message] == count
        if decision.fate is Fate.RETRIED:
            assert kind is ErrorKind.HANDLER
            assert count < MAX_ATTEMPTS
            assert decision.retry_at == NOW + timedelta(seconds=30)
            assert gate.holds[user] == Hold(message, "retrying")
        else:
            assert decision.fate is Fate.DEAD_LETTERED
            assert decision.reason == (
                "max_attempts" if kind is ErrorKind.HANDLER else failure(kind).reason
            )
            held = kind is not ErrorKind.RULE
            assert (decision.holds == "buried") is held


def newer(delay: float = 30.0, limit: int | None = None) -> Failure:
    return Failure(
        ErrorKind.NEWER, "newer_version", "NewerVersionError", "x", delay=delay, limit=limit
    )


@given(limit=st.integers(1, 60), before=st.integers(0, 5))
def test_a_newer_version_is_deferred_holding_its_user_then_buried_as_unknown_version_at_its_limit(
    limit: int, before: int
) -> None:
    """Each deferral is counted; the one past the limit buries it as unknown_version, its user
    held behind it (a buried blocker, which an operator replays once the new pkgq runs): no
    header keeps a user held for ever."""
    user, message = uuid4(), uuid4()
    gate = Gate(NOW, Source.QUEUE, set(), {}, {message: before} if before else {})
    facts = Facts(0, message, user)
    for deferral in range(before + 1, limit + 1):
        if gate.holds.get(user) is not None:
            gate.holds[user] = Hold(message, "retrying")  # its retry comes back as the blocker
        assert gate.admit(facts) is None
        decision = gate.decide(facts, newer(12.5, limit), backoff)
        gate.note(facts, decision)
        assert decision.fate is Fate.RETRIED
        assert decision.counted
        assert decision.attempt == deferral
        assert decision.retry_at == NOW + timedelta(seconds=12.5)
        assert gate.holds[user] == Hold(message, "retrying")
    last = gate.decide(facts, newer(12.5, limit), backoff)
    assert (last.fate, last.reason, last.holds) == (Fate.DEAD_LETTERED, "unknown_version", "buried")
    assert last.attempt == max(limit, before) + 1
    assert last.counted


def test_a_newer_version_whose_next_try_would_come_after_its_ttl_expires() -> None:
    facts = Facts(0, uuid4(), uuid4(), expires_at=NOW + timedelta(seconds=10))
    decision = Gate(NOW, Source.QUEUE, set(), {}).decide(facts, newer(30), backoff)
    assert (decision.fate, decision.reason) == (Fate.EXPIRED, "expired")
    assert decision.holds is None


def test_a_newer_version_of_no_known_user_is_retried_without_holding_anyone() -> None:
    gate = Gate(NOW, Source.QUEUE, set(), {})
    decision = gate.decide(Facts(0, uuid4(), None), newer(), backoff)
    assert decision.fate is Fate.RETRIED
    assert decision.holds is None


def test_a_later_message_of_a_held_user_is_parked_behind_the_blocker_and_goes_once_lifted() -> None:
    user, blocker, later = uuid4(), uuid4(), uuid4()
    gate = Gate(NOW, Source.QUEUE, set(), {user: Hold(blocker, "retrying")})
    parked = gate.admit(Facts(1, later, user))
    assert parked is not None
    assert (parked.fate, parked.behind) == (Fate.PARKED, blocker)
    applied = gate.decide(Facts(0, blocker, user), None, backoff)
    assert applied.lifts
    gate.note(Facts(0, blocker, user), applied)
    assert gate.holds[user] == Hold(None, "releasing")
    # From the queue, a lifted hold still queues arrivals behind the parked ones ...
    behind = gate.admit(Facts(2, uuid4(), user))
    assert behind is not None
    assert behind.fate is Fate.PARKED
    # ... and the drain (from the parking lot) lets them go.
    drain = Gate(NOW, Source.PARKING, set(), {user: Hold(None, "releasing")})
    assert drain.admit(Facts(1, later, user)) is None


def test_duplicate_expired_and_cancelled_are_decided_without_the_handler() -> None:
    user, seen, late, cancelled = uuid4(), uuid4(), uuid4(), uuid4()
    gate = Gate(NOW, Source.QUEUE, {seen}, {})
    duplicate = gate.admit(Facts(0, seen, user))
    expired = gate.admit(Facts(1, late, user, expires_at=NOW))
    member = gate.admit(Facts(2, cancelled, user, cancelled_member=True))
    assert [d.fate if d else None for d in (duplicate, expired, member)] == [
        Fate.DUPLICATE,
        Fate.EXPIRED,
        Fate.CANCELLED,
    ]
    assert expired is not None
    assert expired.failure is not None
    assert {Fate.DUPLICATE, Fate.EXPIRED, Fate.CANCELLED} <= DONE


def test_a_retry_that_would_come_after_the_ttl_is_expired_instead() -> None:
    facts = Facts(0, uuid4(), uuid4(), expires_at=NOW + timedelta(seconds=10))
    decision = Gate(NOW, Source.QUEUE, set(), {}).decide(facts, failure(ErrorKind.HANDLER), backoff)
    assert (decision.fate, decision.reason, decision.holds) == (Fate.EXPIRED, "expired", None)


def test_errors_are_sorted_by_kind() -> None:
    permanent = [
        asyncpg.exceptions.NumericValueOutOfRangeError("bigint out of range"),
        asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence: 0x00"),
        asyncpg.exceptions.NotNullViolationError("null value"),
        asyncpg.exceptions.CheckViolationError("check"),
        asyncpg.exceptions.DataError("invalid input for query argument $1"),
    ]
    assert {failure_of(e).kind for e in permanent} == {ErrorKind.PERMANENT}
    assert {failure_of(e).reason for e in permanent} == {"data_error"}
    rule = failure_of(NegativeUsageError(-1, 0))
    assert (rule.kind, rule.reason) == (ErrorKind.RULE, "domain_rule")
    bury = failure_of(Bury("needs_a_human"))
    assert (bury.kind, bury.reason) == (ErrorKind.RULE, "needs_a_human")
    bad = failure_of(BadMessageError("schema_invalid", "amount: not a number"))
    assert (bad.kind, bad.reason, bad.message) == (
        ErrorKind.RULE,
        "schema_invalid",
        "amount: not a number",
    )
    assert failure_of(TTRExceededError(1.0)).kind is ErrorKind.TTR
    retry = failure_of(Retry(delay=5))
    assert (retry.kind, retry.delay) == (ErrorKind.HANDLER, 5)
    assert failure_of(asyncpg.exceptions.UniqueViolationError("dup")).kind is ErrorKind.HANDLER
    assert failure_of(RuntimeError("boom")).kind is ErrorKind.HANDLER


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_only_a_handlers_own_failure_counts_against_its_route(kind: ErrorKind) -> None:
    """What a circuit breaker judges a route by: a handler error or a TTR (retried, buried at
    its last attempt), never what the message itself brought (bad input, a domain rule, a data
    error its values cause, an unknown version, its TTL)."""
    facts = Facts(0, uuid4(), uuid4())
    failure = Failure(kind, "why", "Error", "x", limit=0 if kind is ErrorKind.NEWER else None)
    decision = Gate(NOW, Source.QUEUE, set(), {}).decide(facts, failure, backoff)
    assert decision.counts_against_route is (kind in (ErrorKind.HANDLER, ErrorKind.TTR))
    assert Decision(Fate.UNDECIDED).counts_against_route  # not even recorded: an outage
    assert not Decision(Fate.ACKED).counts_against_route
