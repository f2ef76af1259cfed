"""The suite's Hypothesis profile (tests/conftest.py): property tests carry no timing assertion."""

from __future__ import annotations

from hypothesis import settings


def test_property_tests_have_no_deadline_even_with_settings_of_their_own() -> None:
    assert settings.default is not None
    assert settings.default.deadline is None
    # What `@settings(max_examples=...)` on a test makes: the profile's values otherwise.
    assert settings(max_examples=5).deadline is None
