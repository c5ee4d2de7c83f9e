"""Markdown tables, as the benchmark's report writes them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The table's lines: the header, its rule and a line per row. A row shorter
    than the header leaves its last columns blank (`| |`), as a failed system's
    row does, where a cell given as "" reads `|  |`."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        blank = " |" * (len(headers) - len(row))
        lines.append("| " + " | ".join(row) + " |" + blank)
    return lines
