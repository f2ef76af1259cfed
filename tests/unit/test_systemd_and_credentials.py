"""Credentials from systemd's LoadCredential, and the notify protocol's configuration."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from infra.settings import Settings
from infra.systemd_notify import Notifier


def test_secrets_are_read_from_the_credentials_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pkgq_postgres_dsn").write_text("postgresql://pkgq:s3cret@db.example/pkgq")
    (tmp_path / "pkgq_amqp_url").write_text("amqp://pkgq:s3cret@mq.example:5672/")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("PKGQ_POSTGRES_DSN", raising=False)
    monkeypatch.delenv("PKGQ_AMQP_URL", raising=False)
    settings = Settings.load()
    assert settings.postgres_dsn == "postgresql://pkgq:s3cret@db.example/pkgq"
    assert settings.safe_amqp_url() == "amqp://pkgq:***@mq.example:5672/"


def test_the_owners_dsn_for_migrate_is_read_from_its_own_credential_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pkgq_postgres_dsn").write_text("postgresql://pkgq_runtime:r@db/pkgq")
    (tmp_path / "pkgq_migrate_dsn").write_text("postgresql://pkgq_owner:o@db/pkgq")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("PKGQ_POSTGRES_DSN", raising=False)
    monkeypatch.delenv("PKGQ_MIGRATE_DSN", raising=False)
    monkeypatch.delenv("PKGQ_RUNTIME_ROLE", raising=False)
    settings = Settings.load()
    assert settings.owner_dsn() == "postgresql://pkgq_owner:o@db/pkgq"
    assert settings.grantee() == "pkgq_runtime"


def test_an_environment_variable_wins_over_a_credential_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pkgq_postgres_dsn").write_text("postgresql://from-file/pkgq")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("PKGQ_POSTGRES_DSN", "postgresql://from-env/pkgq")
    assert Settings.load().postgres_dsn == "postgresql://from-env/pkgq"


def test_without_notify_socket_the_notifier_does_nothing() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    notifier.ready("idle")  # must not raise
    assert notifier.watchdog_interval is None


def test_the_watchdog_pings_at_half_of_watchdog_usec_and_ready_reaches_the_socket(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(path)
        notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"})
        assert notifier.watchdog_interval == 15.0
        notifier.ready("consuming 9 queue(s)")
        assert listener.recv(4096).decode() == "READY=1\nSTATUS=consuming 9 queue(s)"
