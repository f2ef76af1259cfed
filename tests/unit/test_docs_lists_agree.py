"""The README's list of documentation, the site's home page (docs/index.md) and the site's
navigation (mkdocs.yml `nav`) name the same pages.

The rule: the navigation is the set of pages. docs/index.md links every page of the navigation
but itself, and no other page. The README links each of those pages that is a file in the
repository, and no other page under docs/: `docs/X.md` for a page X.md, and `ARCHITECTURE.md`
for the site's architecture page (the build makes it from that file). The tests page is the one
page that exists only in the built site (devtools/docs_hooks.py makes it), so the README cannot
link it. A page added to one list and not to the others fails here, naming it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.utils.yaml import yaml_load

REPO = Path(__file__).resolve().parents[2]
BUILT_ONLY = {"reference/tests.md"}
"""Pages made at build time with no file of their own in the repository."""
FROM_ROOT = {"ARCHITECTURE.md": "architecture.md"}
"""Files at the repository's root that the build turns into a page of the site."""
_LINK = re.compile(r"\]\(([^)\s#]+\.md)(?:#[^)]*)?\)")


def _config() -> Any:
    """mkdocs.yml, read as mkdocs reads it (its `!!python/name:` tags included)."""
    with (REPO / "mkdocs.yml").open() as config:
        return yaml_load(config)


def nav_pages(nav: Any) -> set[str]:
    """Every page file the navigation names, at any depth."""
    if isinstance(nav, str):
        return {nav} if nav.endswith(".md") else set()
    if isinstance(nav, list):
        return set().union(*(nav_pages(entry) for entry in nav))
    if isinstance(nav, dict):
        return set().union(*(nav_pages(value) for value in nav.values()))
    return set()


def linked(markdown: str) -> set[str]:
    """The targets of the Markdown links to .md files in `markdown`."""
    return set(_LINK.findall(markdown))


def readme_pages(readme: str) -> set[str]:
    """The site's pages the README links, by their path under docs/."""
    found = set()
    for target in linked(readme):
        if target.startswith("docs/"):
            found.add(target.removeprefix("docs/"))
        elif target in FROM_ROOT:
            found.add(FROM_ROOT[target])
    return found


def test_the_home_page_links_every_page_of_the_navigation_and_no_other() -> None:
    nav = nav_pages(_config()["nav"])
    assert {"index.md", "architecture.md", "benchmarks.md"} <= nav
    home = linked((REPO / "docs" / "index.md").read_text())
    assert sorted(nav - {"index.md"} - home) == [], "in the navigation, not on the home page"
    assert sorted(home - nav) == [], "on the home page, not in the navigation"


def test_the_readme_links_every_page_of_the_navigation_it_can_and_no_other() -> None:
    nav = nav_pages(_config()["nav"])
    readme = readme_pages((REPO / "README.md").read_text())
    expected = nav - {"index.md"} - BUILT_ONLY
    assert sorted(expected - readme) == [], "in the navigation, not in the README"
    assert sorted(readme - expected) == [], "in the README, not in the navigation"


def test_the_readme_still_starts_with_the_two_setup_commands() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert lines[:3] == ["# pkgq", "", "```sh"]
    assert lines[3].startswith("make demo ")
    assert lines[4].startswith("make test ")


def test_the_lists_are_read_from_nested_navigation_and_relative_links() -> None:
    nav = [{"Home": "index.md"}, {"A": ["a/index.md", {"B": "a/b.md"}, {"Out": "https://x"}]}]
    assert nav_pages(nav) == {"index.md", "a/index.md", "a/b.md"}
    text = "[b](docs/a/b.md#x), [arch](ARCHITECTURE.md), [log](CHANGELOG.md), [c](https://c.md)"
    assert readme_pages(text) == {"a/b.md", "architecture.md"}
