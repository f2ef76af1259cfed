"""Settings from the environment (`PKGQ_*`), with defaults that point at the local services."""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from domain.errors import MAX_QUEUED_ITEMS
from infra.event_loop import EventLoopName
from infra.faults import FaultSpecError
from infra.faults import parse as parse_faults
from infra.route_config import BreakerSettings, RetrySettings, RouteSettings, load_routes_file
from infra.tls import amqp_tls_problem

LOCAL_OWNER_DSN = "postgresql://pkgq_owner@127.0.0.1:5432/pkgq"
"""The schema owner on a dev box (deploy/local/ensure-services.sh creates it)."""


NO_ROUTE_SETTINGS = RouteSettings()
"""What `Settings.route` gives for a route without settings of its own."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PKGQ_", extra="ignore")

    postgres_dsn: str = "postgresql://pkgq_runtime@127.0.0.1:5432/pkgq"
    """What every process but `pkgq migrate` connects with: the runtime role
    (docs/how-to/provisioning.md)."""
    migrate_dsn: str | None = None
    """What `pkgq migrate` connects with: the role that owns the schema. Unset: PKGQ_POSTGRES_DSN
    if that is set (one DSN for everything, as before roles), else the local `pkgq_owner`. See
    `owner_dsn()`."""
    runtime_role: str | None = Field(default=None, max_length=63)
    """The role `pkgq migrate` grants the runtime privileges to. Unset: the user of
    PKGQ_POSTGRES_DSN; "": grant nothing. See `grantee()`."""
    idle_in_transaction_timeout: float = Field(default=60.0, ge=0)
    """Seconds a session may sit idle inside a transaction before Postgres ends it (0: never),
    so a frozen process cannot hold its row locks and leases indefinitely."""
    tcp_keepalives_idle: int = Field(default=3, ge=0)
    """Seconds of silence before the server probes a client's TCP connection (0: the OS
    default); with the interval and count below, a vanished peer's backend ends within about
    idle + interval * count seconds (5 by default, PKGQ_DEAD_PEER_TIMEOUT's) instead of the
    OS's two hours, and with it the row locks its open transaction held."""
    tcp_keepalives_interval: int = Field(default=1, ge=0)
    tcp_keepalives_count: int = Field(default=2, ge=0)
    dead_peer_timeout: float = Field(default=5.0, ge=1, le=600)
    """Seconds after which this process takes a PostgreSQL or RabbitMQ connection whose peer
    stopped answering for dead: closes it and connects again, on a short capped backoff, so
    work resumes within about two seconds of the network's return (TCP_USER_TIMEOUT and
    keepalive on every socket, the AMQP heartbeat, connect timeouts:
    docs/how-to/network-faults.md). Lower finds a silent fault sooner; on a link whose round
    trips or losses can exceed it, raise it."""
    wire_accelerator: bool = True
    """Read and write AMQP frames through pkgq's wire accelerator (infra/rabbit/wire/): chunked
    frame reads, a delivery's frames decoded without pamqp's generic decoder, deliveries handed
    over in the channel's reader task, publishes coalesced into one write. false: aiormq's own
    code paths, the same bytes on the wire (slower)."""
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    """The broker, or the nodes of a cluster as a comma-separated list of URLs
    (`amqp://u:p@rabbit-1:5672/,amqp://u:p@rabbit-2:5672/`): pkgq connects to the first that
    answers and moves to another when its node goes away (infra/rabbit/connection.py). The
    nodes share one scheme, user and virtual host. One URL behind a load balancer (a
    Kubernetes Service) works as well."""
    amqp_ca_file: str | None = None
    """`amqps://` only: the CA file (PEM) the broker's certificate is verified against; unset:
    the system's trusted CAs. An amqps connection always verifies the certificate and the host
    name (docs/how-to/tls.md)."""
    amqp_cert_file: str | None = None
    """`amqps://` only: a client certificate (PEM, with its key unless PKGQ_AMQP_KEY_FILE)."""
    amqp_key_file: str | None = None
    """`amqps://` only: the client certificate's private key (PEM)."""
    declare_topology: bool = True
    """Declare the exchanges and queues at start-up. False: only check that they exist (the
    broker was provisioned from `pkgq definitions`), so the AMQP user needs no configure
    permission."""

    exchange: str = "telecom"
    """The topic exchange; its dead-letter exchange is `<exchange>.dlx`."""
    queue_prefix: str = "pkgq"
    """Queues are `<queue_prefix>.<route>`; dead letters go to `<queue_prefix>.dead_letters`."""

    concurrency: int = Field(default=1, ge=1, le=64)
    """Worker lanes per queue, for routes the route file does not configure (`--concurrency`)."""
    prefetch: int = Field(default=1024, ge=1, le=10_000)
    """Deliveries the broker sends ahead per consumed queue (raised to batch_size if lower): a
    backlog's next batches are already here while one commits. Each is held in memory, up to
    the broker's max_message_size apiece: where memory is tight and bodies may be large, lower
    it (the Kubernetes example sets 32; deploy/k8s/verify.sh checks the budget)."""
    batch_size: int = Field(default=32, ge=1, le=1000)
    """Deliveries a consumer waits (up to the linger) to apply together in one Postgres
    transaction (1: one at a time)."""
    batch_max: int = Field(default=512, ge=1, le=1000)
    """Deliveries a consumer takes into one transaction when they are already waiting in its
    prefetch buffer (a backlog): it never waits for more than batch_size, so a trickle stays
    in small batches, while a backlog drains in large ones. Raised to batch_size if lower;
    ignored with a batch_size of 1 (one at a time)."""
    batch_linger_ms: float = Field(default=5.0, ge=0, le=10_000)
    """How long a consumer waits for a batch to fill once it has one delivery in hand."""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    max_queued_items: int = Field(default=MAX_QUEUED_ITEMS, ge=1)
    """Live items (in_queue and active) one user may hold: a purchase beyond it is refused as
    a domain rule (dead-lettered as domain_rule), so a batch's load of a user's items is
    bounded."""
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)

    relay_batch_size: int = Field(default=200, ge=1, le=10_000)
    relay_confirm_timeout: float = Field(default=5.0, gt=0, le=300)
    """Seconds the relay waits for the broker to confirm one message. A publish not confirmed
    in time fails, the row stays due, and the relay opens a new channel (and, if that does not
    help, a new connection, through the node list or the load balancer) before it retries: a
    channel that has stopped confirming (a partitioned node) is never used again."""
    relay_stall_after: float = Field(default=60.0, gt=0)
    """Seconds without a healthy round (one that published what it claimed, or found nothing
    due) after which the relay counts as stalled: `relay_stalled` is logged as an error,
    `pkgq_relay_stalled` is 1, /readyz fails, and the relay reconnects to the broker."""
    relay_poll_interval: float = Field(default=1.0, gt=0)
    sweep_grace: float = Field(default=60.0, ge=0)
    """A time expiry this many seconds overdue, with no pending or recent trigger, is re-sent."""

    newer_version_retry: float = Field(default=30.0, gt=0, le=3600)
    """Seconds before a message of a schema version newer than this pkgq knows is tried again
    (held in its user's order: docs/how-to/upgrade.md)."""
    newer_version_deferrals: int = Field(default=240, ge=1, le=100_000)
    """How many times a message of a newer schema version is deferred (counted in Postgres)
    before it is buried as `unknown_version`, its user held behind it until an operator
    replays it (once the new pkgq runs) or discards it. 240 deferrals of 30 s: two hours, far
    longer than a rolling upgrade."""
    usage_dedup_days: int = Field(default=35, ge=1, le=3650)
    """How long a billed usage record's (user_id, usage_id) is remembered at least: a resend
    within it bills nothing (duplicate_usage). A billing cycle plus margin."""
    retry: RetrySettings = RetrySettings()
    """The default retry policy, e.g.
    PKGQ_RETRY='{"max_attempts": 10, "backoff": "exponential"}'."""
    retry_routes: dict[str, RetrySettings] = Field(default_factory=dict)
    """Per-route policies by route name, e.g.
    PKGQ_RETRY_ROUTES='{"telecom.package_activate": {"max_attempts": 5}}'."""
    release_poll_interval: float = Field(default=2.0, gt=0)
    """How often a consumer looks for holds an operator released (a discarded dead letter)."""
    breaker: BreakerSettings | None = None
    """The circuit breaker of every route (a route's own in PKGQ_ROUTES_FILE wins), e.g.
    PKGQ_BREAKER='{"failure_rate": 0.5, "min_deliveries": 20, "window_s": 60}'; unset: off."""
    pause_poll: float = Field(default=2.0, gt=0)
    """How often each `pkgq run` reads which routes are paused (`pkgq route pause`): a pause
    or resume is obeyed by every replica within about this many seconds."""

    http_port: int = Field(default=0, ge=0, le=65535)
    """/metrics, /healthz and /readyz of this process (infra/observability.py); 0: off."""
    http_host: str = "127.0.0.1"
    """The status port's bind address: loopback unless a deployment says otherwise (the k8s
    manifests set 0.0.0.0, for the kubelet's probes and the scraper)."""
    metrics_refresh_interval: float = Field(default=10.0, gt=0)
    """How often the outbox backlog and dead-letter gauges are read from Postgres."""

    drain_timeout: float = Field(default=30.0, gt=0)
    startup_wait: float = Field(default=60.0, gt=0)
    """Seconds `pkgq run` and `pkgq relay` wait for Postgres and RabbitMQ at start-up (an
    outage, or a certificate not accepted) before they exit."""
    log_format: str = Field(default="auto", pattern="^(auto|json|console)$")
    log_level: str = "info"
    event_loop: EventLoopName = "uvloop"
    """The event loop commands run on: uvloop (the default; the consumers' and the relay's
    throughput, infra/event_loop.py) or asyncio (the standard library's)."""

    faults: str = ""
    """Crash tests only, never in production: the fault points that SIGKILL the process, e.g.
    PKGQ_FAULTS="consumer.after_commit=telecom.package_queuing,relay.after_confirm@10" (see
    infra/faults.py for the points and the syntax). The CLI enables them at start-up."""

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

    routes_file: str | None = None
    """A TOML file with per-route settings (concurrency, prefetch, batch_size, partitions, retry,
    ttr, queue_type), e.g. `[routes.usage_record]` then `concurrency = 4`. See RouteSettings and
    infra/route_config.py; values in it win over PKGQ_PARTITIONS and PKGQ_RETRY_ROUTES."""
    route_settings: dict[str, RouteSettings] = Field(default_factory=dict)
    """The per-route settings by full route name (filled from routes_file, or set as JSON)."""
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

    management_url: str | None = None
    """The RabbitMQ management API (for taken counts in `pkgq stats`); default: the AMQP host on
    port 15672 with the AMQP credentials."""

    heartbeat_interval: float = Field(default=5.0, gt=0)
    """How often a process updates its row in telecom.workers."""
    worker_stale_after: float = Field(default=30.0, gt=0)
    """A worker whose heartbeat is older than this is stale: its leases and Postgres
    connections are taken from it."""
    retention: float = Field(default=7 * 86400.0, ge=60)
    """Seconds that processed-message records (the inbox), published outbox rows, finished
    addresses and groups are kept for audit and dedup before they are pruned."""
    prune_batch_size: int = Field(default=5000, ge=1, le=1_000_000)
    housekeeping_interval: float = Field(default=30.0, gt=0)
    """How often the relay runs the lease-guarded jobs: the expiry sweep and retention."""
    invariant_check_interval: float = Field(default=60.0, ge=0)
    """How often the relay runs the invariant checks (`pkgq doctor`'s), under a lease, stores
    their results and exports pkgq_invariant_violations; 0: never."""

    @field_validator("retry_routes", "partitions", "route_settings")
    @classmethod
    def _known_routes(cls, value: dict[str, Any]) -> dict[str, Any]:
        from events.routes import ROUTES  # settings stay importable without the route table

        unknown = sorted(set(value) - set(ROUTES))
        if unknown:
            raise ValueError(f"unknown route(s) {unknown}; routes are {sorted(ROUTES)}")
        return value

    @field_validator("faults")
    @classmethod
    def _known_faults(cls, value: str) -> str:
        from events.routes import ROUTES

        try:
            named = parse_faults(value)
        except FaultSpecError as exc:
            raise ValueError(f"PKGQ_FAULTS {value!r}: {exc}") from None
        unknown = sorted({f.route for f in named if f.route is not None} - set(ROUTES))
        if unknown:
            raise ValueError(
                f"PKGQ_FAULTS {value!r}: unknown route(s) {unknown}; routes are {sorted(ROUTES)}"
            )
        return value

    @field_validator("amqp_url")
    @classmethod
    def _no_tls_url_parameters(cls, value: str) -> str:
        given = sorted(
            {
                name
                for url in split_urls(value)
                for name in parse_qs(urlsplit(url).query, keep_blank_values=True)
            }
            & _AMQP_TLS_PARAMETERS
        )
        if given:
            raise ValueError(
                f"PKGQ_AMQP_URL has TLS parameter(s) {given}: set PKGQ_AMQP_CA_FILE, "
                "PKGQ_AMQP_CERT_FILE and PKGQ_AMQP_KEY_FILE instead (an amqps:// URL always "
                "verifies the broker's certificate)"
            )
        return value

    @field_validator("amqp_url")
    @classmethod
    def _nodes_alike(cls, value: str) -> str:
        urls = split_urls(value)
        if not urls:
            raise ValueError("PKGQ_AMQP_URL is empty")
        first = urlsplit(urls[0])
        for url in urls[1:]:
            other = urlsplit(url)
            if (other.scheme.lower(), other.username, other.path or "/", other.query) != (
                first.scheme.lower(),
                first.username,
                first.path or "/",
                first.query,
            ):
                raise ValueError(
                    f"PKGQ_AMQP_URL lists nodes that differ in scheme, user, virtual host or "
                    f"parameters ({mask_url(urls[0])} and {mask_url(url)}): the nodes of one "
                    "cluster are reached alike, only their host and port differ"
                )
        return value

    @model_validator(mode="after")
    def _amqp_tls_consistent(self) -> Settings:
        problem = amqp_tls_problem(
            self.amqp_urls[0], self.amqp_ca_file, self.amqp_cert_file, self.amqp_key_file
        )
        if problem:
            raise ValueError(problem)
        return self

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
    def _replica_from_ordinal(self) -> Settings:
        if self.replica is None and self.replica_count is not None:
            index = replica_ordinal(self.replica_index, socket.gethostname())
            if not 0 <= index < self.replica_count:
                raise ValueError(
                    f"replica index {index} is not below PKGQ_REPLICA_COUNT {self.replica_count}"
                )
            self.replica = f"{index}/{self.replica_count}"
        return self

    @model_validator(mode="after")
    def _read_routes_file(self) -> Settings:
        if self.routes_file and not self.route_settings:
            self.route_settings = load_routes_file(self.routes_file)
        return self

    def attempts_bound(self) -> int:
        """The most attempts any hold's blocker may take before it is buried: the largest
        `max_attempts` of any retry policy, or PKGQ_NEWER_VERSION_DEFERRALS if larger
        (`pkgq doctor`'s hold_past_its_bound)."""
        policies = [self.retry, *self.retry_routes.values()]
        policies += [r.retry for r in self.route_settings.values() if r.retry is not None]
        return max(self.newer_version_deferrals, *(p.max_attempts for p in policies))

    def route(self, route_name: str) -> RouteSettings:
        """The route's own settings; one shared empty RouteSettings (frozen) for a route that
        has none, as the relay asks for every row it publishes."""
        return self.route_settings.get(route_name) or NO_ROUTE_SETTINGS

    def partitions_for(self, route_name: str) -> int:
        return self.route(route_name).partitions or self.partitions.get(route_name, 1)

    def concurrency_for(self, route_name: str) -> int:
        return self.route(route_name).concurrency or self.concurrency

    def prefetch_for(self, route_name: str) -> int:
        return self.route(route_name).prefetch or self.prefetch

    def batch_size_for(self, route_name: str) -> int:
        return self.route(route_name).batch_size or self.batch_size

    def batch_max_for(self, route_name: str) -> int:
        """batch_max, never below batch_size; a batch_size of 1 is the one-at-a-time mode,
        whatever batch_max says."""
        size = self.batch_size_for(route_name)
        if size == 1:
            return 1
        return max(self.route(route_name).batch_max or self.batch_max, size)

    def ttr_for(self, route_name: str) -> float | None:
        return self.route(route_name).ttr

    def with_queue_type(self, queue_type: str) -> Settings:
        """These settings with every queue of `queue_type` (the default and each route's)."""
        routes = {
            name: route.model_copy(update={"queue_type": None})
            for name, route in self.route_settings.items()
        }
        return self.model_copy(update={"queue_type": queue_type, "route_settings": routes})

    def queue_type_for(self, route_name: str) -> str:
        return self.route(route_name).queue_type or self.queue_type

    def preferred(self, partition: int) -> bool:
        """Whether this replica consumes `partition` at once (else only as a standby)."""
        if self.replica is None:
            return True
        index, count = (int(x) for x in self.replica.split("/"))
        return partition % count == index

    def breaker_for(self, route_name: str) -> BreakerSettings | None:
        return self.route(route_name).breaker or self.breaker

    def retry_for(self, route_name: str) -> RetrySettings:
        return self.route(route_name).retry or self.retry_routes.get(route_name, self.retry)

    @classmethod
    def load(cls) -> Settings:
        """From the environment, and from systemd credentials (`LoadCredential=`) when the
        process has them: a file `pkgq_postgres_dsn` in $CREDENTIALS_DIRECTORY supplies
        PKGQ_POSTGRES_DSN (an environment variable of the same name wins over it)."""
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if credentials and os.path.isdir(credentials):
            return cls(_secrets_dir=credentials)
        return cls()

    def owner_dsn(self) -> str:
        """The DSN `pkgq migrate` connects with."""
        if self.migrate_dsn:
            return self.migrate_dsn
        if "postgres_dsn" in self.model_fields_set:
            return self.postgres_dsn
        return LOCAL_OWNER_DSN

    def grantee(self) -> str:
        """The runtime role migrate grants to ("" for none): the processes' own user unless
        PKGQ_RUNTIME_ROLE names another (a group role the login role is a member of)."""
        if self.runtime_role is not None:
            return self.runtime_role
        return unquote(urlsplit(self.postgres_dsn).username or "")

    def postgres_session(self) -> dict[str, str]:
        """Server settings for every pkgq connection (sent at connect: no extra statement)."""
        return {
            "idle_in_transaction_session_timeout": str(
                round(self.idle_in_transaction_timeout * 1000)
            ),
            "tcp_keepalives_idle": str(self.tcp_keepalives_idle),
            "tcp_keepalives_interval": str(self.tcp_keepalives_interval),
            "tcp_keepalives_count": str(self.tcp_keepalives_count),
            # the server's side of TCP_USER_TIMEOUT: a backend whose replies a dead or cut-off
            # client stops acknowledging ends within the bound, its locks with it
            "tcp_user_timeout": str(round(self.dead_peer_timeout * 1000)),
        }

    def child_env(self) -> dict[str, str]:
        """The PKGQ_* variables that give a child `pkgq` process these services and names."""
        env = {
            "PKGQ_POSTGRES_DSN": self.postgres_dsn,
            "PKGQ_MIGRATE_DSN": self.owner_dsn(),
            "PKGQ_AMQP_URL": self.amqp_url,
            "PKGQ_DECLARE_TOPOLOGY": str(self.declare_topology).lower(),
            "PKGQ_EXCHANGE": self.exchange,
            "PKGQ_QUEUE_PREFIX": self.queue_prefix,
            "PKGQ_RELAY_POLL_INTERVAL": str(self.relay_poll_interval),
            "PKGQ_STANDBY_DELAY": str(self.standby_delay),
        }
        if self.runtime_role is not None:
            env["PKGQ_RUNTIME_ROLE"] = self.runtime_role
        for name, value in (
            ("PKGQ_AMQP_CA_FILE", self.amqp_ca_file),
            ("PKGQ_AMQP_CERT_FILE", self.amqp_cert_file),
            ("PKGQ_AMQP_KEY_FILE", self.amqp_key_file),
        ):
            if value:
                env[name] = value
        if self.partitions:
            env["PKGQ_PARTITIONS"] = json.dumps(self.partitions)
        if self.route_settings:
            env["PKGQ_ROUTE_SETTINGS"] = json.dumps(
                {k: v.model_dump(exclude_none=True) for k, v in self.route_settings.items()}
            )
        return env

    @property
    def dlx(self) -> str:
        return f"{self.exchange}.dlx"

    @property
    def unroutable_exchange(self) -> str:
        """The alternate exchange of `exchange`: what no queue is bound for lands here."""
        return f"{self.exchange}.unroutable"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue_prefix}.dead_letters"

    def queue_name(self, route_name: str) -> str:
        return f"{self.queue_prefix}.{route_name}"

    @property
    def amqp_tls(self) -> bool:
        """Whether the broker is reached over TLS (an `amqps://` URL)."""
        return urlsplit(self.amqp_urls[0]).scheme.lower() == "amqps"

    @property
    def amqp_urls(self) -> list[str]:
        """The broker's nodes, in the order pkgq tries them (PKGQ_AMQP_URL)."""
        return split_urls(self.amqp_url)

    def safe_postgres_dsn(self) -> str:
        return mask_url(self.postgres_dsn)

    def safe_amqp_url(self) -> str:
        return mask_url(self.amqp_url)

    @property
    def amqp_user(self) -> str:
        """The RabbitMQ user pkgq connects as (AMQP's default, guest, when the URL names none;
        with `?auth=external`, the URL names the client certificate's common name): the user_id
        pkgq's messages carry, and the only one its lifecycle consumers trust."""
        from yarl import URL  # aio-pika's own URL parser, so both read the URL alike

        return URL(self.amqp_urls[0]).user or "guest"


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


def split_urls(value: str) -> list[str]:
    """The URLs of a comma-separated list (a comma inside a password is written `%2C`)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def mask_url(url: str) -> str:
    """The URL with its password (in the user part or a `password=` parameter) as `***`, so it
    can be logged. Never raises: a URL it cannot parse comes back with everything between `//`
    and `@` masked."""
    masked = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", url)
    return _PASSWORD_PARAM.sub(lambda m: f"{m.group(1)}***", masked)


_AMQP_TLS_PARAMETERS = frozenset(
    {"cafile", "capath", "cadata", "certfile", "keyfile", "no_verify_ssl"}
)
"""aiormq's own URL parameters for TLS: refused, so that the settings are the one place TLS is
configured and verification cannot be turned off by a URL."""

_USERINFO = re.compile(r"(\w[\w+.-]*://)([^:/@?#]*):[^@/?#]*@")
_PASSWORD_PARAM = re.compile(r"((?:^|[?&;])password=)[^&;#]*", re.IGNORECASE)
