"""The systems a simulation compares, by their policies: stock vLLM (request
FCFS, its prefix cache's LRU, n-gram drafts verified whole or none), toolserve
(the cluster's pinning controller and TTL cost model, program FCFS, its gated
drafts), each behind its router."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from bench.sim.drafts import DraftRates, NgramDrafts
from bench.sim.engine import PinningGlue, SimEngine, SimEngineSettings
from bench.sim.routing import LeastLoadedRouting, SessionHashRouting, ToolserveRouting
from bench.sim.simulation import Router
from bench.sim.step_time import StepTimeModel
from cluster.config import PinningConfig, PromptLookupConfig, RoutingConfig
from cluster.policies.draft_gate import ProposalGate, gate_settings
from cluster.policies.pinning_controller import DecisionSink, pinning_controller

_Settings = TypeVar("_Settings", bound=BaseModel)
Routing = Literal["toolserve", "session-hash", "least-loaded"]
Drafts = Literal["none", "ngram", "gated"]


class SimSystem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The system's name in results.")
    pinning: PinningConfig | None = Field(
        default=None, description="toolserve's pinning and program order; None: stock vLLM's."
    )
    drafts: Drafts = Field(
        default="none",
        description="`ngram`: every proposal verified (stock vLLM's speculative config); "
        "`gated`: as toolserve's gate allows; `none`.",
    )
    prompt_lookup: PromptLookupConfig = Field(
        default_factory=PromptLookupConfig, description="The gate's settings (`gated`)."
    )
    routing: Routing = Field(default="toolserve", description="How turns pick a replica.")
    router: RoutingConfig = Field(
        default_factory=RoutingConfig, description="toolserve's router's settings."
    )

    def engines(
        self,
        replicas: int,
        settings: SimEngineSettings,
        step_time: StepTimeModel,
        rates: DraftRates | None,
        seed: int,
    ) -> list[SimEngine]:
        engines = []
        for index in range(replicas):
            glue = self.pinning_glue(settings.blocks)
            drafts = None
            if self.drafts != "none" and rates is not None:
                gate = (
                    ProposalGate(gate_settings(self.prompt_lookup))
                    if self.drafts == "gated"
                    else None
                )
                drafts = NgramDrafts(rates, seed + index, gate)
            engines.append(SimEngine(f"replica-{index}", settings, step_time, glue, drafts))
        return engines

    def pinning_glue(
        self, blocks: int, decision_sink: DecisionSink | None = None
    ) -> PinningGlue | None:
        """toolserve's pinning for an engine of `blocks` KV blocks; None for stock."""
        if self.pinning is None or not self.pinning.enabled:
            return None
        return PinningGlue(
            pinning_controller(self.pinning, blocks, decision_sink=decision_sink),
            program_fcfs=self.pinning.program_fcfs,
            charge_withheld_cache=self.pinning.charge_withheld_cache,
        )

    def new_router(self, batch_slots: int) -> Router:
        if self.routing == "toolserve":
            return ToolserveRouting(self.router, batch_slots)
        if self.routing == "session-hash":
            return SessionHashRouting()
        return LeastLoadedRouting()


STOCK_VLLM_PLAIN = SimSystem(name="stock-vllm-plain", routing="session-hash")
STOCK_VLLM = SimSystem(name="stock-vllm", drafts="ngram", routing="session-hash")
TOOLSERVE = SimSystem(
    name="toolserve",
    pinning=PinningConfig(mode="cost_model", program_fcfs=True),
    drafts="gated",
)
CATALOG = {system.name: system for system in (STOCK_VLLM_PLAIN, STOCK_VLLM, TOOLSERVE)}


def recorded_system(name: str, effective: dict[str, Any], drafted: bool) -> SimSystem:
    """A recorded arm as the simulator models it, from the configuration it ran
    with: toolserve's pinning, prompt lookup and routing settings; a stock vLLM
    server's speculative config; vLLM's router as consistent hashing of the
    session over its servers, which draft as the run's counters say (`drafted`:
    their settings are not kept; its program scheduling, which only orders
    admission at the router, is not modelled)."""
    toolserve = effective.get("toolserve_config")
    if toolserve is None:
        command: Sequence[str] = effective.get("command", [])
        if not behind_vllm_router(effective):
            drafted = "--speculative-config" in command
        return SimSystem(name=name, drafts="ngram" if drafted else "none", routing="session-hash")
    main = toolserve["main"]
    lookup = main.get("prompt_lookup", {})
    return SimSystem(
        name=name,
        pinning=_known(PinningConfig, main.get("pinning", {})),
        drafts="gated" if lookup.get("enabled") else "none",
        prompt_lookup=_known(PromptLookupConfig, lookup),
        router=_known(RoutingConfig, toolserve.get("routing", {})),
    )


def behind_vllm_router(effective: dict[str, Any]) -> bool:
    return any("vllm_router" in part for part in effective.get("command", []))


def recorded_replicas(effective: dict[str, Any]) -> int:
    """Engine replicas of a recorded arm: toolserve's, one a server behind vLLM's
    router, else one."""
    toolserve = effective.get("toolserve_config")
    if toolserve is not None:
        return int(toolserve["main"].get("num_replicas", 1))
    command = list(effective.get("command", []))
    if behind_vllm_router(effective) and "--bindings" in command:
        servers = command[command.index("--bindings") + 1 :]
        return next(
            (index for index, part in enumerate(servers) if part.startswith("--")), len(servers)
        )
    return 1


def _known(model: type[_Settings], values: dict[str, Any]) -> _Settings:
    """The settings a run recorded, those this code still knows; a pinning field
    added since the run has the value that reproduces the code it ran."""
    known = {name: value for name, value in values.items() if name in model.model_fields}
    if model is PinningConfig and "idle_hold_factor" not in values:
        known["idle_hold_factor"] = 1e9  # before it, an idle pin lasted max_ttl_s
    return model.model_validate(known)
