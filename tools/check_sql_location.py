"""Fail if SQL appears outside its homes: every other module calls repository functions.

Production code (domain, events, infra, consumers) holds SQL in infra/postgres only: the
repositories, each table's owner, the one place a schema change has to look. Two homes more are
not production's and are let off for that reason: devtools/postgres (the benchmarks' data,
seeded and counted in databases of their own: `pkgq bench`, `pkgq web bench`) and tests (the
fixtures that build a test's state and the assertions that read it back). Bench data and
fixtures never run against a production database, and the image leaves both out; the rest of
devtools (the bench's scenario, the demo) is held to the rule like production code and calls
devtools/postgres or infra/postgres.

Reads every other Python module of the tree as a syntax tree and looks at its string literals
(f-strings and `+` chains of literals joined, docstrings left out) for the shapes of SQL
statements: SELECT … FROM, INSERT INTO, UPDATE … SET, DELETE FROM, DDL (CREATE/ALTER/DROP
TABLE, ROLE, INDEX, …), GRANT/REVOKE … ON/FROM/TO, LOCK TABLE, TRUNCATE, COPY, a CTE,
pg_notify(). Prints each finding as `path:line: statement` and exits 1 if there is any; exits 0
on a clean tree.

    python tools/check_sql_location.py [ROOT]
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HOME = "infra/postgres"
"""The one folder of production code whose modules hold SQL."""
NOT_PRODUCTION = ("devtools/postgres", "tests")
"""The homes of SQL that is not production's: the benchmarks' data and the tests' fixtures."""
HOMES = (HOME, *NOT_PRODUCTION)
EXCLUDED_DIRS = frozenset({".venv", ".git", "build", "node_modules"})

ALLOWED: frozenset[str] = frozenset()
"""Modules let off the check: none. Keep it so."""

_NAME = r'[\w."${}]+'
_SHAPES = (
    rf"\bSELECT\s+.+?\s+FROM\s+{_NAME}",
    rf"\bSELECT\s+(?:\d+|true|false|now\(\)|\$\d+|{_NAME}\s*\()",
    rf"\bINSERT\s+INTO\s+{_NAME}",
    rf"\bUPDATE\s+{_NAME}\s+(?:(?:AS\s+)?\w+\s+)?SET\s+\w+\s*=",
    rf"\bDELETE\s+FROM\s+{_NAME}",
    r"\b(?:CREATE|ALTER|DROP)\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+|TEMP(?:ORARY)?\s+|UNLOGGED\s+)?"
    r"(?:TABLE|ROLE|USER|SCHEMA|INDEX|VIEW|SEQUENCE|FUNCTION|PROCEDURE|TRIGGER|TYPE|DATABASE"
    r"|EXTENSION|POLICY|PUBLICATION|SUBSCRIPTION)\b",
    rf"\bGRANT\s+[\w, ]+\s+ON\s+(?:TABLE\s+|SCHEMA\s+|ALL\s+)?{_NAME}",
    rf"\bREVOKE\s+[\w, ]+\s+ON\s+(?:TABLE\s+|SCHEMA\s+|ALL\s+)?{_NAME}",
    rf"\bLOCK\s+TABLE\s+{_NAME}",
    rf"\bTRUNCATE\s+(?:TABLE\s+)?{_NAME}",
    rf"\bCOPY\s+{_NAME}\s*(?:\(|FROM\b|TO\b)",
    r"\bWITH\s+(?:RECURSIVE\s+)?\w+\s+AS\s*(?:NOT\s+)?(?:MATERIALIZED\s+)?\(\s*(?:SELECT|INSERT|UPDATE|DELETE)\b",
    r"\bpg_notify\s*\(",
)
_UPPER = tuple(re.compile(p, re.DOTALL) for p in _SHAPES)
"""SQL is written with its keywords in capitals: the shapes as they are."""
_ANY_CASE = tuple(re.compile(p, re.IGNORECASE | re.DOTALL) for p in _SHAPES)
_SQL_MARK = re.compile(r"\$\d|::\w|\btelecom\.\w|\bpg_\w")
"""In lower case, prose may read like a statement ("select a route from the list"): a
statement in lower case is SQL when it also has a parameter, a cast or a qualified table."""


@dataclass(frozen=True, slots=True)
class Finding:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: SQL outside {', '.join(HOMES)}: {self.text}"


def looks_like_sql(text: str) -> str | None:
    """The first SQL statement shape found in `text` (folded to one line), or None."""
    patterns = _UPPER + _ANY_CASE if _SQL_MARK.search(text) else _UPPER
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return " ".join(match.group(0).split())[:120]
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _literal(node: ast.AST) -> str | None:
    """The text of a string literal, an f-string (placeholders as `{}`) or a `+` chain of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_literal(v) or "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        if left is not None or right is not None:
            return (left or "{}") + (right or "{}")
    return None


def find_sql(source: str, path: str) -> list[Finding]:
    """The SQL statements in the string literals of one module's source."""
    tree = ast.parse(source, filename=path)
    skip = _docstrings(tree)
    findings: dict[int, Finding] = {}
    inner: set[int] = set()
    for node in ast.walk(tree):
        if id(node) in skip or id(node) in inner:
            continue
        text = _literal(node)
        if text is None or not isinstance(node, ast.expr):
            continue
        inner.update(id(child) for child in ast.walk(node) if child is not node)
        found = looks_like_sql(text)
        if found and node.lineno not in findings:
            findings[node.lineno] = Finding(path, node.lineno, found)
    return sorted(findings.values(), key=lambda f: f.line)


def in_a_home(relative: str) -> bool:
    """Whether the module at `relative` (a POSIX path from the root) is in one of HOMES."""
    return any(relative.startswith(f"{home}/") for home in HOMES)


def modules(root: Path) -> Iterator[Path]:
    """The Python modules the check reads: all but those in HOMES."""
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(relative.parts[:-1]):
            continue
        if in_a_home(relative.as_posix()):
            continue
        yield path


def check(root: Path, allowed: frozenset[str] = ALLOWED) -> list[Finding]:
    """Every finding in the tree below `root`, the allow-listed modules left out."""
    findings: list[Finding] = []
    for path in modules(root):
        relative = path.relative_to(root).as_posix()
        if relative in allowed:
            continue
        findings.extend(find_sql(path.read_text(encoding="utf-8"), relative))
    return findings


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    findings = check(root)
    for finding in findings:
        print(finding)
    if findings:
        print(
            f"{len(findings)} SQL statement(s) outside {HOME}: move them into a repository "
            f"function there (or, for bench data, into {NOT_PRODUCTION[0]})",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
