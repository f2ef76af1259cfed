"""docs/reference/*.md are what devtools/docs_reference.py makes from this checkout's code, and
the dead-letter reasons it documents are every reason the code can file."""

from __future__ import annotations

from devtools import docs_reference


def test_every_committed_reference_page_is_current() -> None:
    stale = docs_reference.stale()
    assert not stale, (
        f"docs/reference/{', '.join(stale)} stale: regenerate with `{docs_reference.COMMAND}`"
    )


def test_every_reason_the_code_files_is_documented_and_no_other() -> None:
    in_code = docs_reference.reasons_in_code()
    documented = set(docs_reference.REASONS)
    assert in_code <= documented, (
        f"undocumented dead-letter reasons {sorted(in_code - documented)}: add each to REASONS "
        "in devtools/docs_reference.py (or to NOT_REASONS if it is no dead-letter reason)"
    )
    assert documented <= in_code, f"documented but never filed: {sorted(documented - in_code)}"


def test_the_reason_scanner_finds_each_way_the_code_files_one() -> None:
    import ast

    source = """
raise BadMessageError("a1", "detail")
failure = replace(failure, reason="a2")
kind, reason = ErrorKind.RULE, "a3"
Decision(Fate.DEAD_LETTERED, "a4", failure)
UNROUTABLE = "a5"
log.info("x", other="not_a_reason")
"""
    found = set(docs_reference._reason_literals(ast.parse(source)))
    assert found == {"a1", "a2", "a3", "a4", "a5"}
