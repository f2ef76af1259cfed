"""consumers/delivery/errors.py: how a failure is described (type, message, the repo-relative
raise site, the traceback) for the dead-letter store."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from consumers.delivery import describe
from infra.route_config import RetrySettings

THIS_FILE = "tests/unit/test_delivery_errors.py"


def _explode(message: str) -> None:
    raise ValueError(message)


def _caught(fn: Callable[[], None]) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001  (the test wants whatever it raised)
        return exc
    raise AssertionError("expected an exception")


class _Outer:
    class InnerError(Exception):
        pass


def test_describe_names_the_type_the_message_and_the_repo_relative_raise_site() -> None:
    info = describe(_caught(lambda: _explode("the quota went negative")))
    assert info.error_type == "ValueError"
    assert info.message == "the quota went negative"
    assert THIS_FILE + ":" in info.location
    assert info.location.endswith(" in _explode")
    assert info.location == f"{THIS_FILE}:{_explode.__code__.co_firstlineno + 1} in _explode"


def test_describe_keeps_the_full_traceback_text_with_the_message() -> None:
    info = describe(_caught(lambda: _explode("the quota went negative")))
    assert info.traceback.startswith("Traceback (most recent call last)")
    assert "ValueError: the quota went negative" in info.traceback
    assert "_explode" in info.traceback


def test_describe_uses_the_type_name_as_message_when_the_message_is_empty() -> None:
    info = describe(_caught(lambda: _explode("")))
    assert info.message == "ValueError"


def test_describe_uses_the_qualified_name_of_a_nested_exception_class() -> None:
    def fail() -> None:
        raise _Outer.InnerError("inner")

    info = describe(_caught(fail))
    assert info.error_type == "_Outer.InnerError"
    assert info.location.endswith(" in fail")


def _parse_bad_json() -> None:
    json.loads("{")


def _build_bad_retry_settings() -> None:
    RetrySettings(max_attempts=0)


def test_describe_points_at_our_calling_line_when_the_stdlib_raised() -> None:
    info = describe(_caught(_parse_bad_json))
    assert info.error_type == "JSONDecodeError"
    line = _parse_bad_json.__code__.co_firstlineno + 1
    assert info.location == f"{THIS_FILE}:{line} in _parse_bad_json"
    assert "json/decoder.py" in info.traceback


def test_describe_skips_frames_of_libraries_installed_in_the_repo_virtualenv() -> None:
    info = describe(_caught(_build_bad_retry_settings))
    assert info.error_type == "ValidationError"
    line = _build_bad_retry_settings.__code__.co_firstlineno + 1
    assert info.location == f"{THIS_FILE}:{line} in _build_bad_retry_settings"
    assert "pydantic" in info.traceback


def test_describe_shows_only_the_file_name_when_no_frame_is_repo_code() -> None:
    exc = _caught(_parse_bad_json)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.endswith(THIS_FILE):
        tb = tb.tb_next
    assert tb is not None
    info = describe(exc.with_traceback(tb))
    assert re.fullmatch(r"decoder\.py:\d+ in \w+", info.location), info.location


def test_describe_gives_no_location_for_an_exception_that_was_never_raised() -> None:
    info = describe(KeyError("k"))
    assert info.location == ""
    assert info.error_type == "KeyError"
    assert "KeyError" in info.traceback
