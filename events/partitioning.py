"""Which partition of a route a user's messages go to.

A route split into P partitions has one queue per partition; all of a user's messages on the
route go to the same one, so they stay in order while P consumers share the route's work.

partition = CRC-32 (the zlib/PNG polynomial) of the user_id's 16 bytes (big-endian, as in
RFC 4122), modulo P. It is the same in every language: Go `crc32.ChecksumIEEE(u[:])`, Java
`java.util.zip.CRC32` over the UUID's bytes. With P = 1 the routing key is the route itself;
otherwise it is `<route>.p<partition>`.
"""

from __future__ import annotations

import zlib
from uuid import UUID


def partition_of(user_id: UUID | None, partitions: int) -> int:
    if partitions <= 1 or user_id is None:
        return 0
    return zlib.crc32(user_id.bytes) % partitions


def partition_key(route_name: str, partition: int, partitions: int) -> str:
    """The routing key (and binding key) of one partition of a route."""
    return route_name if partitions <= 1 else f"{route_name}.p{partition}"


def routing_key(route_name: str, user_id: UUID | None, partitions: int) -> str:
    return partition_key(route_name, partition_of(user_id, partitions), partitions)


def route_of_key(key: str) -> str:
    """The route a routing key belongs to (`telecom.usage_record.p3` -> `telecom.usage_record`)."""
    head, dot, tail = key.rpartition(".")
    if dot and tail.startswith("p") and tail[1:].isascii() and tail[1:].isdigit():
        return head
    return key
