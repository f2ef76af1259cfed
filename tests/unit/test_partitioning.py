"""A user's partition: stable, documented, and the same wherever it is computed."""

from __future__ import annotations

import zlib
from uuid import UUID, uuid4

import pytest
from pydantic import ValidationError

from events.partitioning import partition_key, partition_of, route_of_key, routing_key
from infra.settings import Settings


def test_the_partition_is_the_crc32_of_the_uuid_bytes_modulo_the_count() -> None:
    user = UUID("8f6f7c1e-3d4e-4c1a-9d62-0b7f2c1f5a10")
    assert partition_of(user, 4) == zlib.crc32(user.bytes) % 4
    assert partition_of(UUID(int=0), 7) == 0xECBB4B55 % 7  # CRC-32 of 16 zero bytes


def test_a_users_partition_never_changes_for_a_given_count() -> None:
    users = [uuid4() for _ in range(200)]
    assert [partition_of(u, 8) for u in users] == [partition_of(u, 8) for u in users]


def test_users_spread_over_every_partition() -> None:
    seen = {partition_of(uuid4(), 4) for _ in range(400)}
    assert seen == {0, 1, 2, 3}


def test_one_partition_keeps_the_plain_route_key_and_several_add_a_suffix() -> None:
    user = uuid4()
    assert routing_key("telecom.usage_record", user, 1) == "telecom.usage_record"
    assert routing_key("telecom.usage_record", None, 4) == "telecom.usage_record.p0"
    assert partition_key("telecom.usage_record", 3, 4) == "telecom.usage_record.p3"


@pytest.mark.parametrize(
    ("key", "route"),
    [
        ("telecom.usage_record.p3", "telecom.usage_record"),
        ("telecom.usage_record", "telecom.usage_record"),
        ("telecom.usage_record.prod", "telecom.usage_record.prod"),
        ("p12", "p12"),
    ],
)
def test_the_route_of_a_partition_key_drops_only_a_numeric_partition_suffix(
    key: str, route: str
) -> None:
    assert route_of_key(key) == route


def test_partition_counts_are_checked_against_the_route_table_and_bounds() -> None:
    assert (
        Settings(partitions={"telecom.usage_record": 4}).partitions_for("telecom.usage_record") == 4
    )
    assert Settings().partitions_for("telecom.usage_record") == 1
    with pytest.raises(ValidationError, match="unknown route"):
        Settings(partitions={"telecom.nope": 2})
    with pytest.raises(ValidationError, match=r"1\.\.256"):
        Settings(partitions={"telecom.usage_record": 0})


def test_a_replica_prefers_the_partitions_its_index_selects() -> None:
    replica = Settings(replica="1/3")
    assert [p for p in range(7) if replica.preferred(p)] == [1, 4]
    assert all(Settings().preferred(p) for p in range(4))
    with pytest.raises(ValidationError):
        Settings(replica="one of three")
