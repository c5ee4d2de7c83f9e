"""The read-only SQL tool: rows of a SELECT, and a clear tool error for everything
that would write, attach, run more than one statement or run without end."""

from __future__ import annotations

import pytest

from toolworkers.builtin_tools import ToolError
from toolworkers.database_tool import query_database, reference_topics_database, run_query
from toolworkers.registry import declared_spec


def test_a_select_returns_its_header_and_rows() -> None:
    result = query_database("SELECT name, words FROM topics ORDER BY words DESC LIMIT 2")
    header, *rows = result.splitlines()
    assert header == "name | words"
    assert len(rows) == 2
    largest, second = (int(row.split(" | ")[1]) for row in rows)
    assert largest >= second > 0


def test_no_rows_and_too_many_rows_are_said() -> None:
    assert query_database("SELECT name FROM topics WHERE words < 0") == "name\n(no rows)"
    many = query_database("SELECT name FROM topics").splitlines()
    assert many[-1].startswith("... (more rows than the 20 shown)")
    assert len(many) == 22


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("DELETE FROM topics", "not authorized"),
        ("UPDATE topics SET words = 0", "not authorized"),
        ("CREATE TABLE t(x)", "not authorized"),
        ("ATTACH DATABASE ':memory:' AS other", "not authorized"),
        ("PRAGMA query_only = 0", "not authorized"),
        ("SELECT 1; SELECT 2", "one statement at a time"),
        ("SELEC name FROM topics", "syntax error"),
        ("SELECT missing FROM topics", "no such column"),
    ],
)
def test_what_cannot_run_is_a_tool_error(sql: str, reason: str) -> None:
    with pytest.raises(ToolError, match=reason):
        query_database(sql)


def test_a_query_without_end_is_stopped_and_the_database_stays_usable() -> None:
    database = reference_topics_database()
    endless = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    )
    with pytest.raises(ToolError, match="ran too long"):
        run_query(database, endless)
    assert run_query(database, "SELECT count(*) FROM topics").splitlines()[1].isdigit()


def test_the_tool_declares_no_partial_input() -> None:
    spec = declared_spec(query_database, "query_database")
    assert spec.name == "query_database"
    assert spec.partial_input is None
    assert spec.side_effect_free
