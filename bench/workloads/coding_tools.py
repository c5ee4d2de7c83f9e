"""The coding agent's tools, shared by the many-agent trace's SWE-bench-shaped
programs and the scripted coding workflows."""

from __future__ import annotations

from typing import Any

from toolworkers.builtin_tools import openai_function_schema

# A bound on each string argument: under a named tool choice the grammar then
# closes the call; SmolLM2-135M otherwise writes one path or query until the
# turn's token cap and never completes a call.
MAX_ARGUMENT_CHARS = 40


def _text(description: str | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": MAX_ARGUMENT_CHARS}
    return schema | ({"description": description} if description else {})


LIST_FILES = openai_function_schema(
    "list_files",
    "List the files of the repository.",
    {"type": "object", "properties": {"directory": _text()}},
)
READ_FILE = openai_function_schema(
    "read_file",
    "Read a file of the repository.",
    {
        "type": "object",
        "properties": {"path": _text("File path.")},
        "required": ["path"],
    },
)
SEARCH_CODE = openai_function_schema(
    "search_code",
    "Search the repository for a symbol or text.",
    {
        "type": "object",
        "properties": {"query": _text("What to look for.")},
        "required": ["query"],
    },
)
RUN_TESTS = openai_function_schema(
    "run_tests",
    "Run the test suite, or one test file.",
    {
        "type": "object",
        "properties": {"target": _text("Test file or 'all'.")},
        "required": ["target"],
    },
)
EDIT_FILE = openai_function_schema(
    "edit_file",
    "Replace a line of a file.",
    {
        "type": "object",
        "properties": {
            "path": _text(),
            "line": {"type": "integer"},
            "text": _text(),
        },
        "required": ["path", "line", "text"],
    },
)
