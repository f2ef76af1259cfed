"""Partitions and replicas (which `pkgq run` consumes which queue at once, which as a standby)
and the replicated profile (quorum queues and their delivery limit)."""

from __future__ import annotations

import re
import socket
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from infra.settings.routes import RouteTableSettings, known_routes


class ReplicatedSettings(RouteTableSettings):
    """Partitions, replicas and the replicated profile."""

    partitions: dict[str, int] = Field(default_factory=dict)
    """Queues per route, e.g. PKGQ_PARTITIONS='{"telecom.usage_record": 4}' (default 1). See
    events/partitioning.py, and docs/how-to/partitions.md for changing it safely."""
    replica: str | None = Field(default=None, pattern=r"^\d+/\d+$")
    """`I/N`: this `pkgq run` is replica I of N. It consumes partitions k with k % N == I at once
    and subscribes to the others only as a standby after `standby_delay` seconds."""
    replica_count: int | None = Field(default=None, ge=1, le=256)
    """N of `I/N` when `replica` is not set, with I from `replica_index` or the host name: for
    pods whose ordinal is their index (a Kubernetes StatefulSet, deploy/k8s/)."""
    replica_index: str | None = None
    """I of `I/N`, as the environment gives it (the downward API's pod-index label, which may
    be empty where the label is not set); unset or empty: the host name's trailing `-I`."""
    standby_delay: float = Field(default=3.0, ge=0)

    queue_type: Literal["classic", "quorum"] = "classic"
    """The default queue type. "quorum": every queue pkgq declares is a replicated quorum queue
    (the replicated profile: infra/rabbit/topology.py, docs/how-to/replicated.md, with the
    guarantees that change with them: no broker-side priorities)."""
    delivery_limit: int = Field(default=20, ge=1, le=10_000)
    """Quorum queues only: how often the broker delivers one message before it dead-letters it
    itself (reason `delivery_limit`, filed and replayable like any dead letter). A delivery
    counts when the message goes back to its queue unacknowledged: a consumer's channel or
    connection closed with it in hand (a crash, a lost node, a shutdown, a TTR overrun).
    pkgq's own failures never count (they are acked and retried through Postgres), so the limit
    only stops a message that kills its consumer before it can be recorded."""

    @field_validator("partitions")
    @classmethod
    def _known_partitioned_routes(cls, value: dict[str, Any]) -> dict[str, Any]:
        return known_routes(value)

    @field_validator("replica")
    @classmethod
    def _replica_in_range(cls, value: str | None) -> str | None:
        if value is not None:
            index, count = (int(x) for x in value.split("/"))
            if not 0 <= index < count:
                raise ValueError(f"replica {value!r}: I/N needs 0 <= I < N")
        return value

    @field_validator("partitions")
    @classmethod
    def _partition_counts(cls, value: dict[str, int]) -> dict[str, int]:
        wrong = {k: v for k, v in value.items() if not 1 <= v <= 256}
        if wrong:
            raise ValueError(f"partitions must be 1..256, got {wrong}")
        return value

    @model_validator(mode="after")
    def _replica_from_ordinal(self) -> Self:
        if self.replica is None and self.replica_count is not None:
            index = replica_ordinal(self.replica_index, socket.gethostname())
            if not 0 <= index < self.replica_count:
                raise ValueError(
                    f"replica index {index} is not below PKGQ_REPLICA_COUNT {self.replica_count}"
                )
            self.replica = f"{index}/{self.replica_count}"
        return self

    def partitions_for(self, route_name: str) -> int:
        return self.route(route_name).partitions or self.partitions.get(route_name, 1)

    def preferred(self, partition: int) -> bool:
        """Whether this replica consumes `partition` at once (else only as a standby)."""
        if self.replica is None:
            return True
        index, count = (int(x) for x in self.replica.split("/"))
        return partition % count == index

    def with_queue_type(self, queue_type: str) -> Self:
        """These settings with every queue of `queue_type` (the default and each route's)."""
        routes = {
            name: route.model_copy(update={"queue_type": None})
            for name, route in self.route_settings.items()
        }
        return self.model_copy(update={"queue_type": queue_type, "route_settings": routes})

    def queue_type_for(self, route_name: str) -> str:
        return self.route(route_name).queue_type or self.queue_type


def replica_ordinal(index: str | None, hostname: str) -> int:
    """A pod's ordinal: `index` when given (digits), else the host name's trailing `-<digits>`
    (a StatefulSet's pod `pkgq-usage-record-2` is ordinal 2)."""
    if index:
        if not index.strip().isdigit():
            raise ValueError(f"PKGQ_REPLICA_INDEX {index!r} is not a number")
        return int(index)
    found = re.search(r"-(\d+)$", hostname)
    if found is None:
        raise ValueError(
            f"PKGQ_REPLICA_COUNT is set but the replica index is unknown: PKGQ_REPLICA_INDEX "
            f"is unset and the host name {hostname!r} does not end in -<ordinal>"
        )
    return int(found.group(1))
