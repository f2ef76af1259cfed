"""Rendezvous assignment of a route's partitions to its live replicas (domain/assignment.py):
every replica computes the same owner, every partition has exactly one, and a join or a leave
moves only the partitions it must (about 1/N of them)."""

from __future__ import annotations

import hashlib
from uuid import UUID

from hypothesis import given
from hypothesis import strategies as st

from domain.assignment import assign, moved, owned_by, owner, weight

ROUTE = "telecom.usage_record"
replica_ids = st.uuids().map(str)
replica_sets = st.sets(replica_ids, min_size=1, max_size=12)
counts = st.integers(min_value=1, max_value=64)


@given(replicas=replica_sets, partitions=counts)
def test_every_partition_has_exactly_one_owner_among_the_live_replicas(
    replicas: set[str], partitions: int
) -> None:
    assignment = assign(ROUTE, partitions, replicas)
    assert sorted(assignment) == list(range(partitions))
    assert set(assignment.values()) <= replicas
    shares = [owned_by(ROUTE, partitions, replicas, r) for r in replicas]
    assert sum(len(s) for s in shares) == partitions
    assert frozenset().union(*shares) == frozenset(range(partitions))


@given(replicas=replica_sets, partitions=counts)
def test_the_assignment_does_not_depend_on_the_order_replicas_are_listed_in(
    replicas: set[str], partitions: int
) -> None:
    listed = sorted(replicas)
    assert assign(ROUTE, partitions, listed) == assign(ROUTE, partitions, reversed(listed))


@given(replicas=replica_sets, newcomer=replica_ids, partitions=counts)
def test_a_joining_replica_takes_partitions_only_for_itself(
    replicas: set[str], newcomer: str, partitions: int
) -> None:
    before = assign(ROUTE, partitions, replicas)
    after = assign(ROUTE, partitions, replicas | {newcomer})
    assert all(after[k] == newcomer for k in moved(before, after))


@given(replicas=st.sets(replica_ids, min_size=2, max_size=12), partitions=counts, data=st.data())
def test_a_leaving_replica_moves_only_its_own_partitions(
    replicas: set[str], partitions: int, data: st.DataObject
) -> None:
    leaving = data.draw(st.sampled_from(sorted(replicas)))
    before = assign(ROUTE, partitions, replicas)
    after = assign(ROUTE, partitions, replicas - {leaving})
    assert moved(before, after) == frozenset(k for k, who in before.items() if who == leaving)


def test_a_join_or_a_leave_moves_about_one_nth_of_the_partitions() -> None:
    # 1,024 partitions over 4 then 5 replicas: the newcomer's fair share is 1/5 (about 205);
    # with rendezvous hashing it takes that, give or take the hash's spread.
    replicas = {str(UUID(int=i)) for i in range(1, 5)}
    newcomer = str(UUID(int=99))
    before = assign(ROUTE, 1024, replicas)
    after = assign(ROUTE, 1024, replicas | {newcomer})
    joined = len(moved(before, after))
    assert 150 < joined < 260, joined
    left = len(moved(after, before))
    assert left == joined  # leaving again moves back exactly those


def test_partitions_spread_over_every_replica() -> None:
    replicas = {str(UUID(int=i)) for i in range(1, 4)}
    shares = [len(owned_by(ROUTE, 256, replicas, r)) for r in replicas]
    assert all(50 < share < 120 for share in shares), shares


def test_the_weight_is_stable_across_processes_and_versions() -> None:
    # BLAKE2b, not hash(): the same number on every machine (pinned here).
    assert weight(ROUTE, 3, "a") == weight(ROUTE, 3, "a")
    assert weight(ROUTE, 3, "a") != weight(ROUTE, 4, "a")
    assert weight("r", 0, "x") == int.from_bytes(
        hashlib.blake2b(b"r\x000\x00x", digest_size=8).digest(), "big"
    )


def test_no_replicas_means_no_owner() -> None:
    assert assign(ROUTE, 4, []) == {}
    assert owner(ROUTE, 0, []) is None


def test_a_replica_counts_itself_even_before_it_is_listed() -> None:
    assert owned_by(ROUTE, 4, [], "me") == frozenset(range(4))
