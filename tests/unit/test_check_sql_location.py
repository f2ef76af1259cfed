"""tools/check_sql_location.py: the check in `make check` that keeps SQL inside infra/postgres."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.check_sql_location import check, find_sql, main

ROOT = Path(__file__).resolve().parents[2]


def plant(root: Path, relative: str, source: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT id, state FROM telecom.holds WHERE user_id = $1",
        "INSERT INTO telecom.inbox (consumer, message_id) VALUES ($1, $2)",
        "UPDATE telecom.queue_users SET seq = seq + 1",
        "delete from telecom.outbox where id = $1",
        "CREATE TABLE telecom.x (id int)",
        "ALTER ROLE pkgq_runtime LOGIN",
        "DROP INDEX telecom.x_idx",
        "LOCK TABLE telecom.outbox IN SHARE MODE",
        "COPY telecom.inbox FROM STDIN",
        "TRUNCATE telecom.inbox",
        "GRANT SELECT ON telecom.inbox TO pkgq_runtime",
        "WITH gone AS (DELETE FROM telecom.inbox RETURNING 1) SELECT count(*) FROM gone",
        "SELECT pg_notify('pkgq_outbox', '')",
    ],
)
def test_a_sql_statement_planted_outside_infra_postgres_is_flagged(
    tmp_path: Path, statement: str
) -> None:
    plant(tmp_path, "infra/outbox/planted.py", f"QUERY = {statement!r}\n")

    findings = check(tmp_path)

    assert [(f.path, f.line) for f in findings] == [("infra/outbox/planted.py", 1)]
    assert main(["check", str(tmp_path)]) == 1


def test_sql_split_over_an_f_string_or_a_concatenation_is_flagged() -> None:
    source = (
        "def query(table: str) -> str:\n"
        '    return f"SELECT id FROM {table} WHERE id = $1"\n'
        'OTHER = "UPDATE telecom.holds " + "SET state = $1"\n'
    )

    assert [f.line for f in find_sql(source, "consumers/x.py")] == [2, 3]


def test_a_clean_module_passes(tmp_path: Path) -> None:
    plant(
        tmp_path,
        "consumers/clean.py",
        '"""Handlers SELECT the items FROM the unit of work; a docstring may name SQL."""\n'
        'MESSAGE = "select a route from the list, then update the settings"\n'
        "async def go(conn: object) -> None:\n"
        "    await holds.release(conn)  # DELETE FROM telecom.holds, in its owner\n",
    )

    assert check(tmp_path) == []
    assert main(["check", str(tmp_path)]) == 0


def test_sql_inside_infra_postgres_and_in_tests_passes(tmp_path: Path) -> None:
    plant(tmp_path, "infra/postgres/inbox.py", 'Q = "DELETE FROM telecom.inbox WHERE true"\n')
    plant(tmp_path, "tests/integration/test_x.py", 'Q = "SELECT 1 FROM telecom.inbox"\n')

    assert check(tmp_path) == []


def test_bench_data_in_devtools_postgres_passes_and_sql_elsewhere_in_devtools_is_flagged(
    tmp_path: Path,
) -> None:
    plant(tmp_path, "devtools/postgres/bench_data.py", 'Q = "TRUNCATE telecom.inbox"\n')
    plant(tmp_path, "devtools/bench/scenario.py", 'Q = "SELECT count(*) FROM telecom.inbox"\n')

    assert [f.path for f in check(tmp_path)] == ["devtools/bench/scenario.py"]


@pytest.mark.parametrize("package", ["domain", "events", "infra", "consumers"])
def test_a_tests_or_devtools_folder_inside_production_code_is_no_home_for_sql(
    tmp_path: Path, package: str
) -> None:
    query = 'Q = "DELETE FROM telecom.inbox WHERE true"\n'
    plant(tmp_path, f"{package}/devtools/postgres/x.py", query)
    plant(tmp_path, f"{package}/tests/x.py", query)

    assert [f.path for f in check(tmp_path)] == [
        f"{package}/devtools/postgres/x.py",
        f"{package}/tests/x.py",
    ]


def test_an_allow_listed_module_is_not_read(tmp_path: Path) -> None:
    plant(tmp_path, "consumers/bench.py", 'Q = "SELECT count(*) FROM telecom.inbox"\n')

    assert check(tmp_path, frozenset({"consumers/bench.py"})) == []
    assert len(check(tmp_path, frozenset())) == 1


def test_the_source_tree_has_no_sql_outside_infra_postgres() -> None:
    assert [str(f) for f in check(ROOT)] == []
