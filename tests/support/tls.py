"""TLS for tests: this machine's development CA and certificates (deploy/local/ensure-tls.sh,
run by `make test` through ensure-services.sh), settings that reach both servers over TLS, and
a second, unrelated CA made at test time for the wrong-CA cases."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

from yarl import URL

from infra.settings import Settings

DEV_TLS = Path(os.environ.get("PKGQ_DEV_TLS_DIR", "/etc/pkgq-dev-tls"))
CA = DEV_TLS / "ca.pem"
CLIENT_CERT = DEV_TLS / "client.pem"
CLIENT_KEY = DEV_TLS / "client.key"
EXTERNAL_USER = "pkgq-external-test"
"""The common name of the certificate the test of a login by certificate alone presents."""
EXTERNAL_CERT = DEV_TLS / "external-test.pem"
EXTERNAL_KEY = DEV_TLS / "external-test.key"
AMQPS_PORT = 5671


def dev_ca() -> Path:
    """The machine's development CA, or a failure that says how to make it."""
    assert CA.is_file(), f"{CA} is missing: run deploy/local/ensure-services.sh (as root)"
    return CA


def make_ca(folder: Path, name: str = "not pkgq's CA") -> Path:
    """A fresh self-signed CA in `folder` that signed nothing the servers present."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "ca.pem", folder / "ca.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert


def with_tls_dsn(dsn: str, ca: Path, host: str = "localhost") -> str:
    """`dsn` on `host` with libpq's verify-full against `ca`."""
    parts = urlsplit(dsn)
    user, _, address = parts.netloc.rpartition("@")
    port = address.rpartition(":")[2] if ":" in address else "5432"
    query = urlencode({"sslmode": "verify-full", "sslrootcert": str(ca)})
    return urlunsplit(parts._replace(netloc=f"{user}@{host}:{port}", query=query))


def amqps_url(amqp_url: str, host: str = "localhost") -> str:
    """The same broker credentials and vhost on the amqps listener."""
    return str(URL(amqp_url).with_scheme("amqps").with_host(host).with_port(AMQPS_PORT))


def tls_settings(
    settings: Settings,
    *,
    ca: Path | None = None,
    pg_ca: Path | None = None,
    host: str = "localhost",
    client_cert: bool = True,
    **overrides: object,
) -> Settings:
    """The test's settings with every connection over TLS: amqps verified against `ca` (the
    dev CA by default, with its client certificate), Postgres verify-full against `pg_ca`."""
    amqp_ca = ca or dev_ca()
    values = {
        **settings.model_dump(),
        "amqp_url": amqps_url(settings.amqp_url, host),
        "amqp_ca_file": str(amqp_ca),
        "amqp_cert_file": str(CLIENT_CERT) if client_cert else None,
        "amqp_key_file": str(CLIENT_KEY) if client_cert else None,
        "postgres_dsn": with_tls_dsn(settings.postgres_dsn, pg_ca or dev_ca(), host),
        "migrate_dsn": with_tls_dsn(settings.owner_dsn(), pg_ca or dev_ca(), host),
        **overrides,
    }
    return Settings.model_validate(values)
