"""A login by client certificate alone (SASL EXTERNAL): real `pkgq run` and `pkgq relay` reach
RabbitMQ with no password anywhere, as the user the certificate's common name names
(deploy/local/ensure-tls.sh turns the mechanism on and issues the test's certificate), and the
lifecycle events they publish carry that user as their user_id, which their consumers trust."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import pytest
from yarl import URL

from infra.settings import Settings
from tests.support.broker_users import admin, broker_user, set_permissions
from tests.support.observing import eventually
from tests.support.processes import PkgqProcess, cli
from tests.support.tls import EXTERNAL_CERT, EXTERNAL_KEY, EXTERNAL_USER, tls_settings

pytestmark = pytest.mark.e2e


async def test_run_and_relay_log_in_by_certificate_alone_and_apply_a_purchase(
    settings: Settings,
) -> None:
    async with broker_user(EXTERNAL_USER):  # its password is never used, nor known to pkgq
        await set_permissions(EXTERNAL_USER, ".*", ".*", ".*")
        tls = tls_settings(settings)
        url = URL(tls.amqp_url).with_user(EXTERNAL_USER).with_password(None)
        external = Settings.model_validate(
            {
                **tls.model_dump(),
                "amqp_url": str(url.with_query(auth="external")),
                "amqp_cert_file": str(EXTERNAL_CERT),
                "amqp_key_file": str(EXTERNAL_KEY),
            }
        )
        assert external.amqp_user == EXTERNAL_USER
        added = await cli(external, "catalog", "add", "ext", "--traffic", "1GiB")
        assert added.returncode == 0, added.stderr
        package = int(added.stdout.strip())
        relay = PkgqProcess(external, "relay")
        run = PkgqProcess(external, "run")
        try:
            user = uuid4()
            body = json.dumps({"user_id": str(user), "package_id": package, "amount": 1})
            published = await cli(external, "publish", "package_purchase", body)
            assert published.returncode == 0, published.stderr

            async def active() -> bool:
                shown = await cli(external, "user", "show", str(user), "--json")
                current = json.loads(shown.stdout)["current"]
                return isinstance(current, dict) and current["status"] == "active"

            # purchase -> queuing -> activate: the relay's lifecycle events, stamped with the
            # certificate's user, were trusted and applied by the consumers.
            await eventually(active, within=60)
            ours: list[dict[str, Any]] = []

            async def listed() -> bool:
                # The management API lists connections on its statistics interval (5 s).
                connections = await admin("GET", "connections")
                ours[:] = [c for c in connections if c.get("user") == EXTERNAL_USER]
                return bool(ours)

            await eventually(listed, within=30, every=1.0)
            assert {c["auth_mechanism"] for c in ours} == {"EXTERNAL"}
        finally:
            relay_code, run_code = relay.terminate(), run.terminate()
        assert relay_code == 0, relay.logs()
        assert run_code == 0, run.logs()
        assert "untrusted_publisher" not in run.logs()
