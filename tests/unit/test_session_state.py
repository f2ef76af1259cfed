"""The process pools skip asyncpg's session reset on release (consumers/runtime.services), which
is only right while no statement pkgq sends on them leaves state in the session. This test
reads every SQL string in infra/postgres and fails on one that would."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SESSION_STATE = re.compile(
    r"pg_advisory_lock(_shared)?\s*\(|pg_try_advisory_lock(_shared)?\s*\(|\bLISTEN\b"
    r"|(\A|;)\s*SET\s+(?!LOCAL\b)|\bSET\s+SESSION\b"
    r"|set_config\s*\((?![^)]*,\s*true\s*\))"  # any set_config not plainly transaction-local
    r"|\bPREPARE\b|\bDECLARE\b[^;]*\bWITH\s+HOLD\b|CREATE\s+TEMP(ORARY)?\b",
    re.IGNORECASE,
)
OWN_CONNECTION = {"migrate.py"}
"""Modules whose statements run on a connection of their own, never a pooled one (migrations)."""


def strings_of(path: Path) -> list[tuple[int, str]]:
    """The module's string constants (docstrings left out: prose, not statements)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]


def session_state_in(path: Path) -> list[int]:
    return [line for line, text in strings_of(path) if SESSION_STATE.search(text)]


def test_no_pooled_statement_leaves_state_in_the_session() -> None:
    found = {
        path.name: lines
        for path in sorted((ROOT / "infra" / "postgres").glob("*.py"))
        if path.name not in OWN_CONNECTION and (lines := session_state_in(path))
    }

    assert found == {}


def test_the_check_finds_session_state_where_it_is(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        'A = "SELECT pg_advisory_lock($1)"\n'
        'B = "SET statement_timeout = 0"\n'
        'C = "LISTEN pkgq_outbox"\n'
        'D = "SET LOCAL lock_timeout = 100"\n'
        'E = "SELECT pg_advisory_xact_lock($1)"\n'
        "F = \"SELECT set_config('x.y', '1', false)\"\n"
        'G = "BEGIN; SET search_path = x"\n'
        'H = "SELECT set_config($1, $2, $3)"\n'
        "I = \"SELECT set_config('x.y', '1', true)\"\n",
        encoding="utf-8",
    )

    assert session_state_in(planted) == [1, 2, 3, 6, 7, 8]
    assert session_state_in(ROOT / "infra" / "postgres" / "migrate.py")
