"""The benchmark's helpers: how a backlog is spread over users, how statements are tallied, how
a consumer's CPU is read and reported."""

from __future__ import annotations

import math
import os
import time
from collections import Counter

import pytest

from devtools.bench.drain import POLL, POLL_FAR, DrainResult, next_check_in
from devtools.bench.support import backlog_rounds, cpu_seconds, statement_kinds


@pytest.mark.parametrize(
    ("users", "records"), [(1000, 20_000), (100, 2_050), (7, 3), (1, 5), (3, 3)]
)
def test_a_backlog_gives_each_user_its_share_and_no_user_two_records_in_one_round(
    users: int, records: int
) -> None:
    rounds = backlog_rounds(users, records)
    assert sum(rounds) == records
    assert all(0 < size <= users for size in rounds)  # a round sends a user at most one
    per_user = Counter(u for size in rounds for u in range(size))
    assert max(per_user.values()) - min(per_user.values()) <= 1
    assert per_user == Counter(j % users for j in range(records))


def test_statements_are_tallied_by_their_first_keyword_most_frequent_first() -> None:
    kinds = statement_kinds(
        [
            "BEGIN;",
            "SELECT user_id FROM telecom.queue_users WHERE user_id = ANY($1::uuid[]) FOR UPDATE",
            "INSERT INTO telecom.inbox (consumer, message_id) SELECT $1, m FROM unnest($2)",
            "select 1",
            "(SELECT 1) UNION (SELECT 2)",
            "WITH x AS (SELECT 1) UPDATE telecom.package_queue SET upload = 0",
            "COMMIT;",
            "",
        ]
    )
    assert kinds == {"SELECT": 3, "BEGIN": 1, "INSERT": 1, "WITH": 1, "COMMIT": 1, "?": 1}
    assert next(iter(kinds)) == "SELECT"
    assert statement_kinds([]) == {}


def test_a_process_cpu_is_read_from_proc_and_grows_as_it_works() -> None:
    before = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    after = cpu_seconds(os.getpid())
    # /proc counts in clock ticks (10 ms), sampled: 0.2 s of work can read a tick or two less,
    # and 35.14 - 35.1 is a hair under 0.04 in floating point (it failed so with 0.05 s).
    assert after - before >= 0.15
    assert math.isnan(cpu_seconds(2**22 + 1))  # above Linux's highest pid: no such process


def test_a_drain_reports_its_cpu_per_record_and_its_share_of_a_core_or_says_it_is_unknown() -> None:
    drained = DrainResult("pkgq", records=20_000, seconds=2.5, cpu_seconds=2.0)
    assert drained.cpu() == "CPU 100 µs/record, 80% of a core"
    assert DrainResult("broker", records=10, seconds=1.0).cpu() == "CPU unknown"


def test_a_drain_is_checked_every_poll_once_its_queues_are_empty_and_less_often_before() -> None:
    # At 4,000 records/s at the fastest: 20,000 waiting would take 5 s, so the cap; 400, 0.1 s.
    assert next_check_in(20_000, 4_000.0) == POLL_FAR
    assert next_check_in(400, 4_000.0) == pytest.approx(0.05)
    assert next_check_in(40, 4_000.0) == POLL
    # Nothing waits any more: the end can come at any moment.
    assert next_check_in(0, 4_000.0) == POLL
    # No rate seen yet (the first check, or nothing taken between two): POLL.
    assert next_check_in(20_000, 0.0) == POLL


def test_a_drain_that_doubles_its_fastest_rate_is_still_checked_before_its_queues_empty() -> None:
    # Checks at the pauses next_check_in gives, the queues emptying at twice the fastest rate
    # seen: a check still comes while messages wait, so the last stretch is checked every POLL.
    fastest, waiting, checked_while_waiting = 1_000.0, 2_000.0, 0
    while waiting > 0:
        pause = next_check_in(int(waiting), fastest)
        waiting -= 2 * fastest * pause * 0.99
        checked_while_waiting += waiting > 0
    assert checked_while_waiting >= 3
    assert next_check_in(int(max(waiting, 0)), fastest) == POLL
