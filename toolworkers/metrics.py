"""Tool metrics (Ray Serve metrics, scraped with the rest): cache hits and
misses, tool latency per tool, the time speculation saved real calls, and partial
runs (started, ended, pieces fed, the time they worked while the model was still
writing their calls)."""

from __future__ import annotations

from toolworkers.execution import PARTIAL_ORIGIN, ResultSource, ToolOutcome

_LATENCY_BOUNDARIES = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60]


def time_saved_s(outcome: ToolOutcome, requester_origin: str) -> float | None:
    """What a real call gained from a result someone else produced early (a
    speculation, or the client's posted output): the run it did not wait for.
    None when the call ran itself or was itself a speculation."""
    if requester_origin or not outcome.origin:
        return None
    if outcome.source not in (ResultSource.CACHED, ResultSource.AWAITED):
        return None
    return max(0.0, outcome.result.duration_s - outcome.waited_s)


class ToolMetrics:
    """Created inside a Ray actor (ingress or replica)."""

    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Histogram

        self._lookups = Counter(
            "toolserve_tool_cache_lookups",
            description="Cacheable hosted calls looked up in the global tool cache.",
            tag_keys=("tool",),
        )
        self._hits = Counter(
            "toolserve_tool_cache_hits",
            description="Lookups served from the cache, including calls awaited while "
            "another requester ran them.",
            tag_keys=("tool",),
        )
        self._latency = Histogram(
            "toolserve_tool_latency_s",
            description="Duration of hosted tool runs on the tool workers.",
            boundaries=_LATENCY_BOUNDARIES,
            tag_keys=("tool",),
        )
        self._saved = Histogram(
            "toolserve_tool_time_saved_s",
            description="Per call the model made: tool time it did not wait for because a "
            "speculation (or the client) had produced the result.",
            boundaries=_LATENCY_BOUNDARIES,
            tag_keys=("tool", "origin"),
        )

        self._overlapped = Histogram(
            "toolserve_tool_partial_overlap_s",
            description="Per call run on partial input: tool time spent while the model "
            "was still writing the call (the run's duration less the wait after the call "
            "closed).",
            boundaries=_LATENCY_BOUNDARIES,
            tag_keys=("tool",),
        )

        self._partial_started = Counter(
            "toolserve_partial_runs_started",
            description="Calls started on partial input while the model wrote them.",
            tag_keys=("tool",),
        )
        self._partial_ended = Counter(
            "toolserve_partial_runs_ended",
            description="Partial runs by how they ended: finished (their outcome answered "
            "the call), broken (pieces could not be sent: the call ran whole), abandoned "
            "(stopped: the call changed or nobody took its outcome).",
            tag_keys=("tool", "ending"),
        )
        self._pieces = Counter(
            "toolserve_partial_pieces_fed",
            description="Pieces of calls' arguments (fields, lines, stages) fed to partial "
            "runs as they were written.",
            tag_keys=("tool",),
        )

    def partial_started(self, tool: str) -> None:
        self._partial_started.inc(tags={"tool": tool})

    def partial_ended(self, tool: str, ending: str, pieces: int) -> None:
        self._partial_ended.inc(tags={"tool": tool, "ending": ending})
        if pieces:
            self._pieces.inc(pieces, tags={"tool": tool})

    def observe(self, tool: str, outcome: ToolOutcome, requester_origin: str) -> None:
        if requester_origin == PARTIAL_ORIGIN:
            overlapped = max(0.0, outcome.result.duration_s - outcome.waited_s)
            self._overlapped.observe(overlapped, tags={"tool": tool})
        if outcome.source in (ResultSource.RAN, ResultSource.UNCACHED):
            self._latency.observe(outcome.result.duration_s, tags={"tool": tool})
        if outcome.source is not ResultSource.UNCACHED:
            self._lookups.inc(tags={"tool": tool})
        if outcome.source in (ResultSource.CACHED, ResultSource.AWAITED):
            self._hits.inc(tags={"tool": tool})
        saved = time_saved_s(outcome, requester_origin)
        if saved is not None:
            self._saved.observe(saved, tags={"tool": tool, "origin": outcome.origin})
