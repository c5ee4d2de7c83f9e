"""The ingress's metrics: API requests by route and status, latency, agent
hints, the response cache's lookups; programs' completion and turns."""

from __future__ import annotations

from cluster.policies.program_clock import EndedProgram


class ApiMetrics:
    def __init__(self) -> None:
        from ray.serve.metrics import Counter, Histogram

        self.requests = Counter(
            "toolserve_api_requests",
            description="API requests by route and HTTP status.",
            tag_keys=("route", "status"),
        )
        self.latency = Histogram(
            "toolserve_api_request_latency_s",
            description="Time to the full reply (non-streaming) or the first byte (streaming).",
            boundaries=[0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120],
            tag_keys=("route",),
        )
        self.hints = Counter(
            "toolserve_agent_hints",
            description="Agent hints taken from chat requests, by dialect and hint "
            "(e.g. dynamo.priority, sglang.retain_for_s, toolserve.last_turn).",
            tag_keys=("hint",),
        )
        self.quota_refusals = Counter(
            "toolserve_quota_refusals",
            description="Requests refused with 429 for a tenant's quota, by quota "
            "(requests_per_s, programs).",
            tag_keys=("quota",),
        )
        self.turn_resends = Counter(
            "toolserve_turn_resends",
            description="Turns sent again because the replica they went to was lost "
            "before it answered; a live replica takes them and computes their prefix.",
        )
        self.response_cache_lookups = Counter(
            "toolserve_response_cache_lookups",
            description="Chat requests the response cache could answer, by result "
            "(hit: answered from a kept reply; miss: sent to the engine).",
            tag_keys=("result",),
        )
        self.response_cache_kept = Counter(
            "toolserve_response_cache_kept",
            description="Replies kept in the response cache.",
        )


class ProgramMetrics:
    def __init__(self) -> None:
        from ray.serve.metrics import Histogram

        self.completion = Histogram(
            "toolserve_program_completion_s",
            description="Agent programs' completion time: first turn's arrival to last "
            "turn's end, by how the program ended (last_step, deleted, idle, evicted).",
            boundaries=[1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600],
            tag_keys=("reason",),
        )
        self.turns = Histogram(
            "toolserve_program_turns",
            description="Turns per ended agent program.",
            boundaries=[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128],
        )
        self.turn_latency = Histogram(
            "toolserve_turn_latency_s",
            description="A turn's arrival to the end of its reply (the last chunk of a "
            "stream), by the turn's index in its program (1, 2, 3-4, ..., 33+).",
            boundaries=[0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300],
            tag_keys=("turn",),
        )

    def ended(self, programs: list[EndedProgram]) -> None:
        for program in programs:
            self.completion.observe(program.completion_s, tags={"reason": program.reason})
            self.turns.observe(program.turns)
