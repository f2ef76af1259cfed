"""Settings from the environment (`PKGQ_*`), with defaults that point at the local services.

One model per concern, each in its own module with its fields, validators and helpers, and
`Settings` composed of them all: one flat set of `PKGQ_*` variables and attributes
(`settings.amqp_url`, `Settings(batch_size=1)`), whatever concern a setting belongs to.
"""

from __future__ import annotations

import json
import os

from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.settings.broker import BrokerSettings
from infra.settings.database import LOCAL_OWNER_DSN, DatabaseSettings
from infra.settings.delivery import DeliverySettings
from infra.settings.network import NetworkSettings
from infra.settings.observability import ObservabilitySettings
from infra.settings.process import ProcessSettings
from infra.settings.relay import RelaySettings
from infra.settings.replicated import ReplicatedSettings, replica_ordinal
from infra.settings.routes import NO_ROUTE_SETTINGS, RouteTableSettings
from infra.settings.urls import mask_url, split_urls

__all__ = [
    "LOCAL_OWNER_DSN",
    "NO_ROUTE_SETTINGS",
    "BrokerSettings",
    "DatabaseSettings",
    "DeliverySettings",
    "NetworkSettings",
    "ObservabilitySettings",
    "ProcessSettings",
    "RelaySettings",
    "ReplicatedSettings",
    "RouteTableSettings",
    "Settings",
    "mask_url",
    "replica_ordinal",
    "split_urls",
]


class Settings(
    DatabaseSettings,
    BrokerSettings,
    DeliverySettings,
    ReplicatedSettings,
    RelaySettings,
    ObservabilitySettings,
    ProcessSettings,
    BaseSettings,
):
    """Every `PKGQ_*` setting of pkgq's processes, by concern (its bases, in this order)."""

    model_config = SettingsConfigDict(env_prefix="PKGQ_", extra="ignore")

    @classmethod
    def load(cls) -> Settings:
        """From the environment, and from systemd credentials (`LoadCredential=`) when the
        process has them: a file `pkgq_postgres_dsn` in $CREDENTIALS_DIRECTORY supplies
        PKGQ_POSTGRES_DSN (an environment variable of the same name wins over it)."""
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if credentials and os.path.isdir(credentials):
            return cls(_secrets_dir=credentials)
        return cls()

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
