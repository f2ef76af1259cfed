"""The benchmark's pure helpers: how a backlog is spread over users, how statements are tallied."""

from __future__ import annotations

from collections import Counter

import pytest

from devtools.bench.support import backlog_rounds, statement_kinds


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
