"""The broker's message size limit shipped in deploy/rabbitmq/rabbitmq.conf."""

from __future__ import annotations

from pathlib import Path

from infra.settings import Settings

CONF = Path(__file__).parents[2] / "deploy" / "rabbitmq" / "rabbitmq.conf"


def conf_settings() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in CONF.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def test_the_broker_refuses_bodies_larger_than_pkgqs_own_limit() -> None:
    # Equal limits: whatever the broker lets through, pkgq accepts, and nothing bigger than
    # pkgq's limit ever reaches a consumer's prefetch buffer.
    assert (
        int(conf_settings()["max_message_size"]) == Settings.model_fields["max_body_bytes"].default
    )


def test_the_shipped_broker_config_holds_only_settings_the_installed_rabbitmq_knows() -> None:
    # The installed server's cuttlefish schema (Debian's package, which make services installs):
    # a misspelt key would stop the node from booting.
    schemas = sorted(
        Path("/usr/lib/rabbitmq/lib").glob(
            "rabbitmq_server-*/plugins/rabbit-*/priv/schema/rabbit.schema"
        )
    )
    assert schemas, "RabbitMQ's rabbit.schema not found under /usr/lib/rabbitmq/lib"
    schema = schemas[-1].read_text()
    for key in conf_settings():
        assert f'{{mapping, "{key}",' in schema, key
    assert 0 < int(conf_settings()["max_message_size"]) <= 512 * 1024 * 1024  # its validator
