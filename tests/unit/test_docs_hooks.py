"""The documentation build's hooks (devtools/docs_hooks.py): the tests page gives every test an
anchor, and a test named as code in a page's text becomes a link to it (outside code blocks)."""

from __future__ import annotations

from devtools.docs_hooks import TESTS, link_proofs, page_of_architecture, page_of_tests


def test_the_tests_page_anchors_every_module_and_test_function() -> None:
    page = page_of_tests(TESTS)

    assert "### `tests/unit/test_docs_hooks.py` {#test_docs_hooks}" in page
    assert (
        '<span id="test_docs_hooks.test_the_tests_page_anchors_every_module_and_test_function">'
        in page
    )


def test_a_test_named_as_code_links_to_its_entry_except_in_code_blocks() -> None:
    text = (
        "Proved by `tests/unit/test_replay.py::test_x` and `tests/e2e/test_tail.py`.\n"
        "```sh\n.venv/bin/pytest `tests/unit/test_replay.py`\n```\n"
        "Already [`tests/unit/test_replay.py`](elsewhere.md).\n"
    )

    linked = link_proofs(text, "explanation/page.md")

    assert (
        "[`tests/unit/test_replay.py::test_x`](../reference/tests.md#test_replay.test_x)" in linked
    )
    assert "[`tests/e2e/test_tail.py`](../reference/tests.md#test_tail)" in linked
    assert "pytest `tests/unit/test_replay.py`\n```" in linked  # a code block is left alone
    assert "Already [`tests/unit/test_replay.py`](elsewhere.md)" in linked
    assert link_proofs("`tests/unit/test_replay.py`", "index.md").endswith(
        "(reference/tests.md#test_replay)"
    )


def test_the_architecture_page_links_into_the_site_and_names_other_files_as_code() -> None:
    text = "See [delivery](docs/explanation/delivery.md#a), [the README](README.md), [x](https://x.org)."

    page = page_of_architecture(text)

    assert page == (
        "See [delivery](explanation/delivery.md#a), the README (`README.md`), [x](https://x.org)."
    )
