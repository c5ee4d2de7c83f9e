"""How long to keep a program's KV pinned while its tool runs (Continuum's cost model).

    τ* = argmax_τ  P(τ, f) · (T · η + PrefillReload(r)) - D · τ

P(τ, f) is the empirical CDF of tool f's observed durations: the chance the
program is back within τ. A program not back after the longest TTL counts as an
infinite duration, so tools (and turns without a tool call) after which programs
often stop get short pins or none. The bracket is what a return within the TTL saves: the
queueing delay T a request pays when it lost its KV, scaled by how predictable
the remaining work of programs is (η), plus re-prefilling the r-token context
(or, with a CPU tier under the KV cache, copying it back from there).
τ costs the KV others could have used meanwhile. Continuum charges one second
per second held (D = 1). Here the charge is the share D of the pin's blocks that
others' demand reaches now (`displaced_share`): a pin on memory nobody waits for
delays nobody, and when demand grows the scheduler releases pins (latest-arrived
program first) before a request waits for memory. Optionally the charge is at
least the pin's share of the evictable prefix cache (`withheld_cache_share`):
while nobody waits, new requests still evict other programs' cached prefixes
from the free blocks, sooner the fewer there are beside the pin.
"""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class PrefillProfile:
    """Prefill seconds of a context of n tokens: a·n² + b·n + c."""

    a: float
    b: float
    c: float

    @classmethod
    def fit(cls, lengths: Sequence[int], seconds: Sequence[float]) -> PrefillProfile:
        if len(lengths) != len(seconds) or len(lengths) < 3:
            raise ValueError("a quadratic profile needs at least three (length, seconds) pairs")
        a, b, c = np.polyfit(np.asarray(lengths, float), np.asarray(seconds, float), 2)
        return cls(float(a), float(b), float(c))

    def seconds(self, tokens: int) -> float:
        return max(0.0, self.a * tokens * tokens + self.b * tokens + self.c)


@dataclass(frozen=True)
class OffloadReload:
    """Seconds to copy a context of n tokens back from a CPU tier: its KV bytes
    over the host-to-device rate."""

    bytes_per_token: float
    bytes_per_s: float

    def seconds(self, tokens: int) -> float:
        return tokens * self.bytes_per_token / self.bytes_per_s


@dataclass(frozen=True)
class RetentionHint:
    """A client's word on a turn's program: keep its KV `retain_for_s` seconds
    (inf: as long as allowed), or its tool takes about `expected_tool_s`."""

    retain_for_s: float | None = None
    expected_tool_s: float | None = None


def empirical_cdf(samples: Sequence[float], value: float) -> float:
    """Share of samples at or below value."""
    if not samples:
        return 0.0
    return sum(1 for sample in samples if sample <= value) / len(samples)


def displaced_share(free_blocks: int, waiting_blocks: int, own_blocks: int) -> float:
    """Share of a pin's `own_blocks` that waiting requests need beyond the free
    blocks, in [0, 1]: what holding the pin costs per second, relative to
    Continuum's full charge."""
    if own_blocks <= 0:
        return 0.0
    return min(1.0, max(0.0, (waiting_blocks - free_blocks) / own_blocks))


def withheld_cache_share(free_blocks: int, own_blocks: int) -> float:
    """Share of the evictable prefix cache (the free blocks, which hold other
    programs' cached prefixes until new requests take them, and the pin's own) that
    a pin of `own_blocks` withholds, in [0, 1]."""
    if own_blocks <= 0:
        return 0.0
    return own_blocks / (own_blocks + max(0, free_blocks))


def holding_cost(
    free_blocks: int, waiting_blocks: int, own_blocks: int, *, charge_withheld_cache: bool
) -> float:
    """What holding a pin costs per second, relative to Continuum's full charge:
    the share of it waiting requests need, and with `charge_withheld_cache` at
    least its share of the evictable prefix cache."""
    demand = displaced_share(free_blocks, waiting_blocks, own_blocks)
    if not charge_withheld_cache:
        return demand
    return max(demand, withheld_cache_share(free_blocks, own_blocks))


def best_ttl(
    durations: Sequence[float],
    benefit_s: float,
    max_ttl_s: float,
    holding_cost: float = 1.0,
    idle_hold_factor: float = math.inf,
) -> float:
    """The τ in {0} and the observed durations (up to max_ttl_s) maximising
    P(τ)·benefit - holding_cost·τ; when holding costs nothing and a pin pays
    at all, `idle_hold_factor` times that (up to max_ttl_s).

    The objective only rises at observed durations and falls in between, so the
    optimum is one of them or 0; ties go to the shorter TTL. At zero cost the
    optimum is the longest return seen, and the objective is flat past it: a
    program slower than any seen so far still gains from a longer pin, but after
    n returns the next is slower than all of them only once in n + 1, while a pin
    held in vain keeps others' cached prefixes out of the free blocks.
    """
    best, best_value = 0.0, 0.0
    for candidate in sorted(set(durations)):
        if candidate > max_ttl_s:
            break
        value = empirical_cdf(durations, candidate) * benefit_s - holding_cost * candidate
        if value > best_value:
            best, best_value = candidate, value
    if holding_cost <= 0 and best_value > 0:
        return min(max_ttl_s, best * idle_hold_factor)
    return best


def memoryfulness(program_turns: Sequence[int]) -> float | None:
    """η = -Corr(k, N-k) over turns k = 1..N-1 of completed N-turn programs.

    1 when every program has the same length (turns done predict turns left),
    near 0 when lengths are memoryless; None when undefined (too few pairs or no
    variance), clipped to [0, 1].
    """
    done: list[int] = []
    left: list[int] = []
    for turns in program_turns:
        for k in range(1, turns):
            done.append(k)
            left.append(turns - k)
    if len(done) < 2 or len(set(done)) < 2 or len(set(left)) < 2:
        return None
    correlation = statistics.correlation(done, left)
    return min(1.0, max(0.0, -correlation))


DurationsBy = Literal["tool", "single"]


class TtlCostModel:
    """Learns from traffic and answers `ttl(tool, context_tokens, holding_cost)`.

    With `durations_by="tool"`, a pin is priced from the durations of the tool
    being called, as its tenant's calls of it took (tools differ by orders of
    magnitude: a file read, a test run); until those are `min_tool_samples`,
    from the program's own returns, then the tool's across tenants, then every
    tool's together (a default TTL only until those are enough). With
    `"single"`, every pin from every tool's durations together."""

    def __init__(
        self,
        *,
        fixed_ttl_s: float,
        max_ttl_s: float,
        min_tool_samples: int,
        sample_window: int,
        default_memoryfulness: float,
        use_cost_model: bool = True,
        durations_by: DurationsBy = "tool",
        idle_hold_factor: float = math.inf,
        max_tracked_programs: int = 4096,
    ):
        self._fixed_ttl_s = min(fixed_ttl_s, max_ttl_s)
        self.max_ttl_s = max_ttl_s
        self._idle_hold_factor = idle_hold_factor
        self._min_tool_samples = min_tool_samples
        self._use_cost_model = use_cost_model
        self._durations_by = durations_by
        self._default_memoryfulness = default_memoryfulness
        self._sample_window = sample_window
        self._tenant_tool_durations: defaultdict[tuple[str, str], deque[float]] = defaultdict(
            lambda: deque(maxlen=sample_window)
        )
        self._tool_durations: defaultdict[str, deque[float]] = defaultdict(
            lambda: deque(maxlen=sample_window)
        )
        self._program_durations: OrderedDict[str, deque[float]] = OrderedDict()
        self._max_tracked_programs = max_tracked_programs
        self._all_durations: deque[float] = deque(maxlen=sample_window)
        self._queueing_delays: deque[float] = deque(maxlen=sample_window)
        self._program_turns: deque[int] = deque(maxlen=sample_window)
        self.prefill_profile: PrefillProfile | None = None
        self.offload_reload: OffloadReload | None = None

    def observe_tool_duration(
        self, tool: str, seconds: float, *, tenant: str = "", program_id: str | None = None
    ) -> None:
        """`seconds` may be math.inf: the program did not come back."""
        seconds = max(0.0, seconds)
        self._tenant_tool_durations[tenant, tool].append(seconds)
        self._tool_durations[tool].append(seconds)
        self._all_durations.append(seconds)
        if program_id is not None:
            durations = self._program_durations.get(program_id)
            if durations is None:
                durations = self._program_durations[program_id] = deque(maxlen=self._sample_window)
                while len(self._program_durations) > self._max_tracked_programs:
                    self._program_durations.popitem(last=False)
            else:
                self._program_durations.move_to_end(program_id)
            durations.append(seconds)

    def forget_program(self, program_id: str) -> None:
        """The program ended: its own returns no longer predict anything."""
        self._program_durations.pop(program_id, None)

    def observe_queueing_delay_without_kv(self, seconds: float) -> None:
        self._queueing_delays.append(max(0.0, seconds))

    def observe_program_completed(self, turns: int) -> None:
        self._program_turns.append(turns)

    @property
    def mean_queueing_delay_s(self) -> float:
        return statistics.fmean(self._queueing_delays) if self._queueing_delays else 0.0

    @property
    def memoryfulness(self) -> float:
        measured = memoryfulness(self._program_turns)
        return self._default_memoryfulness if measured is None else measured

    def reload_s(self, context_tokens: int) -> float:
        """What a lost pin costs to rebuild: a reload from the CPU tier where
        there is one (evicted blocks live on there), else a prefill."""
        if self.offload_reload is not None:
            return self.offload_reload.seconds(context_tokens)
        profile = self.prefill_profile
        return profile.seconds(context_tokens) if profile is not None else 0.0

    def _durations(
        self, tool: str | None, tenant: str, program_id: str | None
    ) -> deque[float] | None:
        if tool is None:
            return None
        if self._durations_by == "single":
            chain: tuple[deque[float] | None, ...] = (self._all_durations,)
        else:
            chain = (
                self._tenant_tool_durations.get((tenant, tool)),
                None if program_id is None else self._program_durations.get(program_id),
                self._tool_durations.get(tool),
                self._all_durations,
            )
        for durations in chain:
            if durations is not None and len(durations) >= self._min_tool_samples:
                return durations
        return None

    def ttl(
        self,
        tool: str | None,
        context_tokens: int,
        holding_cost: float = 1.0,
        hint: RetentionHint | None = None,
        *,
        tenant: str = "",
        program_id: str | None = None,
    ) -> float:
        """Without enough samples: the fixed TTL, or the longest while holding
        costs nothing (a pin on memory nobody waits for delays nobody).

        A client's `retain_for_s` is the TTL (up to `max_ttl_s`), in every mode;
        its `expected_tool_s` stands in for the tool's observed durations. While
        holding costs nothing, a pin that pays at all lasts at least the fixed TTL."""
        if hint is not None and hint.retain_for_s is not None:
            return min(hint.retain_for_s, self.max_ttl_s)
        if not self._use_cost_model:
            return self._fixed_ttl_s
        if hint is not None and hint.expected_tool_s is not None:
            durations: Sequence[float] | None = [hint.expected_tool_s]
        else:
            durations = self._durations(tool, tenant, program_id)
        if durations is None:
            return self.max_ttl_s if holding_cost <= 0 else self._fixed_ttl_s
        benefit = self.mean_queueing_delay_s * self.memoryfulness + self.reload_s(context_tokens)
        ttl = best_ttl(
            list(durations), benefit, self.max_ttl_s, holding_cost, self._idle_hold_factor
        )
        if holding_cost <= 0 and ttl > 0:
            # A fast tool's returns are late by the client's own stalls, not the tool.
            return max(ttl, self._fixed_ttl_s)
        return ttl
