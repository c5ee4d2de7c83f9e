"""Ingress side of speculative tool calls: for each chat turn that declares hosted
tools, predict its calls (learned transitions at once, before the turn is sent,
so the engine can draft the call's tokens from them; the draft model's λ
samples when they arrive, then sent on to the engine writing the turn), start
the chosen ones on the tool workers through the global tool cache, and settle
them against the calls the turn made, which also teach the learned predictor
(calls the server ran and calls handed to the client alike)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster.config import SpeculationConfig
from deployments.api.model_client import reply_head
from deployments.replica.continuation import declared_hosted_tools
from router.prefix import shared_prefix_key
from toolworkers.execution import (
    SPECULATION_ORIGIN_PREFIX,
    ResultSource,
    ToolExecutor,
    ToolOutcome,
)
from toolworkers.predictor import (
    ObservedCall,
    PredictedCall,
    TransitionPredictor,
    calls_in_history,
    latest_user_text,
)
from toolworkers.speculation import (
    DraftWorth,
    SpeculationPolicy,
    call_identity,
    draft_outcome,
    draft_predictions,
    draft_request,
    ledger_view,
    run_cost_entry,
    settle,
    turn_entry,
)

if TYPE_CHECKING:
    from cluster.store.speculation_ledger import SpeculationLedger
    from deployments.api.model_client import ModelClient

logger = logging.getLogger("toolserve.speculation")

# The draft's answer is worth waiting for only while the main model may still
# be generating; past this, a turn's speculation gives up on it.
_DRAFT_TIMEOUT_S = 60.0

LatePredictions = Callable[[str, list[str]], Awaitable[int]]
"""Takes a program id and calls predicted after its turn was sent (JSON texts);
returns how many of its running requests took them."""


def call_text(call: PredictedCall) -> str:
    """A call as its JSON object text (what the model writes inside a call)."""
    return json.dumps({"name": call.name, "arguments": call.arguments})


def prediction_scope(tenant: str, messages: list[Any], tools: list[Any]) -> str:
    """Whose calls a turn's learned predictions come from: the tenant's agents of
    the same kind (instructions and tools). Another tenant's calls never shape
    them: a speculated call would reveal what others call."""
    return f"{tenant}\n{shared_prefix_key(messages, tools, 0) or ''}"


def _draft_tokens(reply: dict[str, Any]) -> int:
    """Tokens the draft model computed for a prediction: its prompt beyond the
    cached prefix, and what it wrote."""
    usage = reply.get("usage") or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return max(0, (usage.get("prompt_tokens") or 0) - cached) + (
        usage.get("completion_tokens") or 0
    )


def _outcome(run: asyncio.Task[ToolOutcome]) -> ToolOutcome | None:
    """A finished speculative run's outcome; None if it was cancelled or failed."""
    if run.cancelled() or run.exception() is not None:
        return None
    return run.result()


@dataclass
class SpeculationTurn:
    """One turn: what it was predicted from, and the speculations it issued by
    call identity."""

    agent: str
    tenant: str
    user_text: str
    last_call: ObservedCall | None
    launched: bool = False
    """Speculated on (the server may run its calls); else only learned from."""
    issued: dict[str, PredictedCall] = field(default_factory=dict)
    runs: dict[str, asyncio.Task[ToolOutcome]] = field(default_factory=dict)
    draft_tokens: int = 0
    task: asyncio.Task[None] | None = None

    def issued_call_texts(self) -> list[str]:
        """The calls issued so far, as `call_text`s."""
        return [call_text(call) for call in self.issued.values()]


class Speculator:
    def __init__(
        self,
        config: SpeculationConfig,
        executor: ToolExecutor,
        draft: ModelClient | None,
        draft_model: str | None,
        late_predictions: LatePredictions | None = None,
        ledger: SpeculationLedger | None = None,
    ):
        """`late_predictions`: where the draft model's calls go once issued (the
        engine writing the turn, to draft from them); None: nowhere. `ledger`:
        where each tenant's speculation is accounted for (None: nowhere)."""
        from ray.serve.metrics import Counter

        self._config = config
        self._ledger = ledger
        self._executor = executor
        self._draft = draft if config.draft_predictions > 0 else None
        self._draft_model = draft_model
        self._late_predictions = late_predictions
        self._predictor = TransitionPredictor(
            min_support=config.learned_min_support, min_confidence=config.learned_min_confidence
        )
        self._policy = SpeculationPolicy(config, executor.registry)
        self._draft_worth = DraftWorth(config.draft_min_run_ratio)
        self._running: set[asyncio.Task[Any]] = set()
        self._issued = Counter(
            "toolserve_speculations_issued",
            description="Predicted tool calls started before the model asked for them.",
            tag_keys=("source",),
        )
        self._used = Counter(
            "toolserve_speculations_used",
            description="Speculations whose call the turn then made (accepted predictions).",
            tag_keys=("source",),
        )
        self._wasted = Counter(
            "toolserve_speculations_wasted",
            description="Speculations whose call the turn did not make.",
            tag_keys=("source",),
        )
        self._turns = Counter(
            "toolserve_speculation_turns",
            description="Turns speculated on (they declared hosted tools the server may "
            "run), settled: the denominator of speculation's waste per 100 turns.",
        )
        self._tool_cpu = Counter(
            "toolserve_speculation_tool_cpu_seconds",
            description="Tool CPU seconds of speculative runs, by outcome: used (the turn "
            "made the call) or discarded.",
            tag_keys=("outcome",),
        )
        self._draft_tokens = Counter(
            "toolserve_speculation_draft_tokens",
            description="Tokens the draft model computed for predictions, by outcome: used "
            "(one of its predictions was) or discarded.",
            tag_keys=("outcome",),
        )
        self._drafts_skipped = Counter(
            "toolserve_speculation_drafts_skipped",
            description="Turns not worth a draft request, by reason: learned_prediction "
            "(the learned predictor had a call to start) or short_tools (the turn's "
            "hosted tools run shorter than the draft takes to answer).",
            tag_keys=("reason",),
        )
        self._sent_late = Counter(
            "toolserve_draft_calls_sent_to_engine",
            description=(
                "Draft-model predictions sent on to the engine writing their turn, by "
                "outcome: taken (the turn was running), too_late (it had ended), failed."
            ),
            tag_keys=("outcome",),
        )

    def start(
        self, body: dict[str, Any], program_id: str, tenant: str, launch: bool
    ) -> SpeculationTurn | None:
        """A turn declaring hosted tools: predicts its calls and, with `launch`,
        starts them in the background. Either way the turn is learned from
        once settled."""
        tools = body.get("tools")
        if not self._config.enabled or not tools:
            return None
        declared = declared_hosted_tools(tools, self._executor.registry.openai_schemas())
        if not declared:
            return None
        messages = body.get("messages") or []
        history = calls_in_history(messages)
        turn = SpeculationTurn(
            agent=prediction_scope(tenant, messages, tools),
            tenant=tenant,
            user_text=latest_user_text(messages),
            last_call=history[-1] if history else None,
            launched=launch,
        )
        if launch:
            learned_chosen: list[PredictedCall] = []
            if self._config.learned:
                learned = self._predictor.predict(
                    turn.agent, turn.last_call, self._config.learned_predictions, turn.user_text
                )
                learned_chosen = self._policy.choose(learned, declared)
                self._launch(learned_chosen, program_id, tenant, turn)
            turn.task = asyncio.create_task(
                self._ask_draft_and_launch(body, turn, declared, program_id, tenant, learned_chosen)
            )
        return turn

    async def _ask_draft_and_launch(
        self,
        body: dict[str, Any],
        turn: SpeculationTurn,
        declared: set[str],
        program_id: str,
        tenant: str,
        learned_chosen: list[PredictedCall],
    ) -> None:
        if self._draft is None or self._draft_model is None:
            return
        skip = self._policy.draft_skip(learned_chosen, declared, self._draft_worth)
        if skip is not None:
            self._drafts_skipped.inc(tags={"reason": str(skip)})
            return
        request = draft_request(body, self._draft_model, self._config)
        if request is None:
            return
        asked = time.monotonic()
        try:
            reply = await asyncio.wait_for(self._ask_draft(request, program_id), _DRAFT_TIMEOUT_S)
        except Exception as error:
            logger.warning("draft prediction failed: %s: %s", type(error).__name__, error)
            return
        if reply is None:
            return
        self._draft_worth.draft_answered(time.monotonic() - asked)
        turn.draft_tokens = _draft_tokens(reply)
        drafted = draft_predictions(reply)
        issued = self._launch(self._policy.choose(drafted, declared), program_id, tenant, turn)
        if issued and self._late_predictions is not None:
            await self._send_late(self._late_predictions, program_id, issued)

    async def _send_late(
        self, send: LatePredictions, program_id: str, issued: list[PredictedCall]
    ) -> None:
        try:
            taken = await send(program_id, [call_text(call) for call in issued])
        except Exception as error:
            logger.warning(
                "predicted calls not sent to the engine: %s: %s", type(error).__name__, error
            )
            outcome = "failed"
        else:
            outcome = "taken" if taken else "too_late"
        self._sent_late.inc(tags={"outcome": outcome})

    async def _ask_draft(self, body: dict[str, Any], program_id: str) -> dict[str, Any] | None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        assert self._draft is not None
        request = ChatCompletionRequest.model_validate(body)
        # Routed with the program, so a draft served by the main replicas runs where
        # the conversation's prefix is cached.
        stream = self._draft.chat(request, None, program_id)
        try:
            head = await reply_head(stream)
        finally:
            stream.cancel()
        return head.body if head.error is None else None

    def _launch(
        self, chosen: list[PredictedCall], program_id: str, tenant: str, turn: SpeculationTurn
    ) -> list[PredictedCall]:
        """Starts the chosen calls the turn has not issued yet; returns them."""
        issued = []
        for prediction in chosen:
            identity = call_identity(prediction.name, prediction.arguments)
            if identity in turn.issued:
                continue
            turn.issued[identity] = prediction
            issued.append(prediction)
            self._issued.inc(tags={"source": prediction.source})
            run = asyncio.create_task(
                self._executor.call(
                    prediction.name,
                    prediction.arguments,
                    tenant=tenant,
                    program_id=program_id,
                    origin=SPECULATION_ORIGIN_PREFIX + prediction.source,
                )
            )
            # The run outlives the turn: its result goes to the cache either way.
            turn.runs[identity] = run
            self._running.add(run)
            run.add_done_callback(self._running.discard)
            run.add_done_callback(functools.partial(self._observe_duration, prediction.name))
        return issued

    def settle(self, turn: SpeculationTurn, actual: list[ObservedCall]) -> None:
        """Learns the transitions the turn's calls made and, for a turn speculated
        on, accounts its speculations used or wasted; a draft answer still
        outstanding is too late to matter."""
        if turn.task is not None and not turn.task.done():
            turn.task.cancel()
        previous = turn.last_call
        for call in actual:
            self._predictor.observe(turn.agent, previous, call, turn.user_text)
            previous = call
        if not turn.launched:
            return
        settlement = settle(list(turn.issued.values()), actual)
        for prediction in settlement.used:
            self._used.inc(tags={"source": prediction.source})
        for prediction in settlement.wasted:
            self._wasted.inc(tags={"source": prediction.source})
        entry = turn_entry(settlement, turn.draft_tokens)
        self._turns.inc()
        if turn.draft_tokens:
            self._draft_tokens.inc(turn.draft_tokens, tags={"outcome": draft_outcome(settlement)})
        self._account(turn.tenant, entry.increments)
        for used, predictions in ((True, settlement.used), (False, settlement.wasted)):
            for prediction in predictions:
                run = turn.runs.get(call_identity(prediction.name, prediction.arguments))
                if run is not None:
                    run.add_done_callback(
                        functools.partial(self._run_ended, turn.tenant, prediction.name, used)
                    )

    def _observe_duration(self, tool: str, run: asyncio.Task[ToolOutcome]) -> None:
        outcome = _outcome(run)
        if outcome is not None and outcome.result.ok:
            self._draft_worth.tool_ran(tool, outcome.result.duration_s)

    def _run_ended(
        self, tenant: str, tool: str, used: bool, run: asyncio.Task[ToolOutcome]
    ) -> None:
        """A settled speculation's run ended: its tool CPU, where this run was the
        one that ran the tool (not a result it found cached or running)."""
        outcome = _outcome(run)
        if outcome is None:
            return
        cpu_s = outcome.result.cpu_s
        if outcome.source not in (ResultSource.RAN, ResultSource.UNCACHED) or cpu_s is None:
            return
        self._tool_cpu.inc(cpu_s, tags={"outcome": "used" if used else "discarded"})
        self._account(tenant, run_cost_entry(tool, used, cpu_s).increments)

    def _account(self, tenant: str, increments: dict[str, int]) -> None:
        if self._ledger is None:
            return
        adding = asyncio.get_running_loop().create_task(self._ledger.add(tenant, increments))
        self._running.add(adding)
        adding.add_done_callback(self._running.discard)

    def policies(self) -> dict[str, dict[str, Any]]:
        """Each hosted tool's speculation policy."""
        registry = self._executor.registry
        return {
            name: policy
            for name in registry.names()
            if (policy := self._policy.describe(name, self._draft_worth)) is not None
        }

    async def ledger(self, tenant: str) -> dict[str, Any] | None:
        """The tenant's ledger as `GET /v1/tools` shows it; None without one (or
        when Redis cannot answer)."""
        if self._ledger is None:
            return None
        fields = await self._ledger.read(tenant)
        return None if fields is None else ledger_view(fields, self._executor.registry.names())
