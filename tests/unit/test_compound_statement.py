"""Parts of a batch's write gathered into one WITH statement (infra/postgres/compound.py): the
text only; what Postgres does with it is tests/integration/test_compound_writes.py."""

from __future__ import annotations

import pytest

from infra.postgres.compound import statement


def test_each_parts_parameters_are_shifted_past_the_ones_of_the_parts_before_it() -> None:
    sql = statement(
        (
            (
                (("a_ins", "INSERT INTO t SELECT $1, $2 RETURNING 1"),),
                2,
                "(SELECT count(*) FROM a_ins)",
            ),
            ((("b_upd", "UPDATE u SET x = $1 WHERE y = $2 AND z = $1"),), 2, None),
            (
                (("c_ins", "INSERT INTO v SELECT $1 RETURNING id"),),
                1,
                "ARRAY(SELECT id FROM c_ins)",
            ),
        )
    )
    assert "INSERT INTO t SELECT $1, $2 RETURNING 1" in sql
    assert "UPDATE u SET x = $3 WHERE y = $4 AND z = $3" in sql
    assert "INSERT INTO v SELECT $5 RETURNING id" in sql
    assert sql.endswith("SELECT (SELECT count(*) FROM a_ins), ARRAY(SELECT id FROM c_ins)")
    assert sql.startswith("WITH a_ins AS (")


def test_a_statement_of_parts_without_results_selects_null() -> None:
    sql = statement((((("a_del", "DELETE FROM t WHERE k = $1"),), 1, None),))
    assert sql.endswith("SELECT NULL")


def test_two_parts_naming_a_cte_alike_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        statement(
            (
                ((("same", "DELETE FROM t WHERE k = $1"),), 1, None),
                ((("same", "DELETE FROM u WHERE k = $1"),), 1, None),
            )
        )


def test_a_part_using_a_parameter_it_was_not_given_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\$3 is beyond"):
        statement((((("a_del", "DELETE FROM t WHERE k = $3"),), 2, None),))
