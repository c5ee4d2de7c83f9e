"""A workload at one size: how its programs are built and the engine budget it
is meant to run under."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from bench.workloads.program import AgentProgram

if TYPE_CHECKING:
    # Both modules plan workloads of their own with this type.
    from bench.workloads.aiperf import AiperfWorkload
    from bench.workloads.client_agents import ClientAgentsConfig
    from bench.workloads.hot_path import HotPathConfig

Size = Literal["quick", "default"]
SIZES: tuple[Size, ...] = ("quick", "default")


@dataclass(frozen=True)
class WorkloadPlan:
    """A workload at one size, with the engine budget it is meant to run under."""

    name: str
    size: Size
    description: str
    build: Callable[[int], Sequence[AgentProgram]]
    kv_cache_mib: int
    max_model_len: int
    toolserve_overrides: dict[str, Any] = field(default_factory=dict)
    """Configuration toolserve systems need for this workload (hosted tools)."""
    reference_system: str | None = None
    """The system per-agent-kind time saved is measured against, when it ran."""
    tool_of_agent_type: dict[str, str] = field(default_factory=dict)
    """The hosted tool each agent kind calls, whose own run time the report sets
    beside the kind's time to its first tool result."""
    peer: AiperfWorkload | None = None
    """Conversations AIPerf sends instead of this harness's programs (`build` is
    then empty)."""
    hot_path: HotPathConfig | None = None
    """Phases of one-token completions sent instead of programs (`build` is then
    empty)."""
    client_agents: ClientAgentsConfig | None = None
    """Agents written with client libraries, which send their own requests
    (`build` is then empty)."""
    programs: int | None = None
    """Programs a round, where the workload is sized by their count (`--programs`
    sets it)."""


def programs_update(
    size_programs: int, size_arrival_rate_per_s: float, programs: int | None
) -> dict[str, int | float]:
    """`--programs N`: the change to a size's trace that runs N programs over the
    arrival window of the size's own count (its programs over its rate), so only
    the concurrency changes; none for the size's own count, whose programs stay
    those drawn without the option."""
    if programs is None or programs == size_programs:
        return {}
    if programs < 1:
        raise ValueError(f"--programs must be at least 1, got {programs}")
    # Rounded so that a count's rate does not depend on the size's own count in
    # the last bit (0.3 * 32 / 24 is 0.39999999999999997).
    return {
        "programs": programs,
        "arrival_rate_per_s": round(size_arrival_rate_per_s * programs / size_programs, 12),
    }


def programs_note(size_programs: int, programs: int | None) -> str:
    """What a plan's description adds when `--programs` changed its count."""
    if programs is None or programs == size_programs:
        return ""
    return (
        f"; --programs {programs}: {programs} programs instead of the size's "
        f"{size_programs}, over the same arrival window, KV budget and context limit"
    )
