"""Ingress side of speculative tool calls: for each chat turn that declares hosted
tools, predict its calls (learned transitions at once, before the turn is sent,
so the engine can draft the call's tokens from them; the draft model's λ
samples when they arrive, then sent on to the engine writing the turn), start
the chosen ones on the tool workers through the global tool cache, and settle
them against the calls the turn made, which also teach the learned predictor
(calls the server ran and calls handed to the client alike)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cluster.config import SpeculationConfig
from deployments.api.model_client import reply_head
from deployments.replica.continuation import declared_hosted_tools
from router.prefix import shared_prefix_key
from toolworkers.execution import SPECULATION_ORIGIN_PREFIX, ToolExecutor
from toolworkers.predictor import (
    ObservedCall,
    PredictedCall,
    TransitionPredictor,
    calls_in_history,
    latest_user_text,
)
from toolworkers.speculation import (
    SpeculationPolicy,
    call_identity,
    draft_predictions,
    draft_request,
    settle,
)

if TYPE_CHECKING:
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


@dataclass
class SpeculationTurn:
    """One turn: what it was predicted from, and the speculations it issued by
    call identity."""

    agent: str
    user_text: str
    last_call: ObservedCall | None
    issued: dict[str, PredictedCall] = field(default_factory=dict)
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
    ):
        """`late_predictions`: where the draft model's calls go once issued (the
        engine writing the turn, to draft from them); None: nowhere."""
        from ray.serve.metrics import Counter

        self._config = config
        self._executor = executor
        self._draft = draft if config.draft_predictions > 0 else None
        self._draft_model = draft_model
        self._late_predictions = late_predictions
        self._predictor = TransitionPredictor(
            min_support=config.learned_min_support, min_confidence=config.learned_min_confidence
        )
        self._policy = SpeculationPolicy(config, executor.registry)
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
            # Learned per tenant: another tenant's calls never shape these
            # predictions (a speculated call would reveal what others call).
            agent=f"{tenant}\n{shared_prefix_key(messages, tools, 0) or ''}",
            user_text=latest_user_text(messages),
            last_call=history[-1] if history else None,
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
        if not self._policy.asks_draft(learned_chosen):
            return
        request = draft_request(body, self._draft_model, self._config)
        if request is None:
            return
        try:
            reply = await asyncio.wait_for(self._ask_draft(request, program_id), _DRAFT_TIMEOUT_S)
        except Exception as error:
            logger.warning("draft prediction failed: %s: %s", type(error).__name__, error)
            return
        if reply is None:
            return
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
            self._running.add(run)
            run.add_done_callback(self._running.discard)
        return issued

    def settle(self, turn: SpeculationTurn, actual: list[ObservedCall]) -> None:
        """Learns the transitions the turn's calls made and counts its speculations
        used or wasted; a draft answer still outstanding is too late to matter."""
        if turn.task is not None and not turn.task.done():
            turn.task.cancel()
        previous = turn.last_call
        for call in actual:
            self._predictor.observe(turn.agent, previous, call, turn.user_text)
            previous = call
        settlement = settle(list(turn.issued.values()), actual)
        for prediction in settlement.used:
            self._used.inc(tags={"source": prediction.source})
        for prediction in settlement.wasted:
            self._wasted.inc(tags={"source": prediction.source})
