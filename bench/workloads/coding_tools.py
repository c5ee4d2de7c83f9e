"""The coding agent's tools, shared by the many-agent trace's SWE-bench-shaped
programs and the scripted coding workflows."""

from __future__ import annotations

from toolworkers.builtin_tools import openai_function_schema

LIST_FILES = openai_function_schema(
    "list_files",
    "List the files of the repository.",
    {"type": "object", "properties": {"directory": {"type": "string"}}},
)
READ_FILE = openai_function_schema(
    "read_file",
    "Read a file of the repository.",
    {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "File path."}},
        "required": ["path"],
    },
)
SEARCH_CODE = openai_function_schema(
    "search_code",
    "Search the repository for a symbol or text.",
    {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What to look for."}},
        "required": ["query"],
    },
)
RUN_TESTS = openai_function_schema(
    "run_tests",
    "Run the test suite, or one test file.",
    {
        "type": "object",
        "properties": {"target": {"type": "string", "description": "Test file or 'all'."}},
        "required": ["target"],
    },
)
EDIT_FILE = openai_function_schema(
    "edit_file",
    "Replace a line of a file.",
    {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "line": {"type": "integer"},
            "text": {"type": "string"},
        },
        "required": ["path", "line", "text"],
    },
)
