"""The per-route configuration file: what it accepts, and the errors that name what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.route_config import BreakerSettings, RetrySettings, RouteConfigError, load_routes_file
from infra.settings import Settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "routes.toml"
    path.write_text(text)
    return path


def test_short_and_full_route_names_both_configure_the_route(tmp_path: Path) -> None:
    found = load_routes_file(
        write(
            tmp_path,
            "[routes.usage_record]\nconcurrency = 4\nttr = 2.5\n"
            '[routes."telecom.package_activate"]\npartitions = 3\nqueue_type = "quorum"\n'
            "[routes.all_expired]\nretry = { max_attempts = 3, backoff = 'fixed', base_s = 5 }\n",
        )
    )
    settings = Settings(route_settings=found)
    assert settings.concurrency_for("telecom.usage_record") == 4
    assert settings.ttr_for("telecom.usage_record") == 2.5
    assert settings.partitions_for("telecom.package_activate") == 3
    assert settings.queue_type_for("telecom.package_activate") == "quorum"
    assert settings.retry_for("telecom.all_expired").max_attempts == 3
    assert settings.concurrency_for("telecom.all_expired") == 1  # unset: the default


def test_the_file_wins_over_the_environment_wide_settings(tmp_path: Path) -> None:
    found = load_routes_file(
        write(tmp_path, "[routes.usage_record]\npartitions = 2\nprefetch = 7\n")
    )
    settings = Settings(partitions={"telecom.usage_record": 8}, prefetch=50, route_settings=found)
    assert settings.partitions_for("telecom.usage_record") == 2
    assert settings.prefetch_for("telecom.usage_record") == 7
    assert settings.prefetch_for("telecom.all_expired") == 50


def test_a_routes_breaker_wins_over_the_process_wide_one_and_none_means_off(
    tmp_path: Path,
) -> None:
    found = load_routes_file(
        write(tmp_path, "[routes.usage_record]\nbreaker = { failure_rate = 0.2 }\n")
    )
    assert Settings(route_settings=found).breaker_for("telecom.all_expired") is None
    wide = BreakerSettings(failure_rate=0.9, min_deliveries=5)
    settings = Settings(route_settings=found, breaker=wide)
    own = settings.breaker_for("telecom.usage_record")
    assert own is not None
    assert (own.failure_rate, own.min_deliveries, own.resume_after_s) == (0.2, 20, None)
    assert settings.breaker_for("telecom.all_expired") == wide


def test_settings_read_the_file_named_by_routes_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[routes.usage_record]\nbatch_size = 3\n")
    assert Settings(routes_file=str(path)).batch_size_for("telecom.usage_record") == 3


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[routes.no_such_route]\nconcurrency = 2\n", "unknown route 'no_such_route'"),
        ("[routes.usage_record]\nworkers = 2\n", "workers: Extra inputs are not permitted"),
        ("[routes.usage_record]\nconcurrency = 0\n", "concurrency: Input should be greater"),
        ("[routes.usage_record]\nttr = -1\n", "ttr: Input should be greater than 0"),
        (
            "[routes.usage_record]\nbreaker = { failure_rate = 1.5 }\n",
            "breaker.failure_rate: Input should be less than or equal to 1",
        ),
        ('[routes.usage_record]\nqueue_type = "stream"\n', "queue_type: Input should be"),
        ("[defaults]\nconcurrency = 2\n", "unknown top-level key(s) ['defaults']"),
        ("[routes.usage_record\n", "not valid TOML"),
        (
            '[routes.usage_record]\nconcurrency = 2\n[routes."telecom.usage_record"]\n',
            "configured twice",
        ),
    ],
)
def test_a_wrong_file_is_refused_with_an_error_naming_the_file_and_the_problem(
    tmp_path: Path, text: str, says: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RouteConfigError) as caught:
        load_routes_file(path)
    assert str(path) in str(caught.value)
    assert says in str(caught.value)


def test_a_missing_file_is_refused_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(RouteConfigError, match="cannot read"):
        load_routes_file(tmp_path / "absent.toml")


def test_the_process_wide_concurrency_applies_where_the_file_is_silent(tmp_path: Path) -> None:
    found = load_routes_file(write(tmp_path, "[routes.usage_record]\nconcurrency = 2\n"))
    settings = Settings(concurrency=5, route_settings=found)
    assert settings.concurrency_for("telecom.usage_record") == 2
    assert settings.concurrency_for("telecom.all_expired") == 5


def test_retry_settings_defaults_match_seed003() -> None:
    config = RetrySettings()
    assert (config.max_attempts, config.backoff, config.base_s, config.max_delay_s) == (
        25,
        "seed003",
        1.0,
        7 * 86400.0,
    )


@pytest.mark.parametrize("attempts", [1, 1000])
def test_retry_settings_accepts_max_attempts_at_both_bounds(attempts: int) -> None:
    assert RetrySettings(max_attempts=attempts).max_attempts == attempts


@pytest.mark.parametrize("attempts", [0, -1, 1001])
def test_retry_settings_refuses_max_attempts_outside_1_to_1000(attempts: int) -> None:
    with pytest.raises(ValidationError, match="max_attempts"):
        RetrySettings(max_attempts=attempts)


def test_retry_settings_refuses_an_unknown_field() -> None:
    with pytest.raises(ValidationError, match="max_retries"):
        RetrySettings.model_validate({"max_retries": 3})


def test_retry_settings_refuses_an_unknown_backoff_kind() -> None:
    with pytest.raises(ValidationError, match="backoff"):
        RetrySettings.model_validate({"backoff": "linear"})


@pytest.mark.parametrize("field", ["base_s", "max_delay_s"])
def test_retry_settings_refuses_negative_seconds(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        RetrySettings.model_validate({field: -1})
