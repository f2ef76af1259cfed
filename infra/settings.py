"""Settings from the environment (`PKGQ_*`), with defaults that point at the local services."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PKGQ_", extra="ignore")

    postgres_dsn: str = "postgresql://postgres@127.0.0.1:5432/pkgq"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"

    exchange: str = "telecom"
    """The topic exchange; its dead-letter exchange is `<exchange>.dlx`."""
    queue_prefix: str = "pkgq"
    """Queues are `<queue_prefix>.<route>`; dead letters go to `<queue_prefix>.dead_letters`."""

    prefetch: int = Field(default=32, ge=1, le=10_000)
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    pool_min_size: int = Field(default=1, ge=0)
    pool_max_size: int = Field(default=10, ge=1)

    relay_batch_size: int = Field(default=200, ge=1, le=10_000)
    relay_poll_interval: float = Field(default=1.0, gt=0)
    sweep_interval: float = Field(default=30.0, gt=0)
    sweep_grace: float = Field(default=60.0, ge=0)
    """A time expiry this many seconds overdue, with no pending or recent trigger, is re-sent."""

    drain_timeout: float = Field(default=30.0, gt=0)
    log_format: str = Field(default="auto", pattern="^(auto|json|console)$")
    log_level: str = "info"

    # Fault injection for the crash tests only; never set these in production.
    fault_kill_before_commit: str | None = None
    """Route name: SIGKILL the consumer inside its first transaction on that route, uncommitted."""
    fault_kill_after_commit: str | None = None
    """Route name: SIGKILL the consumer after its first commit on that route, before the ack."""
    fault_kill_relay_after: int | None = None
    """SIGKILL the relay after this many confirmed publishes, before it marks them done."""

    @property
    def dlx(self) -> str:
        return f"{self.exchange}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue_prefix}.dead_letters"

    def queue_name(self, route_name: str) -> str:
        return f"{self.queue_prefix}.{route_name}"

    def safe_postgres_dsn(self) -> str:
        return mask_url(self.postgres_dsn)

    def safe_amqp_url(self) -> str:
        return mask_url(self.amqp_url)


def mask_url(url: str) -> str:
    """Replace the password in a URL with `***` so it can be logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
