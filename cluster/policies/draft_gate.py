"""Pure: how many prompt-lookup drafts each decoding request may have verified in
its next step, after the stateful multi-agent inference paper's gating (§3.6):
the whole window while the request writes a tool call (names, keys and values
copied from the prompt), a floor in prose that grows with the request's own
acceptance there (an exponential moving average), none in prose whose drafts are
almost never accepted but for a periodic probe step, and, with a concurrency
cap, no drafts at all while more requests decode together than verification
pays for (each verified draft costs a batch slot's compute whether or not it is
accepted)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.config import PromptLookupConfig

CALL = "tool_call"
PROSE = "prose"


@dataclass(frozen=True)
class GateSettings:
    window: int
    """Most drafts a request has verified per step (vLLM's num_speculative_tokens)."""
    prose_floor: int
    """Drafts in prose whatever the acceptance."""
    ema_weight: float
    """Weight of the newest step in the acceptance average."""
    initial_acceptance: float
    """A request's acceptance in prose before its first verified step."""
    max_decoders: int | None
    """Above this many decoding requests, no request gets drafts (None: no cap)."""
    min_prose_acceptance: float = 0.0
    """Below this acceptance in prose, drafts only on probe steps."""
    probe_every: int = 1
    """Steps per probe step while prose drafts are withheld."""
    learned_initial_acceptance: bool = False
    """A request's acceptance before its first verified prose step is the
    engine's recent prose acceptance (`initial_acceptance` until it has any)."""
    prior_decay: float = 0.98
    """Weight each earlier prose step keeps in the engine's recent acceptance, per
    verified prose step after it."""
    past_cap_acceptance: float | None = None
    """Above `max_decoders`, a request in prose whose acceptance is at least this
    keeps its drafts (None: no request does)."""


def gate_settings(config: PromptLookupConfig) -> GateSettings:
    """The gate a prompt-lookup configuration describes."""
    return GateSettings(
        window=config.window,
        prose_floor=config.prose_floor,
        ema_weight=config.ema_weight,
        initial_acceptance=config.initial_acceptance,
        max_decoders=config.max_decoders,
        min_prose_acceptance=config.min_prose_acceptance,
        probe_every=config.probe_every,
        learned_initial_acceptance=config.learned_initial_acceptance,
        past_cap_acceptance=config.past_cap_acceptance,
    )


class CallRegions:
    """Whether each request's output is inside a tool call: its last opening
    marker (e.g. hermes' `<tool_call>` as token ids) came after its last closing
    one. Where both end at one token, the closing one wins: the opening may be
    given without its first token (which merges with the text before it), and
    is then a suffix of the closing marker. Fed each request's new output tokens
    as they are generated."""

    def __init__(self, opening: Sequence[int], closing: Sequence[int]):
        self._opening = tuple(opening)
        self._closing = tuple(closing)
        self._tail_length = max(len(self._opening), len(self._closing)) - 1
        self._tails: dict[str, tuple[int, ...]] = {}
        self._inside: dict[str, bool] = {}

    def feed(self, request_id: str, new_tokens: Sequence[int]) -> bool:
        """Whether the request is inside a call after these tokens."""
        tail = self._tails.get(request_id, ())
        inside = self._inside.get(request_id, False)
        tokens = tail + tuple(new_tokens)
        for end in range(len(tail) + 1, len(tokens) + 1):
            if self._closing and tokens[max(0, end - len(self._closing)) : end] == self._closing:
                inside = False
            elif self._opening and tokens[max(0, end - len(self._opening)) : end] == self._opening:
                inside = True
        self._tails[request_id] = tokens[max(0, len(tokens) - self._tail_length) :]
        self._inside[request_id] = inside
        return inside

    def inside(self, request_id: str) -> bool:
        return self._inside.get(request_id, False)

    def forget(self, request_id: str) -> None:
        self._tails.pop(request_id, None)
        self._inside.pop(request_id, None)


@dataclass
class RegionCounts:
    steps: int = 0
    """Request-steps that verified drafts."""
    drafted: int = 0
    accepted: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"steps": self.steps, "drafted": self.drafted, "accepted": self.accepted}


@dataclass
class GateStats:
    """Counts since the last `take_stats`, by region."""

    regions: dict[str, RegionCounts] = field(
        default_factory=lambda: {CALL: RegionCounts(), PROSE: RegionCounts()}
    )
    predicted: dict[str, RegionCounts] = field(default_factory=dict)
    """Of the tool-call region's, the steps whose drafts came from a predicted
    call, by the predicted call's tool."""
    capped_steps: int = 0
    """Scheduler steps in which the concurrency cap withheld every draft."""

    def as_dict(self) -> dict[str, object]:
        return {
            "regions": {name: counts.as_dict() for name, counts in self.regions.items()},
            "predicted": {tool: counts.as_dict() for tool, counts in self.predicted.items()},
            "capped_steps": self.capped_steps,
        }


class ProposalGate:
    def __init__(self, settings: GateSettings):
        self.settings = settings
        self._acceptance: dict[str, float] = {}
        self._withheld: dict[str, int] = {}
        self._recent_drafted = 0.0
        self._recent_accepted = 0.0
        self._stats = GateStats()

    def initial_acceptance(self) -> float:
        """What a request's prose acceptance starts from."""
        if self.settings.learned_initial_acceptance and self._recent_drafted > 0:
            return self._recent_accepted / self._recent_drafted
        return self.settings.initial_acceptance

    def over_cap(self, decoders: int) -> bool:
        """Whether more requests decode than the cap allows drafts for (counted)."""
        cap = self.settings.max_decoders
        over = cap is not None and decoders > cap
        if over:
            self._stats.capped_steps += 1
        return over

    def draft_length(self, request_id: str, in_call: bool, over_cap: bool = False) -> int:
        """Drafts the request may have verified this step; `over_cap`: more
        requests decode than `max_decoders`."""
        window = self.settings.window
        past_cap = self.settings.past_cap_acceptance
        if over_cap and (past_cap is None or in_call):
            return 0
        if in_call:
            return window
        acceptance = self._acceptance.get(request_id)
        if acceptance is None:
            acceptance = self._acceptance[request_id] = self.initial_acceptance()
        if over_cap and past_cap is not None and acceptance < past_cap:
            return 0
        floor = self.settings.prose_floor
        if acceptance < self.settings.min_prose_acceptance:
            withheld = self._withheld.get(request_id, 0) + 1
            if withheld < self.settings.probe_every:
                self._withheld[request_id] = withheld
                return 0
            self._withheld[request_id] = 0
            return max(1, floor)
        return max(floor, min(window, round(window * acceptance)))

    def observe(
        self,
        request_id: str,
        drafted: int,
        accepted: int,
        in_call: bool,
        predicted_tool: str | None = None,
    ) -> None:
        """A verified step: `accepted` of `drafted` drafts were right; in a call,
        drafted from `predicted_tool`'s predicted call when one is named."""
        if drafted <= 0:
            return
        counted = [self._stats.regions[CALL if in_call else PROSE]]
        if in_call and predicted_tool is not None:
            counted.append(self._stats.predicted.setdefault(predicted_tool, RegionCounts()))
        for counts in counted:
            counts.steps += 1
            counts.drafted += drafted
            counts.accepted += accepted
        if not in_call:
            weight = self.settings.ema_weight
            previous = self._acceptance.get(request_id)
            if previous is None:
                previous = self.initial_acceptance()
            self._acceptance[request_id] = (1 - weight) * previous + weight * accepted / drafted
            decay = self.settings.prior_decay
            self._recent_drafted = decay * self._recent_drafted + drafted
            self._recent_accepted = decay * self._recent_accepted + accepted

    def forget(self, request_id: str) -> None:
        self._acceptance.pop(request_id, None)
        self._withheld.pop(request_id, None)

    def take_stats(self) -> GateStats:
        stats, self._stats = self._stats, GateStats()
        return stats
