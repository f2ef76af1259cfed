"""mkdocs hooks (mkdocs.yml `hooks:`), run by `make docs` at build time:

- reference/tests.md: every test module and test of tests/, from their names and docstrings,
  each with an anchor (`#test_replay_once`, `#test_replay_once.test_name`) that the pages naming
  a guarantee link to, so `mkdocs build --strict` fails when a linked proof is renamed or gone.
  It is made at build time, never committed: a new test needs no regeneration.
- architecture.md: the repository's ARCHITECTURE.md as a page of the site, its links to
  `docs/...` made relative to the site (the file at the root is the one copy of that text).
- screenshots/*.png: the console's screenshots that the browser tests took into
  build/screenshots/ (tests/web/stack.py `shoot`), copied into the site. A page's image of one
  that is not there (a clean clone, before the browser tests ran) becomes a note that says how to
  take it, so the strict build passes either way.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SCREENSHOTS = ROOT / "build" / "screenshots"
SHOT = re.compile(r"!\[([^\]]*)\]\((?:\.\./)*screenshots/([\w.-]+\.png)\)")
PROOF = re.compile(r"(?<!\[)`(tests/[\w/]+/(test_\w+)\.py)((?:::[\w.\[\]-]+)*)`")
"""A test named in a page's text as code (`tests/x/test_y.py`, `...::test_z`)."""
FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
REPO_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)([^)\s]+)\)")
"""A relative link of a Markdown file at the repository's root."""


def page_of_architecture(text: str) -> str:
    """ARCHITECTURE.md as the site's `architecture.md`: a link into docs/ loses its `docs/`; a
    link to any other file of the repository becomes its text and the path as code, since the
    site does not hold that file."""

    def site_link(match: re.Match[str]) -> str:
        words, target = match.groups()
        if target.startswith("docs/"):
            return f"[{words}]({target.removeprefix('docs/')})"
        return f"{words} (`{target}`)"

    return REPO_LINK.sub(site_link, text)


def _first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())


def _tests_of(tree: ast.Module) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            found.append((node.name, _first_paragraph(ast.get_docstring(node))))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for inner in node.body:
                if isinstance(
                    inner, ast.FunctionDef | ast.AsyncFunctionDef
                ) and inner.name.startswith("test"):
                    found.append(
                        (f"{node.name}.{inner.name}", _first_paragraph(ast.get_docstring(inner)))
                    )
    return found


def page_of_tests(tests: Path) -> str:
    """The reference page of every test, grouped by folder and module."""
    out = [
        "# Tests\n\n",
        "Every test of the suite by folder and module, with its docstring: the proofs the other "
        "pages link to. Generated at build time from `tests/` (`devtools/docs_hooks.py`). "
        "Run one with `.venv/bin/pytest -p no:cacheprovider PATH::NAME -n0 -q` (most need the "
        "services: `make migrate` first).\n\n",
    ]
    for folder in sorted(p for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"):
        modules = sorted(folder.rglob("test_*.py"))
        if not modules:
            continue
        out.append(f"## tests/{folder.name}\n\n")
        for module in modules:
            tree = ast.parse(module.read_text())
            stem = module.stem
            out.append(f"### `{module.relative_to(ROOT)}` {{#{stem}}}\n\n")
            doc = _first_paragraph(ast.get_docstring(tree))
            if doc:
                out.append(doc + "\n\n")
            for name, summary in _tests_of(tree):
                anchor = f"{stem}.{name.split('.')[-1]}"
                out.append(
                    f'- <span id="{anchor}"></span>`{name}`'
                    + (f": {summary}" if summary else "")
                    + "\n"
                )
            out.append("\n")
    return "".join(out)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "reference/tests.md", content=page_of_tests(TESTS)))
    architecture = page_of_architecture(ARCHITECTURE.read_text())
    files.append(File.generated(config, "architecture.md", content=architecture))
    if SCREENSHOTS.is_dir():
        for png in sorted(SCREENSHOTS.glob("*.png")):
            files.append(File.generated(config, f"screenshots/{png.name}", abs_src_path=str(png)))
    return files


def link_proofs(markdown: str, src_uri: str) -> str:
    """Each test named as code outside code blocks, as a link to its entry on the tests page,
    so the strict build fails when a page names a test module or function that is gone."""
    up = "../" * src_uri.count("/")

    def link(match: re.Match[str]) -> str:
        _path, stem, names = match.groups()
        function = names.split("::")[-1].split("[")[0] if names else ""
        anchor = f"{stem}.{function}" if function else stem
        return f"[{match.group(0)}]({up}reference/tests.md#{anchor})"

    parts = FENCE.split(markdown)
    # FENCE.split keeps the fences: text, fence, code, fence, text, ...; link the text only
    out, inside = [], False
    for part in parts:
        if FENCE.fullmatch(part):
            inside = not inside
            out.append(part)
        else:
            out.append(part if inside else PROOF.sub(link, part))
    return "".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri != "reference/tests.md":
        markdown = link_proofs(markdown, page.file.src_uri)

    def shot(match: re.Match[str]) -> str:
        if (SCREENSHOTS / match.group(2)).exists():
            return match.group(0)
        return (
            f"*(Screenshot `{match.group(2)}`, {match.group(1)}: taken by the console's browser "
            "tests into build/screenshots/, e.g. `make e2e`; `make docs` then shows it here.)*"
        )

    return SHOT.sub(shot, markdown)
