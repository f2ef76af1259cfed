"""Secrets are masked in URLs; CLI sizes and durations parse as an operator writes them; the
retry policies by route are read from the environment and checked against the route table."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from consumers.cli.durations import parse_duration
from consumers.cli.sizes import parse_size
from consumers.retry_policy import policy_for
from events.routes import PACKAGE_ACTIVATE, ROUTES
from infra.route_config import RetrySettings
from infra.settings import Settings, mask_url

ACTIVATE = PACKAGE_ACTIVATE.name


def test_mask_url_hides_the_password_and_keeps_the_rest() -> None:
    masked = mask_url("amqp://svc:hunter2@rabbit.internal:5672/vhost")
    assert masked == "amqp://svc:***@rabbit.internal:5672/vhost"
    assert "hunter2" not in masked


def test_mask_url_leaves_a_url_without_password_unchanged() -> None:
    assert mask_url("postgresql://postgres@127.0.0.1:5432/pkgq") == (
        "postgresql://postgres@127.0.0.1:5432/pkgq"
    )


def test_settings_read_the_environment_and_mask_both_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKGQ_POSTGRES_DSN", "postgresql://app:pg-secret@db:5432/pkgq")
    monkeypatch.setenv("PKGQ_AMQP_URL", "amqp://app:mq-secret@mq:5672/")
    monkeypatch.setenv("PKGQ_PREFETCH", "7")
    settings = Settings()
    assert settings.prefetch == 7
    assert "pg-secret" not in settings.safe_postgres_dsn()
    assert "mq-secret" not in settings.safe_amqp_url()


def test_invalid_settings_are_refused_with_the_field_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKGQ_PREFETCH", "0")
    with pytest.raises(ValueError, match="prefetch"):
        Settings()


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 2**20), ("500MiB", 500 * 2**20), ("2GB", 2 * 10**9), ("10 gib", 10 * 2**30)],
)
def test_parse_size_understands_binary_and_decimal_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "duration"),
    [("90", timedelta(seconds=90)), ("15m", timedelta(minutes=15)), ("30d", timedelta(days=30))],
)
def test_parse_duration_understands_seconds_minutes_hours_days(
    text: str, duration: timedelta
) -> None:
    assert parse_duration(text) == duration


@pytest.mark.parametrize("text", ["", "ten", "5 parsecs", "-1GB"])
def test_parse_size_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_local_defaults_run_as_the_runtime_role_and_migrate_as_the_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("PKGQ_POSTGRES_DSN", "PKGQ_MIGRATE_DSN", "PKGQ_RUNTIME_ROLE"):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert settings.postgres_dsn == "postgresql://pkgq_runtime@127.0.0.1:5432/pkgq"
    assert settings.owner_dsn() == "postgresql://pkgq_owner@127.0.0.1:5432/pkgq"
    assert settings.grantee() == "pkgq_runtime"
    assert settings.postgres_session()["idle_in_transaction_session_timeout"] == "60000"


def test_one_dsn_for_everything_keeps_migrating_with_it_and_grants_nobody_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PKGQ_MIGRATE_DSN", raising=False)
    monkeypatch.delenv("PKGQ_RUNTIME_ROLE", raising=False)
    monkeypatch.setenv("PKGQ_POSTGRES_DSN", "postgresql://pkgq:s3cret@db:5432/pkgq")
    settings = Settings()
    assert settings.owner_dsn() == "postgresql://pkgq:s3cret@db:5432/pkgq"
    assert settings.grantee() == "pkgq"  # migrate skips granting the role it runs as


def test_an_explicit_owner_dsn_and_runtime_role_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PKGQ_POSTGRES_DSN", "postgresql://app_login@db/pkgq")
    monkeypatch.setenv("PKGQ_MIGRATE_DSN", "postgresql://owner:pw@db/pkgq")
    monkeypatch.setenv("PKGQ_RUNTIME_ROLE", "pkgq_runtime_group")
    settings = Settings()
    assert settings.owner_dsn() == "postgresql://owner:pw@db/pkgq"
    assert settings.grantee() == "pkgq_runtime_group"
    assert settings.child_env()["PKGQ_RUNTIME_ROLE"] == "pkgq_runtime_group"


def test_retry_routes_refuses_unknown_routes_and_names_each_of_them() -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(
            retry_routes={
                "bogus.route": RetrySettings(),
                "telecom.nope": RetrySettings(),
                ACTIVATE: RetrySettings(),
            }
        )
    unknown = str(caught.value).split("routes are")[0]
    assert "unknown route(s) ['bogus.route', 'telecom.nope']" in unknown
    assert ACTIVATE not in unknown


def test_retry_routes_refuses_a_short_route_name() -> None:
    with pytest.raises(ValidationError, match="package_activate"):
        Settings(retry_routes={"package_activate": RetrySettings()})


def test_retry_routes_accepts_every_known_route() -> None:
    settings = Settings(retry_routes={name: RetrySettings(max_attempts=2) for name in ROUTES})
    assert all(settings.retry_for(name).max_attempts == 2 for name in ROUTES)


def test_retry_for_falls_back_to_the_default_retry_settings() -> None:
    default = RetrySettings(max_attempts=7)
    settings = Settings(retry=default)
    assert settings.retry_for(ACTIVATE) is default


def test_settings_read_retry_and_retry_routes_from_the_environment_as_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PKGQ_RETRY", '{"max_attempts": 10, "backoff": "exponential"}')
    monkeypatch.setenv("PKGQ_RETRY_ROUTES", '{"telecom.package_activate": {"max_attempts": 5}}')
    settings = Settings()
    assert settings.retry == RetrySettings(max_attempts=10, backoff="exponential")
    assert settings.retry_for(ACTIVATE) == RetrySettings(max_attempts=5)
    assert settings.retry_for("telecom.usage_record").max_attempts == 10
    assert policy_for(settings, ACTIVATE).max_attempts == 5


def test_settings_from_the_environment_refuse_an_unknown_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PKGQ_RETRY_ROUTES", '{"telecom.nope": {"max_attempts": 5}}')
    with pytest.raises(ValidationError, match=r"telecom\.nope"):
        Settings()


def test_settings_from_the_environment_refuse_an_unknown_retry_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PKGQ_RETRY", '{"attempts": 5}')
    with pytest.raises(ValidationError, match="attempts"):
        Settings()
