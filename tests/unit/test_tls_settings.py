"""TLS settings: amqps always verifies, and nothing in a URL can turn that off; the management
API follows the AMQP URL to https; a failed handshake is explained in one line."""

from __future__ import annotations

import ssl

import pytest
from pydantic import ValidationError

from infra.rabbit.management import management_base
from infra.settings import Settings
from infra.tls import TlsTarget, TlsVerifyError, explain, postgres_ssl, postgres_target
from infra.transient import is_outage, needs_operator


@pytest.mark.parametrize(
    "query",
    ["no_verify_ssl=1", "no_verify_ssl=", "cafile=/tmp/ca.pem", "certfile=/c&keyfile=/k"],
)
def test_aiormq_tls_parameters_in_the_amqp_url_are_refused(query: str) -> None:
    with pytest.raises(ValidationError, match="PKGQ_AMQP_CA_FILE"):
        Settings(amqp_url=f"amqps://u:p@broker:5671/?{query}")


def test_tls_files_with_a_plain_amqp_url_are_refused_rather_than_ignored() -> None:
    with pytest.raises(ValidationError, match="not amqps://"):
        Settings(amqp_url="amqp://u:p@broker:5672/", amqp_ca_file="/etc/ca.pem")


def test_a_client_key_without_its_certificate_is_refused() -> None:
    with pytest.raises(ValidationError, match="PKGQ_AMQP_KEY_FILE set without"):
        Settings(amqp_url="amqps://u:p@broker/", amqp_key_file="/k.pem")


def test_tls_files_reach_child_processes() -> None:
    settings = Settings(
        amqp_url="amqps://u:p@broker/",
        amqp_ca_file="/ca.pem",
        amqp_cert_file="/c.pem",
        amqp_key_file="/k.pem",
    )
    env = settings.child_env()
    assert env["PKGQ_AMQP_CA_FILE"] == "/ca.pem"
    assert env["PKGQ_AMQP_CERT_FILE"] == "/c.pem"
    assert env["PKGQ_AMQP_KEY_FILE"] == "/k.pem"


def test_the_management_api_is_https_on_15671_when_the_amqp_url_is_amqps() -> None:
    tls = Settings(amqp_url="amqps://ops:secret@broker.example:5671/")
    assert management_base(tls) == ("https://broker.example:15671", "ops", "secret")
    plain = Settings(amqp_url="amqp://ops:secret@broker.example:5672/")
    assert management_base(plain)[0] == "http://broker.example:15672"


def test_an_amqps_url_is_masked_like_any_other() -> None:
    settings = Settings(amqp_url="amqps://pkgq:hunter2@broker:5671/")
    assert settings.safe_amqp_url() == "amqps://pkgq:***@broker:5671/"


def _unverified(message: str) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] {message}")
    error.verify_message = message
    return error


def test_a_certificate_not_accepted_is_one_line_naming_the_ca_file_and_the_check() -> None:
    target = TlsTarget("RabbitMQ", "broker:5671", "/etc/pkgq/ca.pem", "PKGQ_AMQP_CA_FILE")
    wrapped = ConnectionError("Server communication error")
    wrapped.__cause__ = _unverified("self-signed certificate in certificate chain")
    line = explain(wrapped, target)
    assert line is not None
    assert "\n" not in line
    assert line.startswith("TLS with RabbitMQ at broker:5671 failed")
    assert "the CA file /etc/pkgq/ca.pem (PKGQ_AMQP_CA_FILE)" in line
    assert "self-signed certificate in certificate chain" in line


def test_a_host_name_mismatch_says_to_use_a_name_from_the_certificate() -> None:
    target = postgres_target("postgresql://u@db.internal:6432/pkgq?sslmode=verify-full")
    line = explain(_unverified("Hostname mismatch, certificate is not valid for 'x'."), target)
    assert line is not None
    assert "TLS with PostgreSQL at db.internal:6432 failed" in line
    assert "reissued to include db.internal" in line
    assert "root.crt (sslrootcert in PKGQ_POSTGRES_DSN)" in line  # libpq's default CA file


def test_a_failure_that_is_not_tls_is_not_explained_as_tls() -> None:
    target = TlsTarget("RabbitMQ", "broker:5671", None, "PKGQ_AMQP_CA_FILE")
    assert explain(ConnectionRefusedError(111, "refused"), target) is None


def test_a_certificate_not_accepted_is_an_outage_that_needs_an_operator() -> None:
    error = TlsVerifyError("TLS with RabbitMQ at broker:5671 failed")
    assert is_outage(error)
    assert needs_operator(error)
    assert needs_operator(_unverified("unable to get local issuer certificate"))
    assert not needs_operator(ConnectionRefusedError(111, "refused"))


def test_a_login_by_certificate_alone_needs_amqps_and_a_client_certificate() -> None:
    with pytest.raises(ValidationError, match=r"needs amqps:// and PKGQ_AMQP_CERT_FILE"):
        Settings(amqp_url="amqps://pkgq@broker:5671/?auth=external")
    with pytest.raises(ValidationError, match=r"needs amqps:// and PKGQ_AMQP_CERT_FILE"):
        Settings(amqp_url="amqp://pkgq@broker:5672/?auth=external")


def test_a_login_by_certificate_names_its_user_and_no_password() -> None:
    cert, key = "/etc/pkgq/client.pem", "/etc/pkgq/client.key"
    for url in ["amqps://broker:5671/?auth=external", "amqps://pkgq:pw@broker:5671/?auth=external"]:
        with pytest.raises(ValidationError, match="names the certificate's user and no password"):
            Settings(amqp_url=url, amqp_cert_file=cert, amqp_key_file=key)
    url = "amqps://pkgq@broker:5671/?auth=EXTERNAL"
    settings = Settings(amqp_url=url, amqp_cert_file=cert, amqp_key_file=key)
    assert settings.amqp_user == "pkgq"  # the user_id pkgq stamps, and trusts


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u@127.0.0.1:5432/pkgq", "allow"),
        ("postgresql://u@localhost/pkgq", "allow"),
        ("postgresql://u@[::1]:5432/pkgq", "allow"),
        ("postgresql://u@127.0.0.1:5433,127.0.0.1:5434/pkgq", "allow"),
        ("postgresql:///pkgq?host=/var/run/postgresql", "allow"),
        ("postgresql://u@db.internal:5432/pkgq", None),
        ("postgresql://u@127.0.0.1:5433,10.0.0.7:5432/pkgq", None),
        ("postgresql://u@127.0.0.1/pkgq?sslmode=prefer", None),
        ("postgresql://u@127.0.0.1/pkgq?sslmode=verify-full&sslrootcert=/ca.pem", None),
        ("postgresql://u@/pkgq", None),  # no host named: asyncpg takes PGHOST's
        ("postgresql:///pkgq", None),
        ("postgresql://u@127.0.0.1/pkgq?service=prod", None),
    ],
)
def test_tls_is_left_to_the_server_only_when_every_host_is_this_machine_and_nothing_asks(
    dsn: str, expected: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGSSLMODE", raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)

    assert postgres_ssl(dsn) == expected


@pytest.mark.parametrize(("name", "value"), [("PGSSLMODE", "require"), ("PGSERVICE", "prod")])
def test_an_sslmode_or_service_in_the_environment_is_obeyed_on_this_host_too(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)

    assert postgres_ssl("postgresql://u@127.0.0.1/pkgq") is None


def test_a_dsn_without_hosts_is_left_alone_whatever_pghost_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGSSLMODE", raising=False)
    monkeypatch.setenv("PGHOST", "db.prod.example")

    assert postgres_ssl("postgresql://u@/pkgq") is None
    assert postgres_ssl("postgresql://u@localhost/pkgq") == "allow"
