"""infra/postgres/pool.py: rows into dataclasses by column name, and a batch into the arrays of
one `unnest` statement."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest

from infra.postgres.pool import columns, from_row, in_uuid_order


@dataclass(frozen=True)
class Terms:
    name: str
    duration: timedelta | None


@dataclass(frozen=True)
class Item:
    id: int
    terms: Terms
    routes: list[str]
    note: str = "none"
    seen: int = field(default=0, init=False)


def test_from_row_fills_every_field_from_the_column_of_the_same_name() -> None:
    row = {"id": 7, "terms": Terms("basic", None), "routes": ["a"], "note": "n", "extra": 1}

    assert from_row(Item, row) == Item(7, Terms("basic", None), ["a"], "n")


def test_from_row_takes_converted_fields_as_given_instead_of_their_columns() -> None:
    row: dict[str, Any] = {"id": 7, "routes": ("a", "b"), "note": "n", "name": "basic"}
    row["duration"] = None

    item = from_row(Item, row, terms=Terms(row["name"], row["duration"]), routes=["a", "b"])

    assert item == Item(7, Terms("basic", None), ["a", "b"], "n")


def test_from_row_refuses_a_row_without_a_fields_column() -> None:
    with pytest.raises(KeyError, match="note"):
        from_row(Item, {"id": 7, "terms": Terms("basic", None), "routes": []})


def test_columns_gives_one_array_per_name_in_row_order_and_follows_dotted_paths() -> None:
    items = [
        Item(1, Terms("basic", None), []),
        Item(2, Terms("monthly", timedelta(days=30)), [], "x"),
    ]

    assert columns(items, "id", "terms.name", "terms.duration", "note") == [
        [1, 2],
        ["basic", "monthly"],
        [None, timedelta(days=30)],
        ["none", "x"],
    ]


def test_columns_of_no_rows_are_empty_arrays() -> None:
    assert columns([], "id", "note") == [[], []]


def test_uuid_order_is_the_order_uuids_compare_in_and_drops_repeats() -> None:
    ids = [uuid4() for _ in range(200)]
    ids += ids[:50]

    assert in_uuid_order(ids) == sorted(set(ids))
