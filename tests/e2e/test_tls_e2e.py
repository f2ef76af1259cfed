"""End to end over TLS: real `pkgq` processes reach RabbitMQ over amqps and Postgres with
verify-full, against this machine's development CA (deploy/local/ensure-tls.sh), and a wrong
CA or a host name the certificate is not issued for stops them with one clear line."""

from __future__ import annotations

import json
from pathlib import Path
from uuid import uuid4

import asyncpg
import pytest

from infra.rabbit.management import queue_figures
from infra.settings import Settings
from tests.support.broker_users import broker_user, set_permissions, url_for
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli
from tests.support.tls import make_ca, tls_settings

pytestmark = pytest.mark.e2e


async def _ssl_sessions(pool: asyncpg.Pool, database: str) -> dict[bool, int]:
    """pkgq's connections to `database`, counted by whether they use TLS."""
    async with pool.acquire() as conn:
        rows = await conn.fetch(
            """
            SELECT s.ssl, count(*) AS n
            FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
            WHERE a.datname = $1 AND a.application_name LIKE 'pkgq:%'
            GROUP BY s.ssl
            """,
            database,
        )
    return {row["ssl"]: row["n"] for row in rows}


def _one_error_line(output: str) -> str:
    """The single `error:` line a failed start prints; no traceback anywhere."""
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output
    return errors[0]


async def test_run_and_relay_over_amqps_and_verify_full_apply_a_purchase_and_mask_the_password(
    settings: Settings, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    # A broker user of the test's own with a password that must never appear in any output.
    name = f"pkgq-t-{uuid4().hex[:10]}-tls"
    async with broker_user(name, tags="monitoring") as password:
        await set_permissions(name, ".*", ".*", ".*")
        plain = Settings.model_validate(
            {**settings.model_dump(), "amqp_url": url_for(settings, name, password)}
        )
        tls = tls_settings(plain)
        assert tls.amqp_url.startswith("amqps://")
        added = await cli(tls, "catalog", "add", "tls", "--traffic", "1GiB", "--duration", "30d")
        assert added.returncode == 0, added.stderr
        package = int(added.stdout.strip())

        relay = PkgqProcess(tls, "relay")
        run = PkgqProcess(tls, "run")
        try:
            user = uuid4()
            body = json.dumps({"user_id": str(user), "package_id": package, "amount": 1})
            published = await cli(tls, "publish", "package_purchase", body)
            assert published.returncode == 0, published.stderr

            async def active() -> bool:
                shown = await cli(tls, "user", "show", str(user), "--json")
                assert shown.returncode == 0, shown.stderr
                current = json.loads(shown.stdout)["current"]
                return isinstance(current, dict) and current["status"] == "active"

            # purchase (amqps) -> queuing -> activate (relay, outbox) -> applied: the whole
            # lifecycle went through both TLS connections of both processes.
            await eventually(active, within=60)
            database = settings.postgres_dsn.rsplit("/", 1)[1]
            sessions = await _ssl_sessions(pool, database)
            assert sessions.get(True, 0) >= 2, sessions  # relay's and run's pools, at least
            assert sessions.get(False, 0) == 0, sessions  # none of pkgq's in plain text

            # The management API over https (15671) with the same CA, as `pkgq stats` uses it;
            # its figures lag the broker by its statistics interval (5 s by default).
            queue = tls.queue_name("telecom.package_purchase")

            async def consumer_seen() -> bool:
                figures = await queue_figures(tls, [queue])
                assert figures is not None, "management API over https not reachable"
                return queue in figures and figures[queue].consumers >= 1

            await eventually(consumer_seen, within=30, every=1.0)
        finally:
            relay_code, run_code = relay.terminate(), run.terminate()
        logs = relay.logs() + run.logs() + published.stdout + published.stderr
        assert relay_code == 0, relay.logs()
        assert run_code == 0, run.logs()
        assert '"amqp": "amqps://' in run.logs()
        assert f"{name}:***@" in run.logs()
        assert password not in logs


async def test_a_wrong_ca_for_rabbitmq_stops_run_with_one_line_naming_the_ca_file(
    settings: Settings, tmp_path: Path
) -> None:
    wrong = make_ca(tmp_path / "wrong")
    secret = f"s3cret-{uuid4().hex[:8]}"
    tls = tls_settings(settings, ca=wrong, client_cert=False)
    tls = Settings.model_validate(
        {**tls.model_dump(), "amqp_url": tls.amqp_url.replace(":guest@", f":{secret}@")}
    )
    done = await cli(tls, "run", PKGQ_STARTUP_WAIT="3")
    assert done.returncode == 2, done.stdout + done.stderr
    line = _one_error_line(done.stderr)
    assert "TLS with RabbitMQ at localhost:5671 failed" in line
    assert f"the CA file {wrong} (PKGQ_AMQP_CA_FILE)" in line
    assert "check that it holds the CA that signed the server's certificate" in line
    # While it waited, it said so in the log, once per attempt, as one line each.
    attempts = [
        json.loads(entry)
        for entry in done.stdout.splitlines()
        if entry.startswith("{") and '"tls_failed"' in entry
    ]
    assert attempts, done.stdout
    assert all(str(wrong) in a["error"] for a in attempts)
    assert secret not in done.stdout + done.stderr


async def test_a_wrong_ca_for_postgres_stops_relay_and_migrate_with_one_line_naming_the_file(
    settings: Settings, tmp_path: Path
) -> None:
    wrong = make_ca(tmp_path / "wrong")
    tls = tls_settings(settings, pg_ca=wrong)
    relay = await cli(tls, "relay", PKGQ_STARTUP_WAIT="3")
    assert relay.returncode == 2, relay.stdout + relay.stderr
    line = _one_error_line(relay.stderr)
    assert "TLS with PostgreSQL at localhost:5432 failed" in line
    assert f"the CA file {wrong} (sslrootcert in PKGQ_POSTGRES_DSN)" in line

    migrated = await cli(tls, "migrate")
    assert migrated.returncode == 2, migrated.stdout + migrated.stderr
    line = _one_error_line(migrated.stderr)
    assert f"the CA file {wrong} (sslrootcert in PKGQ_MIGRATE_DSN)" in line


async def test_a_host_name_missing_from_the_certificate_fails_verify_full_and_amqps(
    settings: Settings,
) -> None:
    # 127.1 is 127.0.0.1 to the resolver, but not a name the server certificate carries
    # (localhost, 127.0.0.1): verification must refuse it although the CA is right.
    tls = tls_settings(settings, host="127.1")
    shown = await cli(tls, "user", "show", str(uuid4()))
    assert shown.returncode == 2, shown.stdout + shown.stderr
    line = _one_error_line(shown.stderr)
    assert "TLS with PostgreSQL at 127.1:5432 failed" in line
    assert "Hostname mismatch" in line

    amqp_only = Settings.model_validate({**tls.model_dump(), "postgres_dsn": settings.postgres_dsn})
    done = await cli(amqp_only, "run", PKGQ_STARTUP_WAIT="3")
    assert done.returncode == 2, done.stdout + done.stderr
    line = _one_error_line(done.stderr)
    assert "TLS with RabbitMQ at 127.1:5671 failed" in line
    assert "Hostname mismatch" in line
