"""A usage record's billing record id (RecordUsage v2's usage_id) bills once per user, in the
pure domain: a repeat bills nothing and names where the first went; a failed record names none."""

from __future__ import annotations

import pytest

from domain.errors import NegativeUsageError
from domain.events import DuplicateUsage
from domain.model import BilledUsage
from tests.unit.queue_builders import BASIC, USER, active_queue, at, new_queue, of_type


def test_a_record_id_billed_once_bills_nothing_again_and_names_the_item_it_went_to() -> None:
    queue = active_queue(BASIC, BASIC)
    first = queue.current()
    assert first is not None
    queue.record_usage(10, 5, at(1), usage_id="cdr-1", recorded_at=at(0))
    before = queue.copy()
    events = queue.record_usage(10, 5, at(2), usage_id="cdr-1")
    assert events == [DuplicateUsage(USER, "cdr-1", first.id)]
    assert queue.items == before.items
    assert queue.usages == {"cdr-1": BilledUsage(first.id, 10, 5, at(0))}


def test_different_record_ids_and_records_without_one_all_bill() -> None:
    queue = active_queue(BASIC)
    queue.record_usage(1, 0, at(1), usage_id="a")
    queue.record_usage(2, 0, at(2), usage_id="b")
    queue.record_usage(4, 0, at(3))
    queue.record_usage(8, 0, at(4))  # without an id: never a repeat (message_id dedup only)
    active = queue.current()
    assert active is not None
    assert active.upload == 15
    assert set(queue.usages) == {"a", "b"}


def test_a_record_kept_as_unbilled_is_remembered_without_an_item() -> None:
    queue = new_queue()
    queue.record_usage(3, 4, at(1), usage_id="x")
    assert queue.usages == {"x": BilledUsage(None, 3, 4, None)}
    assert of_type(queue.record_usage(3, 4, at(2), usage_id="x"), DuplicateUsage) == [
        DuplicateUsage(USER, "x", None)
    ]
    assert (queue.unbilled_upload, queue.unbilled_download) == (3, 4)


def test_a_record_refused_as_invalid_is_not_remembered_so_a_corrected_resend_bills() -> None:
    queue = active_queue(BASIC)
    with pytest.raises(NegativeUsageError):
        queue.record_usage(-1, 0, at(1), usage_id="bad")
    assert queue.usages == {}
    queue.record_usage(1, 0, at(2), usage_id="bad")
    assert "bad" in queue.usages


def test_a_copy_of_the_queue_keeps_its_own_record_ids() -> None:
    queue = active_queue(BASIC)
    copy = queue.copy()
    copy.record_usage(1, 0, at(1), usage_id="only-in-the-copy")
    assert queue.usages == {}
