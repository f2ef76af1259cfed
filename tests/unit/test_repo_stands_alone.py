"""The repository stands alone: no tracked file points at something a reader of the repo cannot
open. A reference fails the test, named by file and line, when it points at:

- a sibling folder of shared material outside the checkout (a relative path up and into
  `shared`);
- a numbered design document kept outside the repo (the word for such a document followed by
  its number, as in the conformance suites' old names);
- a design or style guide (`DESIGN` or `STYLE` with `.md`) that is not a tracked file here;
- an issue of this project by number: the word issue, ticket or bug with a number, a number
  with a hash in parentheses, or "see", "fixes", "closes" with one. A hash and a number inside
  data (a cancel's reason in a test, say) is no reference; a full URL of another project's
  issue tracker is fine, since anyone can open it.

Two exceptions, each for a reason. Vendored copies of other projects' files (`_VENDORED`) are
their text, not ours (mermaid's bundle holds TeX macros such as a hash and a digit in
parentheses). The retry backoff's configuration value `seed003` (PKGQ_RETRY, the route file) is a
name operators have written in their settings: renaming it would change behaviour, so that one
word is allowed as a value (and in the name of the function that computes it), and the prose
around it must still not cite a document.

Migrations are scanned like everything else: pkgq records which migrations ran by version and
name only (infra/postgres/migrate.py keeps no checksum), so their comments may be reworded.

The patterns below are written so that this file does not match them itself."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_OUTSIDE = [
    ("a path outside the repo", re.compile(r"\.\.[/\\]shared\b")),
    ("a numbered seed document", re.compile(r"(?<![A-Za-z0-9])[Ss]eeds?[ _-]?\d{3}(?!\d)")),
    ("an issue number", re.compile(r"\b(?:[Ii]ssues?|[Tt]ickets?|[Bb]ugs?)[ ]+#?\d+\b")),
    ("an issue number", re.compile(r"\(#\d+\)")),
    (
        "an issue number",
        re.compile(r"\b(?:[Ss]ee|[Ff]ix(?:es|ed)?|[Cc]los(?:es|ed)|[Rr]esolv(?:es|ed))[ ]+#\d+\b"),
    ),
]
_GUIDE = re.compile(r"\b(?:DESIGN|STYLE)\.md\b")
_SETTING_VALUE = re.compile(r"seed003")  # the value, and the function named after it
_MARKER = re.compile(r"^\s*(?:#|--|//|\*|>)?\s*")
_VENDORED = ("docs/assets/javascripts/mermaid.min.js", "consumers/web/static/vendor/")


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout
    return [name for name in out.decode().split("\0") if name]


def references_outside(path: str, text: str, tracked: set[str]) -> list[str]:
    """Every line of `text` that points outside the repo, as `path:line: what (the line)`."""
    found = []
    lines = [_SETTING_VALUE.sub("", line) for line in text.splitlines()]
    for number, line in enumerate(text.splitlines(), start=1):
        plain = lines[number - 1]
        # A reference wrapped over two lines counts on the first: the next line joins it without
        # its indent and comment marker.
        after = _MARKER.sub("", lines[number]) if number < len(lines) else ""
        joined = f"{plain} {after}"
        whats = list(
            dict.fromkeys(
                what
                for what, pattern in _OUTSIDE
                if any(m.start() < len(plain) for m in pattern.finditer(joined))
            )
        )
        whats += [
            "a guide that is not in the repo"
            for guide in _GUIDE.findall(line)
            if not any(name.rsplit("/", 1)[-1] == guide for name in tracked)
        ]
        found += [f"{path}:{number}: {what} ({line.strip()[:120]})" for what in whats]
    return found


def test_no_tracked_file_points_outside_the_repo() -> None:
    names = tracked_files()
    assert "README.md" in names, "git ls-files found no README: not run from the repo?"
    tracked = set(names)
    found = []
    for name in names:
        if name.startswith(_VENDORED):
            continue
        path = REPO / name
        if not path.is_file():
            continue  # deleted in the work tree, not yet in the index
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: images and the like say nothing a reader follows
        found += references_outside(name, text, tracked)
    assert found == [], "references outside the repo:\n" + "\n".join(found)


def test_the_scan_names_the_file_and_line_of_each_kind_of_reference() -> None:
    up = ".." + "/shared/x.md"
    doc = "se" + "ed 002"
    name = "test_se" + "ed_001_x.py"
    guide = "DESI" + "GN.md"
    issue = "(iss" + "ue 48)"
    text = (
        f"fine\nsee {up}\nas {doc} says\nper {guide}\nfixed {issue}\nclo" + f"ses #12\nin {name}\n"
    )
    text += "# as se" + "ed\n# 004 says\n"
    found = references_outside("a.md", text, {"a.md"})
    assert [entry.split(" (")[0] for entry in found] == [
        "a.md:2: a path outside the repo",
        "a.md:3: a numbered seed document",
        "a.md:4: a guide that is not in the repo",
        "a.md:5: an issue number",
        "a.md:6: an issue number",
        "a.md:7: a numbered seed document",
        "a.md:8: a numbered seed document",
    ]


def test_the_scan_leaves_data_urls_and_guides_in_the_repo_alone() -> None:
    text = (
        'reason="refund #7"\n'
        "https://github.com/rabbitmq/rabbitmq-server/issues/" + "1234\n"
        "random.seed(3); a seed of 42\n"
        'backoff = "seed003"\n'
        "see DESI" + "GN.md\n"
    )
    assert references_outside("t.py", text, {"docs/DESI" + "GN.md"}) == []
