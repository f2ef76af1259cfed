"""The failure policy: retry schedules, error descriptions, dead-letter filing and replay, and
the operator's duration parsing. Pure unit tests: no Postgres, no RabbitMQ, no clock waits."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from types import SimpleNamespace
from typing import Any
from uuid import UUID, uuid4

import pytest
import typer
from pydantic import ValidationError

from consumers import ingest, retry_policy
from consumers.delivery import describe
from consumers.dlq_cli import parse_duration, parse_since
from consumers.ingest import to_dead_letter
from consumers.retry_policy import RetryPolicy, from_settings, policy_for, seed003_backoff
from events.decoding import RawDelivery
from events.envelope import (
    CONTENT_TYPE,
    H_ATTEMPT,
    H_DEAD_AT,
    H_DEAD_CONSUMER,
    H_DEAD_ERROR,
    H_DEAD_REASON,
    H_DEAD_TRACEBACK,
    H_REPLAY_GENERATION,
    H_REPLAY_OF,
    H_SCHEMA_VERSION,
    H_SEQ,
    H_USER_ID,
    jsonable,
    republished_headers,
)
from events.routes import PACKAGE_ACTIVATE, ROUTES
from infra.postgres.dead_letters import Filter, NewDeadLetter
from infra.postgres.outbox import OutboxMessage
from infra.postgres.replay import _replay_message
from infra.route_config import RetrySettings
from infra.settings import Settings

ACTIVATE = PACKAGE_ACTIVATE.name  # "telecom.package_activate"
THIS_FILE = "tests/unit/test_failure_policy.py"


def zero(_n: int) -> int:
    return 0


def highest(n: int) -> int:
    return n - 1


# --- consumers/retry_policy.py: seed003_backoff -------------------------------------------------


@pytest.mark.parametrize(("attempt", "expected"), [(1, 16.0), (2, 31.0), (3, 96.0), (10, 10015.0)])
def test_seed003_backoff_is_attempt_to_the_fourth_plus_15_when_jitter_is_zero(
    attempt: int, expected: float
) -> None:
    assert seed003_backoff(attempt, rand=zero) == expected


@pytest.mark.parametrize(("attempt", "expected"), [(1, 34.0), (2, 58.0), (3, 132.0)])
def test_seed003_backoff_adds_at_most_nine_times_attempt_plus_one_of_jitter(
    attempt: int, expected: float
) -> None:
    assert seed003_backoff(attempt, rand=highest) == expected


def test_seed003_backoff_draws_its_jitter_from_rand_of_ten() -> None:
    asked: list[int] = []

    def rand(n: int) -> int:
        asked.append(n)
        return 4

    assert seed003_backoff(2, rand=rand) == 2**4 + 15 + 4 * 3
    assert asked == [10]


def test_seed003_backoff_returns_a_float() -> None:
    assert isinstance(seed003_backoff(1, rand=zero), float)


@pytest.mark.parametrize("attempt", [1, 2, 5, 24])
def test_seed003_backoff_with_real_randomness_stays_on_the_schedule_grid(attempt: int) -> None:
    low = attempt**4 + 15
    for _ in range(200):
        delay = seed003_backoff(attempt)
        assert low <= delay <= low + 9 * (attempt + 1)
        assert (delay - low) % (attempt + 1) == 0


# --- consumers/retry_policy.py: RetryPolicy ----------------------------------------------------


def test_default_policy_gives_25_deliveries_so_attempt_24_is_retried_and_25_is_buried() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 25
    assert policy.delay_after(24) is not None
    assert policy.delay_after(25) is None
    assert policy.delay_after(26) is None


def test_default_policy_uses_seed003_and_a_seven_day_cap() -> None:
    policy = RetryPolicy()
    assert policy.backoff is seed003_backoff
    assert policy.max_delay_s == 7 * 86400.0


def test_default_schedule_runs_from_16_seconds_to_under_four_days_unclamped() -> None:
    low = RetryPolicy(backoff=lambda a: seed003_backoff(a, rand=zero))
    high = RetryPolicy(backoff=lambda a: seed003_backoff(a, rand=highest))
    assert low.delay_after(1) == 16.0
    # The last retry's longest pause: 24^4 + 15 + 9 * 25, below the 7-day cap.
    assert high.delay_after(24) == 332016.0
    assert high.max_delay_s > 332016.0


def test_delay_after_returns_the_backoff_of_that_attempt() -> None:
    seen: list[int] = []

    def backoff(attempt: int) -> float:
        seen.append(attempt)
        return attempt * 10.0

    policy = RetryPolicy(max_attempts=5, backoff=backoff, max_delay_s=1000.0)
    assert [policy.delay_after(a) for a in (1, 2, 3, 4)] == [10.0, 20.0, 30.0, 40.0]
    assert seen == [1, 2, 3, 4]


def test_delay_after_does_not_call_the_backoff_once_attempts_are_exhausted() -> None:
    def backoff(_attempt: int) -> float:
        raise AssertionError("backoff must not be asked after the last attempt")

    policy = RetryPolicy(max_attempts=3, backoff=backoff)
    assert policy.delay_after(3) is None


def test_delay_after_clamps_a_long_backoff_to_max_delay() -> None:
    policy = RetryPolicy(max_attempts=5, backoff=lambda _a: 1e9, max_delay_s=100.0)
    assert policy.delay_after(1) == 100.0


def test_delay_after_clamps_a_negative_backoff_to_zero() -> None:
    policy = RetryPolicy(max_attempts=5, backoff=lambda _a: -5.0)
    assert policy.delay_after(1) == 0.0


def test_a_policy_of_one_attempt_never_retries() -> None:
    assert RetryPolicy(max_attempts=1).delay_after(1) is None


# --- consumers/retry_policy.py: from_settings / policy_for -------------------------------------


def test_from_settings_fixed_waits_base_s_after_every_attempt() -> None:
    policy = from_settings(RetrySettings(max_attempts=4, backoff="fixed", base_s=7.5))
    assert policy.max_attempts == 4
    assert [policy.delay_after(a) for a in (1, 2, 3)] == [7.5, 7.5, 7.5]
    assert policy.delay_after(4) is None


def test_from_settings_fixed_is_still_clamped_by_max_delay_s() -> None:
    policy = from_settings(RetrySettings(backoff="fixed", base_s=500.0, max_delay_s=60.0))
    assert policy.max_delay_s == 60.0
    assert policy.delay_after(1) == 60.0


def test_from_settings_seed003_uses_the_seed003_backoff() -> None:
    policy = from_settings(RetrySettings(backoff="seed003", max_attempts=9, max_delay_s=123.0))
    assert policy.backoff is seed003_backoff
    assert (policy.max_attempts, policy.max_delay_s) == (9, 123.0)


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 2.0), (2, 4.0), (3, 8.0), (6, 64.0)])
def test_from_settings_exponential_draws_full_jitter_between_zero_and_base_times_two_to_n_minus_1(
    monkeypatch: pytest.MonkeyPatch, attempt: int, ceiling: float
) -> None:
    calls: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        calls.append((a, b))
        return b

    monkeypatch.setattr(retry_policy, "random", SimpleNamespace(uniform=uniform))
    policy = from_settings(RetrySettings(backoff="exponential", base_s=2.0, max_delay_s=1e6))
    assert policy.delay_after(attempt) == ceiling
    assert calls == [(0, ceiling)]


def test_from_settings_exponential_with_real_randomness_stays_within_its_bounds() -> None:
    policy = from_settings(RetrySettings(backoff="exponential", base_s=0.5, max_delay_s=3.0))
    for attempt in (1, 2, 3, 4, 10):
        ceiling = min(0.5 * 2 ** (attempt - 1), 3.0)
        for _ in range(100):
            delay = policy.delay_after(attempt)
            assert delay is not None
            assert 0.0 <= delay <= ceiling


def test_from_settings_exponential_is_clamped_by_max_delay_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retry_policy, "random", SimpleNamespace(uniform=lambda a, b: b))
    policy = from_settings(RetrySettings(backoff="exponential", base_s=1.0, max_delay_s=10.0))
    assert policy.delay_after(20) == 10.0


def test_policy_for_uses_the_route_override_and_the_default_for_other_routes() -> None:
    settings = Settings(
        retry=RetrySettings(max_attempts=10, backoff="fixed", base_s=1.0),
        retry_routes={ACTIVATE: RetrySettings(max_attempts=5, backoff="fixed", base_s=3.0)},
    )
    activate = policy_for(settings, ACTIVATE)
    other = policy_for(settings, "telecom.package_purchase")
    assert (activate.max_attempts, activate.delay_after(1)) == (5, 3.0)
    assert (other.max_attempts, other.delay_after(1)) == (10, 1.0)


def test_policy_for_default_settings_is_seed003_with_25_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PKGQ_RETRY", raising=False)
    monkeypatch.delenv("PKGQ_RETRY_ROUTES", raising=False)
    policy = policy_for(Settings(), ACTIVATE)
    assert policy.max_attempts == 25
    assert policy.backoff is seed003_backoff
    assert policy.delay_after(24) is not None
    assert policy.delay_after(25) is None


# --- infra/settings.py ------------------------------------------------------------------------


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


# --- consumers/delivery.py: describe ----------------------------------------------------------


def _explode(message: str) -> None:
    raise ValueError(message)


def _caught(fn: Callable[[], None]) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001  (the test wants whatever it raised)
        return exc
    raise AssertionError("expected an exception")


class _Outer:
    class InnerError(Exception):
        pass


def test_describe_names_the_type_the_message_and_the_repo_relative_raise_site() -> None:
    info = describe(_caught(lambda: _explode("the quota went negative")))
    assert info.error_type == "ValueError"
    assert info.message == "the quota went negative"
    assert THIS_FILE + ":" in info.location
    assert info.location.endswith(" in _explode")
    assert info.location == f"{THIS_FILE}:{_explode.__code__.co_firstlineno + 1} in _explode"


def test_describe_keeps_the_full_traceback_text_with_the_message() -> None:
    info = describe(_caught(lambda: _explode("the quota went negative")))
    assert info.traceback.startswith("Traceback (most recent call last)")
    assert "ValueError: the quota went negative" in info.traceback
    assert "_explode" in info.traceback


def test_describe_uses_the_type_name_as_message_when_the_message_is_empty() -> None:
    info = describe(_caught(lambda: _explode("")))
    assert info.message == "ValueError"


def test_describe_uses_the_qualified_name_of_a_nested_exception_class() -> None:
    def fail() -> None:
        raise _Outer.InnerError("inner")

    info = describe(_caught(fail))
    assert info.error_type == "_Outer.InnerError"
    assert info.location.endswith(" in fail")


def _parse_bad_json() -> None:
    json.loads("{")


def _build_bad_retry_settings() -> None:
    RetrySettings(max_attempts=0)


def test_describe_points_at_our_calling_line_when_the_stdlib_raised() -> None:
    info = describe(_caught(_parse_bad_json))
    assert info.error_type == "JSONDecodeError"
    line = _parse_bad_json.__code__.co_firstlineno + 1
    assert info.location == f"{THIS_FILE}:{line} in _parse_bad_json"
    assert "json/decoder.py" in info.traceback


def test_describe_skips_frames_of_libraries_installed_in_the_repo_virtualenv() -> None:
    info = describe(_caught(_build_bad_retry_settings))
    assert info.error_type == "ValidationError"
    line = _build_bad_retry_settings.__code__.co_firstlineno + 1
    assert info.location == f"{THIS_FILE}:{line} in _build_bad_retry_settings"
    assert "pydantic" in info.traceback


def test_describe_shows_only_the_file_name_when_no_frame_is_repo_code() -> None:
    exc = _caught(_parse_bad_json)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(THIS_FILE):
        tb = tb.tb_next
    assert tb is not None
    info = describe(exc.with_traceback(tb))
    assert re.fullmatch(r"decoder\.py:\d+ in \w+", info.location), info.location


def test_describe_gives_no_location_for_an_exception_that_was_never_raised() -> None:
    info = describe(KeyError("k"))
    assert info.location == ""
    assert info.error_type == "KeyError"
    assert "KeyError" in info.traceback


# --- consumers/ingest.py: to_dead_letter ------------------------------------------------------


def delivery(
    headers: dict[str, Any],
    *,
    routing_key: str | None = ACTIVATE,
    message_id: str | None = "m-1",
    body: bytes = b'{"x": 1}',
) -> RawDelivery:
    return RawDelivery(
        body=body,
        message_id=message_id,
        message_type="PackageActivateEvent",
        content_type=CONTENT_TYPE,
        timestamp=None,
        headers=headers,
        routing_key=routing_key,
    )


def x_death(**entry: Any) -> dict[str, Any]:
    return {"x-death": [entry]}


def test_a_broker_dead_letter_takes_reason_queue_route_and_count_from_x_death() -> None:
    headers = x_death(
        reason="expired", queue="q1", count=2, **{"routing-keys": [ACTIVATE]}, exchange="telecom"
    )
    dead = to_dead_letter(delivery(headers, routing_key="something.else"))
    assert dead.source == "broker"
    assert dead.reason == "expired"
    assert dead.route == ACTIVATE
    assert dead.consumer == "package_activate"
    assert dead.consumer == PACKAGE_ACTIVATE.short_name
    assert dead.attempts == 2
    assert dead.error_type == "BrokerDeadLetter"
    assert "'q1'" in dead.error_message
    assert "expired" in dead.error_message
    assert dead.error_location == "queue q1"
    assert dead.message_id == "m-1"
    assert dead.body == b'{"x": 1}'


def test_a_broker_dead_letter_on_a_foreign_routing_key_is_filed_under_its_queue() -> None:
    headers = x_death(reason="rejected", queue="other.queue", **{"routing-keys": ["shop.order"]})
    dead = to_dead_letter(delivery(headers, routing_key="shop.order"))
    assert dead.route == "shop.order"
    assert dead.consumer == "other.queue"


def test_a_broker_dead_letter_without_routing_keys_uses_the_delivery_routing_key() -> None:
    dead = to_dead_letter(delivery(x_death(reason="maxlen", queue="q2"), routing_key=ACTIVATE))
    assert dead.route == ACTIVATE
    assert dead.consumer == "package_activate"
    assert dead.attempts == 1


def test_a_broker_dead_letter_without_x_death_falls_back_to_the_first_death_headers() -> None:
    headers = {"x-first-death-reason": "delivery_limit", "x-first-death-queue": "q3"}
    dead = to_dead_letter(delivery(headers, routing_key="unknown.key"))
    assert dead.reason == "delivery_limit"
    assert dead.consumer == "q3"
    assert "'q3'" in dead.error_message


def test_a_broker_dead_letter_with_no_death_information_has_reason_unknown() -> None:
    dead = to_dead_letter(delivery({}))
    assert dead.source == "broker"
    assert dead.reason == "unknown"
    assert dead.attempts == 1


def test_a_broker_dead_letter_with_a_non_integer_count_counts_as_one_attempt() -> None:
    dead = to_dead_letter(delivery(x_death(reason="expired", queue="q1", count="many")))
    assert dead.attempts == 1


def test_a_last_resort_copy_takes_reason_error_consumer_and_traceback_from_pkgq_headers() -> None:
    headers = {
        H_DEAD_REASON: "handler_error",
        H_DEAD_ERROR: "ValueError: boom",
        H_DEAD_CONSUMER: "package_activate",
        H_DEAD_TRACEBACK: "Traceback (most recent call last):\nValueError: boom\n",
        H_DEAD_AT: "2024-01-02T03:04:05+00:00",
    }
    dead = to_dead_letter(delivery(headers, routing_key=ACTIVATE))
    assert dead.source == "consumer"
    assert dead.reason == "handler_error"
    assert dead.error_type == "ValueError"
    assert dead.error_message == "boom"
    assert dead.consumer == "package_activate"
    assert dead.route == ACTIVATE
    assert dead.traceback == "Traceback (most recent call last):\nValueError: boom\n"
    assert dead.error_location == "consumer failure path"
    assert dead.attempts == 1


def test_a_last_resort_copy_splits_the_error_only_at_the_first_colon() -> None:
    headers = {H_DEAD_REASON: "handler_error", H_DEAD_ERROR: "KeyError: 'a: b'"}
    dead = to_dead_letter(delivery(headers))
    assert (dead.error_type, dead.error_message) == ("KeyError", "'a: b'")


def test_a_last_resort_copy_without_consumer_header_uses_the_route_short_name() -> None:
    headers = {H_DEAD_REASON: "publish_failed", H_DEAD_ERROR: "OSError: gone"}
    dead = to_dead_letter(delivery(headers, routing_key=ACTIVATE))
    assert dead.consumer == "package_activate"
    assert dead.traceback is None


def test_pkgq_dead_headers_on_a_broker_dead_letter_are_not_believed() -> None:
    # The broker adds x-death; pkgq's last-resort copy has none (it strips any it carried), so
    # x-pkgq-dead-* next to x-death were written by whoever published the original message.
    headers = {**x_death(reason="expired", queue="q1"), H_DEAD_REASON: "handler_error"}
    dead = to_dead_letter(delivery(headers))
    assert dead.source == "broker"
    assert dead.reason == "expired"


def test_an_integer_dead_traceback_header_is_filed_as_text() -> None:
    dead = to_dead_letter(delivery({H_DEAD_REASON: "handler_error", H_DEAD_TRACEBACK: 42}))
    assert dead.traceback == "42"


@pytest.mark.parametrize(
    "value",
    [
        {"a": {"b": {"c": 1}}},
        12,
        ["x"] * 3,
        "x" * 100_000,
        None,
        True,
    ],
)
def test_a_last_resort_copy_with_any_type_of_pkgq_header_is_filed_with_bounded_text(
    value: object,
) -> None:
    headers = {
        H_DEAD_REASON: value if value is not None else "r",
        H_DEAD_ERROR: value,
        H_DEAD_CONSUMER: value,
        H_DEAD_TRACEBACK: value,
    }
    dead = to_dead_letter(delivery(headers))
    assert dead.source == "consumer"
    assert len(dead.reason) <= 200
    assert len(dead.consumer) <= 300
    assert len(dead.error_message) <= 5000
    assert dead.traceback is None or len(dead.traceback) <= 17000


def test_a_dead_letter_whose_headers_cannot_be_read_is_filed_in_its_safe_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreadable(*_: object) -> object:
        raise RecursionError("deeper than anything expected")

    monkeypatch.setattr(ingest, "jsonable", unreadable)
    first = to_dead_letter(delivery({"x": 1}, message_id="m-1"))
    second = to_dead_letter(delivery({"x": 1}, message_id="m-2"))
    assert (first.reason, first.source, first.body) == ("unstorable", "broker", b'{"x": 1}')
    assert "RecursionError" in first.error_message
    assert first.dedup_key() != second.dedup_key()  # same body, two messages: two rows


def test_a_header_table_nested_600_deep_is_kept_to_a_bounded_depth() -> None:
    deep: object = "bottom"
    for _ in range(600):
        deep = {"a": deep}
    dead = to_dead_letter(delivery({"deep": deep, H_USER_ID: 7}))
    depth, level = 0, dead.headers["deep"]
    while isinstance(level, dict):
        depth, level = depth + 1, level["a"]
    assert depth < 20
    assert "too deep" in str(level)


def test_the_x_user_id_header_is_parsed_into_a_uuid() -> None:
    user = uuid4()
    assert to_dead_letter(delivery({H_USER_ID: str(user)})).user_id == user


def test_an_x_user_id_header_sent_as_bytes_is_parsed_into_a_uuid() -> None:
    user = uuid4()
    assert to_dead_letter(delivery({H_USER_ID: str(user).encode()})).user_id == user


@pytest.mark.parametrize("value", ["not-a-uuid", "", 42])
def test_an_invalid_x_user_id_header_gives_no_user(value: object) -> None:
    assert to_dead_letter(delivery({H_USER_ID: value})).user_id is None


def test_a_missing_x_user_id_header_gives_no_user() -> None:
    assert to_dead_letter(delivery({})).user_id is None


def test_dead_letter_headers_are_made_json_ready() -> None:
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    headers = {
        "x-blob": b"\xffabc",
        "x-when": when,
        "x-price": Decimal("1.50"),
        **x_death(reason="expired", queue="q1", time=when, **{"routing-keys": [b"rk"]}),
    }
    dead = to_dead_letter(delivery(headers, routing_key=None))
    assert dead.headers["x-blob"] == "\ufffdabc"
    assert dead.headers["x-when"] == "2024-01-02T03:04:05+00:00"
    assert dead.headers["x-price"] == "1.50"
    assert dead.headers["x-death"][0]["time"] == "2024-01-02T03:04:05+00:00"
    assert dead.route == "rk"
    assert json.loads(json.dumps(dead.headers)) == dead.headers


# --- infra/postgres/dead_letters.py: NewDeadLetter.dedup_key ----------------------------------


def dead_letter(**overrides: Any) -> NewDeadLetter:
    values: dict[str, Any] = {
        "source": "consumer",
        "route": ACTIVATE,
        "consumer": "package_activate",
        "message_id": "7b0c6d3e-2f55-4a51-9a3b-0e6a2c1d4f00",
        "user_id": None,
        "message_type": "PackageActivateEvent",
        "content_type": CONTENT_TYPE,
        "body": b'{"a": 1}',
        "headers": {"x-seq": 3, "x-attempt": 2},
        "reason": "max_attempts",
        "error_type": "ValueError",
        "error_message": "boom",
    }
    values.update(overrides)
    return NewDeadLetter(**values)


HASH_KEY = re.compile(r"^(consumer|broker):[\w.]+:[0-9a-f]{64}$")


def test_dedup_key_of_a_consumer_failure_is_consumer_and_message_id() -> None:
    dead = dead_letter()
    assert dead.dedup_key() == "package_activate:7b0c6d3e-2f55-4a51-9a3b-0e6a2c1d4f00"


@pytest.mark.parametrize("message_id", [None, ""])
def test_dedup_key_of_a_consumer_failure_without_message_id_is_a_sha256_of_headers_and_body(
    message_id: str | None,
) -> None:
    dead = dead_letter(message_id=message_id)
    digest = hashlib.sha256(b'{"x-attempt": 2, "x-seq": 3}\0{"a": 1}').hexdigest()
    assert dead.dedup_key() == f"consumer:package_activate:{digest}"


def test_dedup_key_of_a_broker_dead_letter_is_hashed_even_with_a_message_id() -> None:
    key = dead_letter(source="broker").dedup_key()
    assert HASH_KEY.match(key)
    assert key.startswith("broker:package_activate:")
    assert "7b0c6d3e" not in key


def test_dedup_key_hash_is_the_same_for_the_same_body_and_headers_in_any_key_order() -> None:
    one = dead_letter(source="broker", headers={"a": 1, "b": [1, 2]})
    two = dead_letter(source="broker", headers={"b": [1, 2], "a": 1}, reason="other")
    assert one.dedup_key() == two.dedup_key()


def test_dedup_key_hash_differs_when_the_body_differs() -> None:
    one = dead_letter(source="broker", body=b"one")
    two = dead_letter(source="broker", body=b"two")
    assert one.dedup_key() != two.dedup_key()


def test_dedup_key_hash_differs_when_the_headers_differ() -> None:
    one = dead_letter(source="broker", headers={"x-death": [{"count": 1}]})
    two = dead_letter(source="broker", headers={"x-death": [{"count": 2}]})
    assert one.dedup_key() != two.dedup_key()


def test_dedup_key_hash_differs_between_broker_and_consumer_sources() -> None:
    broker = dead_letter(source="broker", message_id=None)
    consumer = dead_letter(source="consumer", message_id=None)
    assert broker.dedup_key() != consumer.dedup_key()


# --- infra/postgres/dead_letters.py: Filter.where ---------------------------------------------


def _like_matches(text: str, pattern: str) -> bool:
    """Postgres ILIKE with its default escape character (backslash)."""
    regex = ""
    chars = iter(pattern)
    for char in chars:
        if char == "\\":
            regex += re.escape(next(chars, ""))
        elif char == "%":
            regex += ".*"
        elif char == "_":
            regex += "."
        else:
            regex += re.escape(char)
    return re.fullmatch(regex, text, re.IGNORECASE | re.DOTALL) is not None


def test_an_empty_filter_matches_everything_with_no_arguments() -> None:
    assert Filter().where() == ("true", [])


def test_filter_by_route_error_and_status_numbers_its_placeholders_in_order() -> None:
    sql, args = Filter(route=ACTIVATE, error="boom", status="buried").where()
    assert sql == (
        "d.route = $1"
        " AND (d.reason || ' ' || d.error_type || ' ' || d.error_message) ILIKE $2"
        " AND d.status = $3::telecom.dead_letter_status"
    )
    assert args == [ACTIVATE, "%boom%", "buried"]


def test_filter_with_every_field_numbers_placeholders_1_to_7_matching_the_arguments() -> None:
    since = datetime(2024, 1, 1, tzinfo=UTC)
    older = datetime(2024, 2, 1, tzinfo=UTC)
    sql, args = Filter(
        ids=(3, 4),
        route=ACTIVATE,
        error="Err",
        group="g1",
        since=since,
        older_than=older,
        status="replayed",
        limit=10,
    ).where()
    assert re.findall(r"\$(\d+)", sql) == ["1", "2", "3", "4", "5", "6", "7"]
    assert args == [[3, 4], ACTIVATE, "%Err%", "g1", since, older, "replayed"]
    assert "d.id = ANY($1::bigint[])" in sql
    assert "d.group_key = $4" in sql
    assert "d.last_failed_at >= $5" in sql
    assert "d.last_failed_at < $6" in sql
    assert "LIMIT" not in sql


def test_filter_placeholders_follow_only_the_fields_that_are_set() -> None:
    sql, args = Filter(group="g1", status="buried").where()
    assert sql == "d.group_key = $1 AND d.status = $2::telecom.dead_letter_status"
    assert args == ["g1", "buried"]


def test_filter_error_pattern_matches_the_text_anywhere_ignoring_case() -> None:
    _, args = Filter(error="Quota").where()
    assert _like_matches("max_attempts ValueError the quota went negative", args[0])
    assert not _like_matches("max_attempts ValueError boom", args[0])


def test_filter_error_is_a_literal_substring_so_underscore_and_percent_are_not_wildcards() -> None:
    sql, args = Filter(error="not_found").where()
    assert "ILIKE" in sql
    assert _like_matches("handler_error KeyError not_found", args[0])
    assert not _like_matches("handler_error KeyError notXfound", args[0])
    _, args = Filter(error="100%").where()
    assert not _like_matches("100 users", args[0])


# --- infra/postgres/replay.py: _replay_message ------------------------------------------


MESSAGE_ID = "5f2d9c1e-8a4b-4c3d-9e2f-1a2b3c4d5e6f"
USER = UUID("0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")


def replay_row(**overrides: Any) -> dict[str, Any]:
    headers = {
        H_SCHEMA_VERSION: 1,
        H_USER_ID: str(USER),
        H_SEQ: 7,
        H_ATTEMPT: 25,
        "traceparent": "00-abc-def-01",
        "x-death": [{"reason": "rejected", "queue": "q1", "count": 1}],
        "x-first-death-reason": "rejected",
        "x-first-death-queue": "q1",
        "x-first-death-exchange": "telecom",
        H_DEAD_REASON: "handler_error",
        H_DEAD_ERROR: "ValueError: boom",
        H_DEAD_TRACEBACK: "Traceback ...",
    }
    row: dict[str, Any] = {
        "id": 42,
        "route": ACTIVATE,
        "message_id": MESSAGE_ID,
        "user_id": USER,
        "message_type": "PackageActivateEvent",
        "body": b'{"user_id": "x"}',
        "headers": json.dumps(headers),
        "replay_count": 3,
    }
    row.update(overrides)
    return row


def replayed(row: dict[str, Any]) -> OutboxMessage:
    message = _replay_message(row)
    assert isinstance(message, OutboxMessage), message
    return message


def test_replay_refuses_a_dead_letter_on_an_unknown_route() -> None:
    result = _replay_message(replay_row(route="shop.order"))
    assert isinstance(result, str)
    assert "'shop.order'" in result
    assert "not a pkgq route" in result


@pytest.mark.parametrize("message_id", ["not-a-uuid", None, ""])
def test_replay_refuses_a_dead_letter_whose_message_id_is_not_a_uuid(
    message_id: str | None,
) -> None:
    result = _replay_message(replay_row(message_id=message_id))
    assert isinstance(result, str)
    assert "is not a UUID" in result
    assert repr(message_id) in result


def test_replay_sends_the_same_message_to_the_same_route() -> None:
    message = replayed(replay_row())
    assert message.route == ACTIVATE
    assert message.message_id == UUID(MESSAGE_ID)
    assert message.message_type == "PackageActivateEvent"
    assert message.schema_version == 1
    assert message.body == b'{"user_id": "x"}'
    assert message.user_id == USER
    assert message.seq == 7
    assert message.available_at is None


def test_replay_drops_the_failure_marks_and_restarts_the_attempt_count() -> None:
    headers = replayed(replay_row()).headers
    for gone in (
        "x-death",
        "x-first-death-reason",
        "x-first-death-queue",
        "x-first-death-exchange",
        H_DEAD_REASON,
        H_DEAD_ERROR,
        H_DEAD_TRACEBACK,
    ):
        assert gone not in headers
    assert headers[H_ATTEMPT] == 1
    assert headers[H_REPLAY_OF] == 42
    assert headers["traceparent"] == "00-abc-def-01"
    assert headers[H_USER_ID] == str(USER)
    assert headers[H_SEQ] == 7


def test_replay_dedup_key_is_replay_id_and_replay_count() -> None:
    assert replayed(replay_row()).dedup_key == "replay:42:3"
    assert replayed(replay_row(replay_count=0)).dedup_key == "replay:42:0"


def test_replay_accepts_headers_already_decoded_into_a_dict() -> None:
    headers = {H_SCHEMA_VERSION: 1, H_SEQ: "12", "x-death": []}
    message = replayed(replay_row(headers=headers))
    assert message.seq == 12
    assert "x-death" not in message.headers
    assert message.headers[H_ATTEMPT] == 1


def test_replay_without_headers_uses_the_route_schema_version_and_no_seq() -> None:
    message = replayed(replay_row(headers=None, message_type=None, body=memoryview(b"{}")))
    assert message.schema_version == PACKAGE_ACTIVATE.schema_version
    assert message.message_type == PACKAGE_ACTIVATE.message_type
    assert message.seq is None
    assert message.body == b"{}"
    assert message.headers == {H_ATTEMPT: 1, H_REPLAY_OF: 42, H_REPLAY_GENERATION: 4}


@pytest.mark.parametrize("seq", ["abc", -1, 1.5, True])
def test_replay_drops_a_seq_header_that_is_not_a_natural_number(seq: object) -> None:
    assert replayed(replay_row(headers={H_SEQ: seq})).seq is None


def test_replay_refuses_rather_than_crashes_on_a_non_numeric_schema_version_header() -> None:
    result = _replay_message(replay_row(headers={H_SCHEMA_VERSION: "v1"}))
    assert isinstance(result, str)


@pytest.mark.parametrize("version", [10**12, "9" * 4000, -1, {"v": 1}])
def test_replay_refuses_a_schema_version_no_column_can_hold(version: object) -> None:
    result = _replay_message(replay_row(headers={H_SCHEMA_VERSION: version}))
    assert isinstance(result, str)
    assert len(result) < 200


def test_replay_drops_a_seq_beyond_what_a_bigint_holds() -> None:
    assert replayed(replay_row(headers={H_SEQ: "9" * 4000})).seq is None


# --- events/envelope.py: jsonable and republished_headers -------------------------------------


def test_jsonable_turns_amqp_values_into_plain_json_values() -> None:
    when = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    user = uuid4()
    value = {
        "bytes": b"abc",
        "bytearray": bytearray(b"xyz"),
        "bad-utf8": b"a\xffb",
        "when": when,
        "decimal": Decimal("2.5"),
        "uuid": user,
        "tuple": (1, b"2"),
        "nested": {"inner": [when, None, True, 1.5]},
        1: "int key",
    }
    assert jsonable(value) == {
        "bytes": "abc",
        "bytearray": "xyz",
        "bad-utf8": "a\ufffdb",
        "when": "2024-05-06T07:08:09+00:00",
        "decimal": "2.5",
        "uuid": str(user),
        "tuple": [1, "2"],
        "nested": {"inner": ["2024-05-06T07:08:09+00:00", None, True, 1.5]},
        "1": "int key",
    }


@pytest.mark.parametrize("value", [None, True, False, 0, -3, 2.5, "text"])
def test_jsonable_leaves_json_scalars_unchanged(value: object) -> None:
    result = jsonable(value)
    assert result == value
    assert type(result) is type(value)


def test_republished_headers_drop_broker_and_pkgq_dead_marks_and_apply_updates() -> None:
    original = {
        "x-death": [{"count": 1}],
        "x-first-death-exchange": "telecom",
        "x-first-death-queue": "q1",
        "x-first-death-reason": "rejected",
        H_DEAD_REASON: "handler_error",
        H_DEAD_AT: "2024-01-01T00:00:00+00:00",
        "x-pkgq-dead-anything": "x",
        H_USER_ID: "u",
        H_ATTEMPT: 4,
        "x-pkgq-first-failed-at": "2024-01-01T00:00:00+00:00",
    }
    kept = republished_headers(original, {H_ATTEMPT: 5, "x-new": "n"})
    assert kept == {
        H_USER_ID: "u",
        H_ATTEMPT: 5,
        "x-pkgq-first-failed-at": "2024-01-01T00:00:00+00:00",
        "x-new": "n",
    }


def test_republished_headers_leave_the_original_headers_untouched() -> None:
    original = {"x-death": [], H_ATTEMPT: 1}
    republished_headers(original, {H_ATTEMPT: 2})
    assert original == {"x-death": [], H_ATTEMPT: 1}


# --- consumers/dlq_cli.py: parse_duration and parse_since -------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
        ("1.5h", timedelta(minutes=90)),
        (" 30 m ", timedelta(minutes=30)),
        ("0s", timedelta(0)),
    ],
)
def test_parse_duration_reads_seconds_minutes_hours_days_and_weeks(
    text: str, expected: timedelta
) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "ten", "90", "5x", "-1h", "2 hours", "h", "1h30m"])
def test_parse_duration_refuses_garbage_with_a_bad_parameter_error(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="is not a duration"):
        parse_duration(text)


def test_parse_since_none_is_none() -> None:
    assert parse_since(None) is None


def test_parse_since_keeps_the_offset_of_an_aware_iso_time() -> None:
    moment = parse_since("2024-05-01T12:00:00+02:00")
    assert moment == datetime(2024, 5, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    assert moment is not None
    assert moment.utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:00:00", datetime(2024, 5, 1, 12, tzinfo=UTC)),
        ("2024-05-01", datetime(2024, 5, 1, tzinfo=UTC)),
    ],
)
def test_parse_since_reads_a_naive_iso_time_as_utc(text: str, expected: datetime) -> None:
    moment = parse_since(text)
    assert moment == expected
    assert moment is not None
    assert moment.tzinfo is UTC


def test_parse_since_reads_a_duration_as_that_long_before_now() -> None:
    before = datetime.now(UTC)
    moment = parse_since("2h")
    after = datetime.now(UTC)
    assert moment is not None
    assert moment.tzinfo is not None
    assert before - timedelta(hours=2) <= moment <= after - timedelta(hours=2)


def test_parse_since_refuses_text_that_is_neither_a_time_nor_a_duration() -> None:
    with pytest.raises(typer.BadParameter):
        parse_since("yesterday")


def test_seed003_backoff_draws_its_jitter_from_the_stdlib_randrange_by_default() -> None:
    assert seed003_backoff.__defaults__ == (random.randrange,)
