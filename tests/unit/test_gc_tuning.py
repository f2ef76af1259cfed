"""infra/gc_tuning.py: a started process's objects are frozen and young ones collected less
often (each test puts the collector back as it was)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from infra.gc_tuning import GEN0_THRESHOLD, tune_for_throughput


@pytest.fixture
def collector_restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.usefixtures("collector_restored")
def test_tuning_freezes_what_lives_and_raises_only_the_youngest_threshold() -> None:
    before = gc.get_threshold()
    gc.unfreeze()

    tune_for_throughput()

    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2])
    assert before[0] < GEN0_THRESHOLD


@pytest.mark.usefixtures("collector_restored")
def test_cyclic_garbage_made_after_tuning_is_still_collected() -> None:
    tune_for_throughput()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gc.collect()  # nothing of the cycle is frozen, so a full collection finds it
    alive_before = len(gc.get_objects())
    del a, b
    found = gc.collect()

    assert found >= 2
    assert len(gc.get_objects()) < alive_before
