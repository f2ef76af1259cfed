"""DSNs as asyncpg reads them: several hosts (a primary and its standbys, tried in order), the
`host=` and `port=` parameters, IPv6 addresses in brackets. Everything pkgq shows or derives
from a DSN (the TLS explanation's address, the database `pkgq migrate` creates, the masked
form in logs) reads every host and never raises on one."""

from __future__ import annotations

import importlib.util
import ssl
from pathlib import Path
from types import ModuleType

import pytest

from infra.settings import mask_url
from infra.tls import explain, parse_postgres_dsn, postgres_target

FAILOVER = (
    "postgresql://u:secret@127.0.0.1:5433,127.0.0.1:5434/pkgq?target_session_attrs=read-write"
)


def test_a_multi_host_dsn_names_every_host_in_order_with_its_port() -> None:
    parsed = parse_postgres_dsn(FAILOVER)
    assert parsed.hosts == (("127.0.0.1", "5433"), ("127.0.0.1", "5434"))
    assert parsed.database == "pkgq"
    assert parsed.query == {"target_session_attrs": "read-write"}
    assert parsed.address == "127.0.0.1:5433,127.0.0.1:5434"


def test_postgres_target_of_a_multi_host_dsn_names_all_hosts_instead_of_raising() -> None:
    assert postgres_target(FAILOVER).address == "127.0.0.1:5433,127.0.0.1:5434"


@pytest.mark.parametrize(
    ("dsn", "address"),
    [
        ("postgresql://u@db-1,db-2:6432/pkgq", "db-1:5432,db-2:6432"),
        ("postgresql://u@[::1]:5432/pkgq", "[::1]:5432"),
        ("postgresql://u@[::1]:5433,[fe80::2]/pkgq", "[::1]:5433,[fe80::2]:5432"),
        ("postgresql://u@127.0.0.1:5433,[::1]:5434/pkgq", "127.0.0.1:5433,[::1]:5434"),
        ("postgresql:///pkgq?host=db-1,db-2&port=5433,5434", "db-1:5433,db-2:5434"),
        ("postgresql:///pkgq?host=db-1,db-2&port=5433", "db-1:5433,db-2:5433"),
        ("postgresql:///pkgq?host=db-1:5433,db-2", "db-1:5433,db-2:5432"),
        ("postgresql:///pkgq?host=::1", "[::1]:5432"),
        ("postgresql:///pkgq?host=/var/run/postgresql", "/var/run/postgresql:5432"),
        ("postgresql://u@db%2Done:5432/pkgq", "db-one:5432"),
        ("postgresql:///pkgq", "localhost:5432"),
        # The authority wins over host= and port=, as in asyncpg.
        ("postgresql://u@db-1:5433/pkgq?host=other&port=1", "db-1:5433"),
    ],
)
def test_the_address_reads_every_form_asyncpg_accepts(dsn: str, address: str) -> None:
    assert postgres_target(dsn).address == address


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u@h:notaport/pkgq",
        "postgresql://u@[::1/pkgq",
        "postgresql://u@h1:1,,h2:2/pkgq",
        "not a dsn",
        "",
    ],
)
def test_an_unreadable_dsn_is_shown_as_written_never_raising(dsn: str) -> None:
    assert postgres_target(dsn).address  # whatever it is, the failure it explains stays


@pytest.mark.parametrize(
    ("dsn", "database"),
    [
        (FAILOVER, "pkgq"),
        ("postgresql://u@h1,h2/pkgq%20test?sslmode=require", "pkgq test"),
        ("postgresql://u@h1?dbname=pkgq", "pkgq"),
        ("postgresql://?host=h1,h2&database=pkgq", "pkgq"),
        ("postgresql://u@h1:5432/", ""),  # asyncpg sends "" and ignores dbname= then
    ],
)
def test_the_database_comes_from_the_path_or_dbname_whatever_the_hosts(
    dsn: str, database: str
) -> None:
    assert parse_postgres_dsn(dsn).database == database


def test_a_certificate_for_the_wrong_host_names_every_host_of_a_multi_host_dsn() -> None:
    target = postgres_target(
        "postgresql://u@db-1:5432,db-2:5432/pkgq?sslmode=verify-full&sslrootcert=/ca.pem"
    )
    error = ssl.SSLCertVerificationError(1, "Hostname mismatch")
    error.verify_message = "Hostname mismatch, certificate is not valid for 'db-2'."
    line = explain(error, target)
    assert line is not None
    assert "TLS with PostgreSQL at db-1:5432,db-2:5432 failed" in line
    assert "reissued to include db-1 and db-2" in line


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        (FAILOVER, FAILOVER.replace("secret", "***")),
        (
            "postgresql://u:pw@[::1]:5433,127.0.0.1:5434/pkgq",
            "postgresql://u:***@[::1]:5433,127.0.0.1:5434/pkgq",
        ),
        (
            "postgresql:///pkgq?host=h1,h2&port=1,2&user=u&password=pw",
            "postgresql:///pkgq?host=h1,h2&port=1,2&user=u&password=***",
        ),
    ],
)
def test_a_multi_host_dsn_is_masked_like_any_other(dsn: str, masked: str) -> None:
    assert mask_url(dsn) == masked


def _render() -> ModuleType:
    path = Path(__file__).parents[2] / "deploy" / "observability" / "render.py"
    spec = importlib.util.spec_from_file_location("render", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://u@127.0.0.1:5432/pkgq", "postgresql://u@127.0.0.1:5432/pkgq_ns"),
        (FAILOVER, FAILOVER.replace("/pkgq?", "/pkgq_ns?")),
        (
            "postgresql:///pkgq?host=/var/run/postgresql",
            "postgresql:///pkgq_ns?host=/var/run/postgresql",
        ),
    ],
)
def test_the_dashboard_render_keeps_the_hosts_and_parameters_of_the_dsn(
    dsn: str, expected: str
) -> None:
    assert _render().with_database(dsn, "pkgq_ns") == expected
