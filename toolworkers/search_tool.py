"""A search tool over a local corpus that starts searching as soon as the model
has written its query, while the rest of the call is still being decoded
(Conveyor, arXiv 2406.00059, §4: the Search tool; there a web search, here a
local full-text index, so no network is needed).

The corpus is the Python language reference's topics as pydoc ships them with
Python (`pydoc_data.topics`), indexed with SQLite's FTS5 and ranked by BM25. The
index is built in memory by each call's process when the call starts (tens of
milliseconds), which a partially executed call overlaps with decoding too."""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from toolworkers.builtin_tools import ToolError
from toolworkers.partial_input import PartialInput, PieceKind, run_whole
from toolworkers.registry import CostClass, hosted_tool

_QUERY = "query"
_MAX_RESULTS = "max_results"
_DEFAULT_RESULTS = 3
_RESULTS_CAP = 10
_SNIPPET_TOKENS = 24
_WORD = re.compile(r"\w+")

SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        _QUERY: {"type": "string", "description": "Words to look for"},
        _MAX_RESULTS: {
            "type": "integer",
            "description": f"How many topics to return (1 to {_RESULTS_CAP}, default "
            f"{_DEFAULT_RESULTS})",
            "minimum": 1,
            "maximum": _RESULTS_CAP,
        },
    },
    "required": [_QUERY],
}


def python_reference_index() -> sqlite3.Connection:
    """An in-memory FTS5 index of the Python reference's topics."""
    from pydoc_data.topics import topics

    index = sqlite3.connect(":memory:")
    index.execute("CREATE VIRTUAL TABLE docs USING fts5(topic, body, tokenize='porter unicode61')")
    index.executemany("INSERT INTO docs VALUES (?, ?)", sorted(topics.items()))
    return index


def match_expression(query: str) -> str:
    """The query's words as an FTS5 expression matching any of them: a model's
    query is text, not FTS5 syntax, so its quotes and operators are not obeyed."""
    words = _WORD.findall(query)
    if not words:
        raise ToolError("the query has no words to search for")
    return " OR ".join(f'"{word}"' for word in words)


class ReferenceSearch:
    """Searches of the Python reference, one index for all of them."""

    def __init__(self) -> None:
        self._index = python_reference_index()

    def hits(self, query: str, limit: int = _RESULTS_CAP) -> list[tuple[str, str]]:
        """The best `limit` topics for the query, each with its excerpt."""
        rows = self._index.execute(
            "SELECT topic, snippet(docs, 1, '', '', '...', ?) FROM docs WHERE docs MATCH ? "
            "ORDER BY bm25(docs), topic LIMIT ?",
            (_SNIPPET_TOKENS, match_expression(query), limit),
        ).fetchall()
        return [(topic, " ".join(snippet.split())) for topic, snippet in rows]


def format_hits(query: str, hits: list[tuple[str, str]]) -> str:
    if not hits:
        return f"No topic of the Python reference matches {query!r}."
    return "\n\n".join(
        f"{rank}. {topic}: {snippet}" for rank, (topic, snippet) in enumerate(hits, start=1)
    )


class SearchSession:
    """A search call in progress: the index is built when the call starts, the
    search runs when the query is fed, and `finish` formats the hits the call's
    `max_results` asks for."""

    def __init__(self) -> None:
        self._search = ReferenceSearch()
        self._hits: list[tuple[str, str]] | None = None
        self._failed: ToolError | None = None
        self._searched_for: str | None = None

    def feed(self, query: Any) -> None:
        if not isinstance(query, str) or self._searched_for is not None:
            return
        self._searched_for = query
        try:
            self._hits = self._search.hits(query)
        except ToolError as error:
            self._failed = error

    def finish(self, arguments: dict[str, Any]) -> str:
        query = arguments.get(_QUERY)
        if not isinstance(query, str):
            raise ToolError(f"`{_QUERY}` must be a string")
        wanted = arguments.get(_MAX_RESULTS, _DEFAULT_RESULTS)
        if isinstance(wanted, bool) or not isinstance(wanted, int):
            raise ToolError(f"`{_MAX_RESULTS}` must be an integer")
        if not 1 <= wanted <= _RESULTS_CAP:
            raise ToolError(f"`{_MAX_RESULTS}` must be between 1 and {_RESULTS_CAP}")
        if self._searched_for != query:  # a repeated key: the last one is the query
            self._searched_for, self._hits, self._failed = None, None, None
            self.feed(query)
        if self._failed is not None:
            raise self._failed
        return format_hits(query, (self._hits or [])[:wanted])


SEARCH_INPUT = PartialInput(argument=_QUERY, pieces=PieceKind.FIELD, session=SearchSession)


@hosted_tool(
    name="search",
    description="Search the Python language reference (its help topics) and return "
    "the best matching topics with an excerpt of each.",
    parameters=SEARCH_PARAMETERS,
    side_effect_free=True,
    program_scoped=False,
    cost_class=CostClass.MODERATE,
    timeout_s=5.0,
    partial_input=SEARCH_INPUT,
)
def search(query: str, max_results: int = _DEFAULT_RESULTS) -> str:
    return run_whole(SEARCH_INPUT, {_QUERY: query, _MAX_RESULTS: max_results}, {})
