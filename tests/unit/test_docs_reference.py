"""docs/reference/*.md are what devtools/docs_reference.py makes from this checkout's code, the
dead-letter reasons it documents are every reason the code can file, and the layout page lists
every package and module of the code."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_the_layout_page_lists_every_package_and_module_of_the_code() -> None:
    from devtools.reference.common import ROOT
    from devtools.reference.layout_page import PACKAGES, layout_page

    page = layout_page()
    modules = [path for name in PACKAGES for path in (ROOT / name).rglob("*.py")]
    assert len(modules) > 100, "found too few modules: is ROOT the checkout?"
    missing = [
        path.relative_to(ROOT).as_posix()
        for path in modules
        if path.name != "__init__.py" and f"`{path.relative_to(ROOT).as_posix()}`" not in page
    ]
    assert missing == []
    packages = {path.parent.relative_to(ROOT).as_posix() for path in modules}
    assert [p for p in sorted(packages) if f"### `{p}/`" not in page] == []


def test_a_module_without_a_docstring_stops_the_layout_page(tmp_path: Path) -> None:
    from devtools.reference.layout_page import package_section

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""A package. More words."""\n')
    (tmp_path / "pkg" / "quiet.py").write_text("x = 1\n")

    with pytest.raises(ValueError, match=r"quiet\.py has no docstring"):
        package_section(tmp_path / "pkg", root=tmp_path)


def test_a_module_is_listed_with_the_first_sentence_of_its_docstring(tmp_path: Path) -> None:
    from devtools.reference.layout_page import package_section

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""A package. More words."""\n')
    (tmp_path / "pkg" / "one.py").write_text(
        '"""Holds one thing, wrapped\nover lines. Then more."""\n'
    )

    section = package_section(tmp_path / "pkg", root=tmp_path)

    assert section == (
        "### `pkg/`\n\nA package.\n\n| module | what it holds |\n|---|---|\n"
        "| `pkg/one.py` | Holds one thing, wrapped over lines. |\n\n"
    )
