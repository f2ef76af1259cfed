"""consumers/retry_policy.py: the retry schedules (the default backoff, exponential, fixed), the
clamps, and the policy each route gets from the settings."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from consumers import retry_policy
from consumers.retry_policy import RetryPolicy, from_settings, policy_for, seed003_backoff
from events.routes import PACKAGE_ACTIVATE
from infra.route_config import RetrySettings
from infra.settings import Settings

ACTIVATE = PACKAGE_ACTIVATE.name  # "telecom.package_activate"


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


def test_seed003_backoff_draws_its_jitter_from_the_stdlib_randrange_by_default() -> None:
    assert seed003_backoff.__defaults__ == (random.randrange,)
