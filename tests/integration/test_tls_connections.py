"""pkgq's connections over TLS against this machine's servers (deploy/local/ensure-tls.sh):
amqps with the client certificate, Postgres with verify-full, and what a wrong or missing CA
file turns into."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from uuid import uuid4

import aio_pika
import pytest

from infra.postgres.pool import create_pool
from infra.rabbit.connection import open_amqp
from infra.settings import Settings
from infra.tls import TlsConfigError, TlsVerifyError
from infra.transient import is_outage, is_transient, needs_operator
from tests.support.tls import make_ca, tls_settings


def _broker_connection(name: str) -> dict[str, object]:
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "client_properties", "ssl",
         "peer_cert_subject", "--formatter", "json"],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    for row in json.loads(listed.stdout):
        properties = row["client_properties"]
        # rabbitmqctl lists client properties as [name, type, value] triples
        found = {entry[0]: entry[2] for entry in properties if isinstance(entry, list)}
        if found.get("connection_name") == name:
            return dict(row)
    raise AssertionError(f"no broker connection named {name}")


async def test_amqps_publishes_and_consumes_with_the_client_certificate(
    settings: Settings,
) -> None:
    tls = tls_settings(settings)
    name = f"pkgq-test-tls-{uuid4().hex[:8]}"
    connection = await open_amqp(tls, name)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        body = uuid4().bytes
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)
        message = await queue.get(timeout=10)
        assert message is not None
        await message.ack()
        assert message.body == body
        seen = _broker_connection(name)
        assert seen["ssl"] is True
        assert "CN=pkgq" in str(seen["peer_cert_subject"])
    finally:
        await connection.close()


async def test_a_pool_with_verify_full_talks_tls_to_postgres(settings: Settings) -> None:
    tls = tls_settings(settings)
    pool = await create_pool(tls.postgres_dsn, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            version = await conn.fetchval(
                "SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl"
            )
        assert str(version).startswith("TLS")
    finally:
        await pool.close()


async def test_a_wrong_ca_is_an_outage_to_wait_out_that_needs_an_operator(
    settings: Settings, tmp_path: Path
) -> None:
    wrong = make_ca(tmp_path / "wrong")
    tls = tls_settings(settings, ca=wrong, pg_ca=wrong, client_cert=False)
    with pytest.raises(TlsVerifyError) as amqp_failed:
        await open_amqp(tls, "pkgq-test-wrong-ca")
    with pytest.raises(TlsVerifyError) as pg_failed:
        await create_pool(tls.postgres_dsn, min_size=1, max_size=1)
    for failed in (amqp_failed.value, pg_failed.value):
        assert is_outage(failed)
        assert needs_operator(failed)
        assert str(wrong) in str(failed)
        assert "\n" not in str(failed)


async def test_a_missing_ca_file_is_a_configuration_error_not_an_outage(
    settings: Settings, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-ca.pem"
    tls = tls_settings(settings, ca=missing, pg_ca=missing, client_cert=False)
    with pytest.raises(TlsConfigError) as amqp_failed:
        await open_amqp(tls, "pkgq-test-missing-ca")
    with pytest.raises(TlsConfigError) as pg_failed:
        await create_pool(tls.postgres_dsn, min_size=1, max_size=1)
    for failed in (amqp_failed.value, pg_failed.value):
        assert not is_transient(failed)
        assert f"cannot load {missing}" in str(failed)


async def test_a_pool_to_this_host_without_sslmode_talks_plain_text_and_one_asking_gets_tls(
    settings: Settings,
) -> None:
    """A DSN that says nothing about TLS means `allow` to a server on this host (the server
    has TLS on: libpq's `prefer` would have used it), and `sslmode=require` still gets TLS."""
    assert "sslmode" not in settings.postgres_dsn
    asking = f"{settings.postgres_dsn}?sslmode=require"
    found = {}
    for dsn in (settings.postgres_dsn, asking):
        pool = await create_pool(dsn, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                found[dsn] = await conn.fetchval(
                    "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                )
                server_tls = await conn.fetchval("SHOW ssl")
        finally:
            await pool.close()

    assert server_tls == "on"
    assert found == {settings.postgres_dsn: False, asking: True}
