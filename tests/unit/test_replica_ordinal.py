"""A StatefulSet pod's ordinal becomes its `--replica I/N` (PKGQ_REPLICA_COUNT, with the index
from the downward API's pod-index label or the host name)."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from infra.settings import Settings, replica_ordinal


def test_the_index_from_the_environment_wins_over_the_host_name() -> None:
    assert replica_ordinal("3", "pkgq-usage-record-1") == 3


def test_an_empty_index_falls_back_to_the_host_names_trailing_ordinal() -> None:
    assert replica_ordinal("", "pkgq-usage-record-12") == 12
    assert replica_ordinal(None, "pkgq-usage-record-0") == 0


def test_a_host_name_without_an_ordinal_is_refused_with_what_to_set() -> None:
    with pytest.raises(ValueError, match="PKGQ_REPLICA_INDEX is unset"):
        replica_ordinal(None, "worker.example.com")


def test_a_non_numeric_index_is_refused() -> None:
    with pytest.raises(ValueError, match="not a number"):
        replica_ordinal("two", "pkgq-0")


def test_replica_count_and_index_make_the_replica_setting() -> None:
    assert Settings(replica_count=4, replica_index="2").replica == "2/4"
    assert Settings(replica_count=4, replica_index="2").preferred(6)
    assert not Settings(replica_count=4, replica_index="2").preferred(1)


def test_an_explicit_replica_wins_over_the_ordinal() -> None:
    assert Settings(replica="1/2", replica_count=4, replica_index="3").replica == "1/2"


def test_an_ordinal_beyond_the_count_is_refused() -> None:
    with pytest.raises(ValidationError, match="not below PKGQ_REPLICA_COUNT 2"):
        Settings(replica_count=2, replica_index="2")


def test_without_a_count_the_ordinal_is_not_used() -> None:
    assert Settings(replica_index="1").replica is None


def test_the_host_name_gives_the_index_when_the_environment_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "pkgq-usage-record-1")
    assert Settings(replica_count=2).replica == "1/2"
