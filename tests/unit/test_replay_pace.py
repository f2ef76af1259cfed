"""A replay run's pace and verdict (domain/replay_pace.py): small batches at a low rate, each
batch due when the run's clock says, and a stop only once enough of its first messages are
decided and too many of them failed again."""

from __future__ import annotations

import pytest

from domain.replay_pace import (
    BATCH,
    Limits,
    Pacer,
    Progress,
    Window,
    awaiting_verdict,
    batch_size,
    failing,
)


def test_a_low_rate_sends_small_batches_and_no_rate_sends_full_ones() -> None:
    assert batch_size(None) == BATCH
    assert batch_size(1) == 1
    assert batch_size(50) == 10
    assert batch_size(100_000) == BATCH


def test_the_pacer_makes_each_batch_wait_until_its_messages_are_due() -> None:
    pacer = Pacer(rate=10, started=100.0)
    assert pacer.wait_before(100.0, 2) == pytest.approx(0.2)  # no burst at the start
    assert pacer.wait_before(100.2, 2) == 0.0
    pacer.record(2)
    assert pacer.wait_before(100.2, 2) == pytest.approx(0.2)
    assert pacer.wait_before(101.0, 2) == 0.0
    assert Pacer(rate=None, started=0.0).wait_before(0.0, 200) == 0.0


def test_a_run_stops_only_once_enough_are_decided_and_too_many_of_them_failed_again() -> None:
    limits = Limits(check_first=20, max_failed=0.5, min_decided=5)
    assert failing(Window(sent=20, applied=0, failed=4), limits) is None  # 4 decided: too few
    assert failing(Window(sent=20, applied=2, failed=3), limits) is not None
    assert failing(Window(sent=20, applied=3, failed=3), limits) is None  # 50% is not > 50%
    # fewer sent than min_decided: judged once all of them are decided
    reason = failing(Window(sent=2, applied=0, failed=2), limits)
    assert reason is not None
    assert "2 of the first 2" in reason


def test_a_run_holds_back_after_its_window_until_every_one_of_it_is_decided() -> None:
    limits = Limits(check_first=10)
    assert not awaiting_verdict(Window(sent=9, applied=0, failed=0), limits, left=100)
    assert awaiting_verdict(Window(sent=10, applied=9, failed=0), limits, left=100)
    assert not awaiting_verdict(Window(sent=10, applied=9, failed=1), limits, left=100)
    assert not awaiting_verdict(Window(sent=10, applied=0, failed=0), limits, left=0)


def test_progress_says_what_is_left_the_rate_achieved_and_when_it_ends() -> None:
    p = Progress(
        1,
        "running",
        total=100,
        sent=40,
        skipped=10,
        failed_again=2,
        applied=30,
        leg_sent=40,
        leg_seconds=4.0,
    )
    assert (p.left, p.rate, p.eta_seconds) == (50, 10.0, 5.0)
    fields = p.fields()
    assert {k: fields[k] for k in ("sent", "failed_again", "left", "rate", "eta_s")} == {
        "sent": 40,
        "failed_again": 2,
        "left": 50,
        "rate": 10.0,
        "eta_s": 5.0,
    }
    assert Progress(1, "running", 10, 0, 0, 0, 0, 0, 0.0).eta_seconds is None


def test_limits_refuse_a_share_outside_zero_to_one() -> None:
    with pytest.raises(ValueError, match="share"):
        Limits(max_failed=1.5)
