"""stats.shared: counts that stopped at the cap become estimates from the size of the index they
were counted in; counts under the cap stay exact (infra/postgres/stats.py)."""

from __future__ import annotations

from infra.postgres.stats import shared


def test_counts_under_the_cap_are_exact_and_nothing_is_estimated() -> None:
    assert shared({"a": 3, "b": 999}, total=None, cap=1000) == ({"a": 3, "b": 999}, set())


def test_one_count_at_the_cap_takes_what_the_index_holds_beyond_the_exact_ones() -> None:
    figures, estimated = shared({"a": 1000, "b": 40}, total=250_040.0, cap=1000)
    assert figures == {"a": 250_000, "b": 40}
    assert estimated == {"a"}


def test_counts_at_the_cap_share_the_rest_by_their_weights_or_evenly_without() -> None:
    counted = {"a": 1000, "b": 1000, "c": 10}
    weighted, _ = shared(counted, total=100_010.0, weights={"a": 0.9, "b": 0.1}, cap=1000)
    assert weighted == {"a": 90_000, "b": 10_000, "c": 10}
    even, _ = shared(counted, total=100_010.0, weights={"a": 0.9}, cap=1000)  # b unknown
    assert even == {"a": 50_000, "b": 50_000, "c": 10}


def test_an_estimate_is_never_below_the_cap_even_without_statistics() -> None:
    stale, estimated = shared({"a": 1000, "b": 500}, total=900.0, cap=1000)
    assert stale == {"a": 1000, "b": 500}
    assert estimated == {"a"}
    never_analyzed, _ = shared({"a": 1000}, total=None, cap=1000)
    assert never_analyzed == {"a": 1000}
