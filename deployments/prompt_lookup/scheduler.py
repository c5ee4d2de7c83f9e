"""vLLM scheduler extension: each step, cuts the n-gram proposer's drafts of each
decoding request to the length `ProposalGate` allows, and feeds the gate each
request's verified acceptance. Loaded by name inside the EngineCore process
(`scheduler_cls`), mixed in before the pinning mixin or vLLM's Scheduler."""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import Request

from deployments.admission.scheduler import CellBudgetMixin
from deployments.pinning.scheduler import PinningSchedulerMixin
from deployments.prompt_lookup.gate import CallRegions, GateSettings, ProposalGate
from deployments.prompt_lookup.settings import from_additional_config


def opening_tokens(tokenizer: Any, marker: str) -> list[int]:
    """The opening marker's token ids as they appear inside a reply: without the
    first, which merges with the text before it (`<tool_call>` after a period is
    `.<` `tool` `_` `call` `>`). The closing marker (`</` ...) is matched whole."""
    ids: list[int] = tokenizer.encode(marker, add_special_tokens=False)
    return ids[1:] if len(ids) > 2 else ids


class PromptLookupGateMixin:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from vllm.tokenizers import cached_tokenizer_from_config

        base: Scheduler = self
        config = from_additional_config(base.vllm_config.additional_config)
        if config is None:
            raise ValueError("the gated scheduler needs its settings in additional_config")
        self._gate = ProposalGate(
            GateSettings(
                window=config.window,
                prose_floor=config.prose_floor,
                ema_weight=config.ema_weight,
                initial_acceptance=config.initial_acceptance,
                max_decoders=config.max_decoders,
            )
        )
        tokenizer = cached_tokenizer_from_config(base.vllm_config.model_config)
        self._regions = CallRegions(
            opening_tokens(tokenizer, config.call_opening),
            tokenizer.encode(config.call_closing, add_special_tokens=False),
        )
        self._regions_read: dict[str, int] = {}
        self._granted_in_call: dict[str, bool] = {}

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        super().update_draft_token_ids(draft_token_ids)  # type: ignore[misc]
        base: Scheduler = self
        allowed = self._gate.allows_drafts(len(base.running))
        for request_id in draft_token_ids.req_ids:
            request = base.requests.get(request_id)
            if request is None or not request.spec_token_ids:
                continue
            if not allowed:
                request.spec_token_ids = []
                continue
            in_call = self._in_call(request)
            length = self._gate.draft_length(request_id, in_call)
            request.spec_token_ids = request.spec_token_ids[:length]
            if length:
                self._granted_in_call[request_id] = in_call

    def _in_call(self, request: Request) -> bool:
        output = request.output_token_ids
        read = self._regions_read.get(request.request_id, 0)
        self._regions_read[request.request_id] = len(output)
        return self._regions.feed(request.request_id, output[read:])

    def make_spec_decoding_stats(
        self,
        spec_decoding_stats: Any,
        num_draft_tokens: int,
        num_accepted_tokens: int,
        num_invalid_spec_tokens: dict[str, int] | None,
        request_id: str,
    ) -> Any:
        # Drafts this gate did not grant (vLLM's placeholders for a request's
        # first step) are not the proposer's: they say nothing of its acceptance.
        in_call = self._granted_in_call.pop(request_id, None)
        if in_call is not None:
            invalid = (num_invalid_spec_tokens or {}).get(request_id, 0)
            self._gate.observe(request_id, num_draft_tokens - invalid, num_accepted_tokens, in_call)
        return super().make_spec_decoding_stats(  # type: ignore[misc]
            spec_decoding_stats,
            num_draft_tokens,
            num_accepted_tokens,
            num_invalid_spec_tokens,
            request_id,
        )

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        self._gate.forget(request.request_id)
        self._regions.forget(request.request_id)
        self._regions_read.pop(request.request_id, None)
        self._granted_in_call.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]

    def prompt_lookup_stats(self) -> dict[str, object]:
        return self._gate.take_stats().as_dict()


class GatedScheduler(PromptLookupGateMixin, CellBudgetMixin, Scheduler):  # type: ignore[misc]
    pass


class GatedPinningScheduler(
    PromptLookupGateMixin,
    PinningSchedulerMixin,
    CellBudgetMixin,
    Scheduler,  # type: ignore[misc]
):
    pass
