"""PostgreSQL: the DSNs and roles, the pool, and the server settings of every connection."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from pydantic import Field

from infra.settings.network import NetworkSettings
from infra.settings.urls import mask_url

LOCAL_OWNER_DSN = "postgresql://pkgq_owner@127.0.0.1:5432/pkgq"
"""The schema owner on a dev box (deploy/local/ensure-services.sh creates it)."""


class DatabaseSettings(NetworkSettings):
    """PostgreSQL."""

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
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)

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

    def safe_postgres_dsn(self) -> str:
        return mask_url(self.postgres_dsn)
