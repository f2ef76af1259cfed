"""Partitions and replicas (which `pkgq run` consumes which queue at once, which as a standby)
and the replicated profile (quorum queues and their delivery limit)."""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from infra.settings.routes import RouteTableSettings, known_routes

NEW_DEPLOYMENT_PARTITIONS = {"telecom.usage_record": 16, "telecom.package_purchase": 16}
"""The partition counts `pkgq migrate` records for a new deployment that configures none (the
routes not named: 1), so that a team can add `pkgq run` replicas to these routes later without
re-partitioning. An existing deployment keeps what it runs with (infra/postgres/migrate.py)."""


class PartitionMapMismatchError(ValueError):
    """This process's configured partitions disagree with the deployment's recorded map."""


class ReplicatedSettings(RouteTableSettings):
    """Partitions, replicas and the replicated profile."""

    partitions: dict[str, int] = Field(default_factory=dict)
    """Queues per route, e.g. PKGQ_PARTITIONS='{"telecom.usage_record": 4}': when set, the whole
    map (a route not named has 1), and it must equal the deployment's map recorded by `pkgq
    migrate` or a process that routes or consumes refuses to start. Unset, such a process uses
    the recorded map (on a new deployment 16 for telecom.usage_record and
    telecom.package_purchase, 1 for the others). See events/partitioning.py, and
    docs/how-to/partitions.md for changing it safely."""
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

    def configures_partitions(self) -> bool:
        """Whether this process is given a partition map (PKGQ_PARTITIONS, or a routes file
        that gives a route its partitions): then it is the whole map, a route it does not
        name having 1 partition, as it has always been."""
        return bool(self.partitions) or any(
            route.partitions for route in self.route_settings.values()
        )

    def partition_map(self) -> dict[str, int]:
        """Every route's partition count as these settings give it."""
        from events.routes import ROUTES  # settings stay importable without the route table

        return {name: self.partitions_for(name) for name in ROUTES}

    def partitions_to_record(self, new_deployment: bool) -> dict[str, int]:
        """The map `pkgq migrate` records for the routes that have no recorded count: the one
        configured here if any (`configures_partitions`); else NEW_DEPLOYMENT_PARTITIONS for a
        new deployment, and 1 everywhere for an existing one (what it has been running
        with)."""
        if self.configures_partitions() or not new_deployment:
            return self.partition_map()
        return {name: NEW_DEPLOYMENT_PARTITIONS.get(name, 1) for name in self.partition_map()}

    def with_recorded_partitions(self, recorded: Mapping[str, int]) -> Self:
        """These settings with the deployment's recorded partition map (routes it does not
        record keep theirs: a database `pkgq migrate` has not recorded in). A configured map
        that disagrees with it raises PartitionMapMismatchError, naming each route, both
        counts, and how to change the recorded one."""
        from events.routes import ROUTES

        known = {name: count for name, count in recorded.items() if name in ROUTES}
        if not known:
            return self
        if self.configures_partitions():
            wrong = {
                name: (self.partitions_for(name), count)
                for name, count in known.items()
                if self.partitions_for(name) != count
            }
            if wrong:
                raise PartitionMapMismatchError(_mismatch(wrong))
        return self.model_copy(update={"partitions": {**self.partition_map(), **known}})

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


def _mismatch(wrong: Mapping[str, tuple[int, int]]) -> str:
    said = "; ".join(
        f"{name}: configured {mine}, recorded {theirs}" for name, (mine, theirs) in wrong.items()
    )
    return (
        f"the partition map configured here (PKGQ_PARTITIONS or the routes file) disagrees "
        f"with the deployment's recorded map ({said}). Every process must use the recorded "
        f"one: unset PKGQ_PARTITIONS (and routes-file partitions) or make them equal to it "
        f"(`pkgq partitions status ROUTE` shows it). To change a route's count, follow the "
        f"procedure in docs/how-to/partitions.md: pause or stop its publishers, drain its "
        f"queues, stop its consumers, then `pkgq partitions set ROUTE P`"
    )


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
