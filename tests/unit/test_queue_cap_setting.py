"""PKGQ_MAX_QUEUED_ITEMS: read from the environment, 1,000 (the domain's MAX_QUEUED_ITEMS) by
default, at least 1; `pkgq run` binds it to the purchase's handler only (consumers/runner.py)."""

from __future__ import annotations

import functools

import pytest
from pydantic import ValidationError

from consumers.handlers import package_purchase
from consumers.registry import HANDLERS
from consumers.runner import handler_for
from domain.errors import MAX_QUEUED_ITEMS
from events.routes import PACKAGE_PURCHASE, ROUTES
from infra.settings import Settings


def test_the_cap_defaults_to_the_domains_1000_and_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().max_queued_items == MAX_QUEUED_ITEMS == 1000
    monkeypatch.setenv("PKGQ_MAX_QUEUED_ITEMS", "25")
    assert Settings().max_queued_items == 25


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_a_cap_below_one_or_not_a_number_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PKGQ_MAX_QUEUED_ITEMS", value)
    with pytest.raises(ValidationError, match="max_queued_items"):
        Settings()


def test_run_binds_the_cap_to_the_purchase_handler_and_leaves_the_other_routes_alone() -> None:
    settings = Settings(max_queued_items=7)
    bound = handler_for(settings, PACKAGE_PURCHASE)
    assert isinstance(bound, functools.partial)
    assert bound.func is package_purchase.handle
    assert bound.keywords == {"max_queued_items": 7}
    for name, route in ROUTES.items():
        if name in HANDLERS and route is not PACKAGE_PURCHASE:
            assert handler_for(settings, route) is HANDLERS[name]
