"""`domain.records.record`: immutable to the type checker, plain (and so cheap) at run time,
compared and hashed by its fields like a frozen dataclass."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mypy import api

from domain.delivery import Decision, Fate
from domain.records import record


@record
class _Point:
    x: int
    y: int


def test_a_record_is_equal_and_hashed_by_its_fields_like_a_frozen_dataclass() -> None:
    assert _Point(1, 2) == _Point(1, 2)
    assert len({_Point(1, 2), _Point(1, 2), _Point(2, 1)}) == 2
    assert dataclasses.replace(_Point(1, 2), y=3) == _Point(1, 3)
    assert not hasattr(_Point(1, 2), "__dict__")  # slotted


def test_assigning_a_records_field_is_a_type_error(tmp_path: Path) -> None:
    """What keeps records immutable: mypy (`make check`) refuses the assignment. The snippet
    imports domain.records alone, so that mypy reads little beside it."""
    snippet = tmp_path / "assigns.py"
    snippet.write_text(
        "from domain.records import record\n"
        "@record\n"
        "class Point:\n"
        "    x: int\n"
        "point = Point(1)\n"
        "point.x = 2\n"
    )
    out, _, status = api.run(["--strict", "--no-incremental", str(snippet)])
    assert status == 1
    assert 'Property "x" defined in "Point" is read-only' in out
    assert Decision(Fate.ACKED).fate is Fate.ACKED  # and the real ones are records
    assert not hasattr(Decision(Fate.ACKED), "__dict__")
