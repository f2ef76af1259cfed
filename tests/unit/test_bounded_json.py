"""JSON read with a bound on its nesting (events/bounded_json.py): measured without recursion,
refused at the door as invalid_json with its depth, and shown as text by everything that shows a
stored body (the console's body text and summary, the timeline's rows), also in a process whose
recursion limit a broker connection raised, where json.loads on deep enough JSON crashes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers import timeline_view
from events import bounded_json
from events.bounded_json import MAX_JSON_DEPTH, TooDeepError, depth_over
from events.decoding import BadMessageError, RawDelivery, decode
from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION
from events.routes import PACKAGE_QUEUING, USAGE_RECORD
from infra.postgres import console, timeline

ROOT = Path(__file__).resolve().parents[2]


def nesting(value: Any) -> int:
    """The reference: how deep a parsed JSON value nests arrays and objects (recursive)."""
    if isinstance(value, dict):
        return 1 + max(map(nesting, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(nesting, value), default=0)
    return 0


TRICKY_TEXT = st.text(alphabet='[]{}"\\ aé\n\u2028', max_size=8)
"""Strings full of what a scanner could take for structure: brackets, quotes, backslashes."""
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=40,
)


@given(JSON_VALUES, st.integers(min_value=0, max_value=6), st.booleans())
def test_the_depth_scan_agrees_with_a_recursive_count_on_any_json(
    value: Any, limit: int, ascii_only: bool
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    expected = nesting(value)
    found = depth_over(text, limit)
    assert found == (expected if expected > limit else None)
    assert depth_over(text.encode(), limit) == found


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"[" * 3000, 3000),  # invalid: never closed
        (b"[" * 2999 + b'{"user_id": ', 3000),
        (b"[" * 65 + b"]" * 65, 65),
        (b'{"a": "' + b"[" * 500 + b'"}', None),  # brackets in a string are text
        (b'["\\"' + b"[" * 500 + b'"]', None),  # after an escaped quote, still in the string
        (b"[]" * 100_000, None),  # many, but flat
        (b"[" * 64 + b"]" * 64, None),  # at the limit
    ],
)
def test_the_depth_scan_measures_nesting_outside_strings(text: bytes, depth: int | None) -> None:
    assert depth_over(text) == depth


def test_loads_refuses_deep_json_with_a_value_error_that_names_the_depth() -> None:
    with pytest.raises(TooDeepError, match="nested 3000 deep, deeper than the limit of 64"):
        bounded_json.loads(b"[" * 3000 + b"]" * 3000)
    with pytest.raises(ValueError, match="nested 65 deep"):
        bounded_json.loads("[" * 65 + "]" * 65)
    assert bounded_json.loads(b'{"a": [[1]]}') == {"a": [[1]]}


def test_what_will_not_parse_or_nests_too_deep_is_shown_as_its_text() -> None:
    deep = b"[" * 3000 + b"]" * 3000
    assert bounded_json.parsed_or_text(deep) == deep.decode()
    assert bounded_json.parsed_or_text(b"\xff{not json") == "\ufffd{not json"
    assert bounded_json.parsed_or_text(b'{"a": 1}') == {"a": 1}
    assert bounded_json.pretty(deep) == deep.decode()
    assert bounded_json.pretty(b'{"a":1}') == '{\n  "a": 1\n}'
    assert bounded_json.detail_of('{"actor": "olga"}') == {"actor": "olga"}
    assert bounded_json.detail_of(deep.decode()) == {"text": deep.decode()}
    assert bounded_json.detail_of("[1]") == {"text": "[1]"}
    assert bounded_json.detail_of({"already": "parsed"}) == {"already": "parsed"}


def delivery(body: bytes, version: int = USAGE_RECORD.schema_version) -> RawDelivery:
    return RawDelivery(
        body,
        str(uuid4()),
        USAGE_RECORD.message_type,
        CONTENT_TYPE,
        None,
        {H_SCHEMA_VERSION: version},
    )


@pytest.mark.parametrize(
    ("body", "depth"),
    [
        (b"[" * 2999 + b'{"user_id": ', 3000),  # invalid JSON
        (b'{"user_id": "u", "upload": ' + b"[" * 70 + b"]" * 70 + b"}", 71),  # valid JSON
    ],
)
def test_a_body_nested_deeper_than_the_limit_is_refused_as_invalid_json_with_its_depth(
    body: bytes, depth: int
) -> None:
    with pytest.raises(BadMessageError) as refused:
        decode(USAGE_RECORD, delivery(body), max_body_bytes=2**20)
    assert refused.value.reason == "invalid_json"
    assert refused.value.detail == f"JSON nested {depth} deep, deeper than the limit of 64"


def test_a_body_at_the_limit_is_parsed_and_refused_by_the_schema_alone() -> None:
    body = b'{"user_id": "u", "upload": ' + b"[" * 63 + b"]" * 63 + b"}"
    with pytest.raises(BadMessageError) as refused:
        decode(USAGE_RECORD, delivery(body), max_body_bytes=2**20)
    assert refused.value.reason == "schema_invalid"


def test_every_route_model_nests_well_within_the_limit() -> None:
    """The bound refuses only garbage: the deepest body a route takes (a list of item ids in an
    object) is two levels deep."""
    example = {"user_id": str(uuid4()), "item_ids": [1], "package_id": 1, "pushed_at": 0}
    body = PACKAGE_QUEUING.model.model_validate_json(json.dumps(example)).model_dump_json()
    assert nesting(json.loads(body)) == 2 < MAX_JSON_DEPTH


def test_the_console_shows_a_deep_stored_body_as_its_text() -> None:
    deep = b"[" * 3000 + b"]" * 3000
    assert console.body_text(memoryview(deep)) == deep.decode()
    assert console.body_summary(deep) == deep.decode()
    assert console.body_summary(b'{"user_id": "u", "a": [1]}') == '{"a": [1]}'


def test_the_timeline_shows_deep_bodies_and_details_as_text() -> None:
    deep = "[" * 3000 + "]" * 3000
    entry = timeline.Entry(
        at=datetime(2026, 1, 2, tzinfo=UTC),
        source="operator",
        kind="edit_replay",
        key="1",
        message_id=None,
        route=None,
        item_id=None,
        dead_letter_id=None,
        body=deep.encode(),
        detail={"actor": "olga", "original_body": deep, "edited_body": deep},
    )
    [row] = timeline_view.rows([entry])
    assert row["body"].startswith("[[[[")
    assert row["detail"]["original_body"].startswith("[[[[")
    assert row["summary"] == "operator olga: edit_replay"


PROBE = textwrap.dedent(
    """
    from events.decoding import BadMessageError, RawDelivery, decode
    from events.envelope import CONTENT_TYPE, H_SCHEMA_VERSION
    from events.routes import USAGE_RECORD
    from infra.postgres.console import body_summary, body_text
    from infra.rabbit.connection import allow_deep_headers

    allow_deep_headers()  # what every process that connects to the broker runs
    body = b'{"user_id": ' + b"[" * 300_000
    for version in (USAGE_RECORD.schema_version, USAGE_RECORD.schema_version + 1):
        raw = RawDelivery(
            body, "6f1c1d8e-0000-4000-8000-000000000000", USAGE_RECORD.message_type,
            CONTENT_TYPE, None, {H_SCHEMA_VERSION: version},
        )
        try:
            decode(USAGE_RECORD, raw, max_body_bytes=2**20)
        except BadMessageError as exc:
            print(exc.reason)
    print(body_text(body) == body.decode(), body_summary(body) == body.decode())
    """
)


def test_a_body_300000_deep_crashes_no_process_whose_recursion_limit_a_connection_raised() -> None:
    """Under the limit a broker connection sets (infra/rabbit/connection.py), json.loads on
    300,000 levels overflows the C stack: a segmentation fault, not an exception. Decoding (of
    the current version, and of the next, which reads the body's user_id) and the console's
    body text must not parse it."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["invalid_json", "newer_version", "True", "True"]
