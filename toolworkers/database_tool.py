"""A read-only SQL tool over a small local database (Conveyor, arXiv 2406.00059,
§4: the Database workload, one of its null cases: a query can only run once it is
written whole, so the tool takes no partial input).

The database is the Python language reference's help topics as pydoc ships them
(`pydoc_data.topics`): one row per topic with its name, its length in words and
its first line, built in memory by each call's process. Only reading is allowed:
SQLite's authorizer denies every action but reading and selecting, and a query
stops after a bounded number of virtual-machine steps."""

from __future__ import annotations

import sqlite3
from typing import Any

from toolworkers.builtin_tools import ToolError, string_parameter
from toolworkers.registry import hosted_tool

_ROWS_SHOWN = 20
_STEP_BUDGET = 2_000_000
_STEPS_PER_CHECK = 1_000
_READ_ONLY_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}

TOPICS_TABLE = "topics(name TEXT PRIMARY KEY, words INTEGER, first_line TEXT)"


def reference_topics_database() -> sqlite3.Connection:
    """An in-memory database with the table `topics(name, words, first_line)`."""
    from pydoc_data.topics import topics

    database = sqlite3.connect(":memory:")
    database.execute(f"CREATE TABLE {TOPICS_TABLE}")
    database.executemany(
        "INSERT INTO topics VALUES (?, ?, ?)",
        [
            (name, len(body.split()), body.strip().splitlines()[0] if body.strip() else "")
            for name, body in sorted(topics.items())
        ],
    )
    return database


def _read_only(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _READ_ONLY_ACTIONS else sqlite3.SQLITE_DENY


def run_query(database: sqlite3.Connection, sql: str) -> str:
    """The query's rows as text (header, then one line per row, at most
    `_ROWS_SHOWN`), or a `ToolError` saying why it cannot run."""
    steps_left = _STEP_BUDGET // _STEPS_PER_CHECK

    def out_of_steps() -> int:
        nonlocal steps_left
        steps_left -= 1
        return 1 if steps_left < 0 else 0

    database.set_authorizer(_read_only)
    database.set_progress_handler(out_of_steps, _STEPS_PER_CHECK)
    try:
        cursor = database.execute(sql)
        rows = cursor.fetchmany(_ROWS_SHOWN + 1)
    except sqlite3.Error as error:
        if steps_left < 0:
            raise ToolError("the query ran too long and was stopped") from error
        raise ToolError(f"the query cannot run: {error}") from error
    finally:
        database.set_progress_handler(None, 0)
        database.set_authorizer(None)
    header = " | ".join(column[0] for column in cursor.description or ())
    lines = [" | ".join(str(value) for value in row) for row in rows[:_ROWS_SHOWN]]
    if len(rows) > _ROWS_SHOWN:
        lines.append(f"... (more rows than the {_ROWS_SHOWN} shown)")
    return "\n".join([header, *lines]) if lines else f"{header}\n(no rows)"


@hosted_tool(
    name="query_database",
    description="Run one read-only SQL SELECT over the table "
    f"{TOPICS_TABLE}, the Python language reference's help topics, and return the rows.",
    parameters=string_parameter("sql", "One SQLite SELECT statement"),
    side_effect_free=True,
    program_scoped=False,
    timeout_s=5.0,
)
def query_database(sql: str) -> str:
    return run_query(reference_topics_database(), sql)
