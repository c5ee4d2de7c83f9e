"""vLLM scheduler extension: each step, replaces the n-gram proposer's drafts of a
request writing a tool call with the continuation of a call its turn predicted
(when one matches), cuts each decoding request's drafts to the length
`ProposalGate` allows, and feeds the gate each request's verified acceptance.
Mixed in before the pinning mixin or vLLM's Scheduler (`engine/schedulers.py`),
which vLLM loads by name inside the EngineCore process (`scheduler_cls`)."""

from __future__ import annotations

import json
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import Request

from cluster.openai_protocol import PREDICTED_CALLS_ARG
from cluster.policies.draft_gate import CallRegions, ProposalGate, gate_settings
from cluster.policies.predicted_drafts import (
    PredictedCallDrafter,
    PredictedCallTokens,
    PredictedDraft,
    predicted_call_text,
)
from deployments.engine.prompt_lookup.settings import from_additional_config

# A request's predicted calls are tokenized in the scheduler's loop: bounded.
_MOST_PREDICTED_CALLS = 8
_LONGEST_PREDICTED_CALL_CHARS = 8192


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
        self._gate = ProposalGate(gate_settings(config))
        tokenizer = cached_tokenizer_from_config(base.vllm_config.model_config)
        self._regions = CallRegions(
            opening_tokens(tokenizer, config.call_opening),
            tokenizer.encode(config.call_closing, add_special_tokens=False),
        )
        self._regions_read: dict[str, int] = {}
        self._granted: dict[str, tuple[bool, str | None]] = {}
        """Requests granted drafts this step: in a call, and the predicted call's
        tool where the drafts came from one."""
        self._tokenizer = tokenizer
        self._call_markers = (config.call_opening, config.call_closing)
        self._draft_predicted_calls = config.predicted_calls
        self._drafter = PredictedCallDrafter(config.min_match, config.max_match)
        self._predictions: dict[str, tuple[PredictedCallTokens, ...]] = {}

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        base: Scheduler = self
        in_call: dict[str, bool] = {}
        predicted_tool: dict[str, str] = {}
        drafts = list(draft_token_ids.draft_token_ids)
        for index, request_id in enumerate(draft_token_ids.req_ids):
            request = base.requests.get(request_id)
            if request is None:
                continue
            in_call[request_id] = self._in_call(request)
            predicted = self._predicted_draft(request) if in_call[request_id] else None
            if predicted is not None:
                drafts[index] = predicted.tokens
                predicted_tool[request_id] = predicted.tool
        # vLLM's own update checks the drafts against a structured output's grammar.
        super().update_draft_token_ids(  # type: ignore[misc]
            DraftTokenIds(draft_token_ids.req_ids, drafts)
        )
        over_cap = self._gate.over_cap(len(base.running))
        for request_id in draft_token_ids.req_ids:
            request = base.requests.get(request_id)
            if request is None or not request.spec_token_ids:
                continue
            length = self._gate.draft_length(request_id, in_call[request_id], over_cap)
            request.spec_token_ids = request.spec_token_ids[:length]
            if length:
                self._granted[request_id] = (
                    in_call[request_id],
                    predicted_tool.get(request_id),
                )

    def _predicted_draft(self, request: Request) -> PredictedDraft | None:
        predictions = self._predictions.get(request.request_id)
        if predictions is None:
            predictions = self._read_predictions(request)
            self._predictions[request.request_id] = predictions
        if not predictions:
            return None
        output = request.output_token_ids
        tail = list(output[max(0, len(output) - self._drafter.max_match) :])
        return self._drafter.propose(predictions, tail, self._gate.settings.window)

    def _read_predictions(self, request: Request) -> tuple[PredictedCallTokens, ...]:
        if not self._draft_predicted_calls or request.sampling_params is None:
            return ()
        texts = (request.sampling_params.extra_args or {}).get(PREDICTED_CALLS_ARG) or []
        return self._with_calls((), texts)

    def _with_calls(
        self, known: tuple[PredictedCallTokens, ...], texts: object
    ) -> tuple[PredictedCallTokens, ...]:
        """`known` and the calls among `texts` it lacks, tokenized: at most
        `_MOST_PREDICTED_CALLS` in all."""
        predictions = list(known)
        for text in texts if isinstance(texts, list) else []:
            if len(predictions) >= _MOST_PREDICTED_CALLS:
                break
            if not isinstance(text, str) or len(text) > _LONGEST_PREDICTED_CALL_CHARS:
                continue
            try:
                tool = json.loads(text)["name"]
            except (TypeError, ValueError, KeyError):
                continue
            whole = predicted_call_text(self._call_markers[0], self._call_markers[1], text)
            prediction = PredictedCallTokens(
                str(tool), tuple(self._tokenizer.encode(whole, add_special_tokens=False))
            )
            if prediction not in predictions:
                predictions.append(prediction)
        return tuple(predictions)

    def add_predicted_calls(self, program_id: str, texts: object) -> int:
        """Calls predicted after the program's turn was sent (the draft model's):
        drafted from in the program's unfinished requests from their next step on.
        Returns how many requests took them."""
        base: Scheduler = self
        if not self._draft_predicted_calls or not program_id:
            return 0
        taken = 0
        for request in list(base.requests.values()):
            if request.session_id != program_id or request.is_finished():
                continue
            known = self._predictions.get(request.request_id)
            if known is None:
                known = self._read_predictions(request)
            self._predictions[request.request_id] = self._with_calls(known, texts)
            taken += 1
        return taken

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
        granted = self._granted.pop(request_id, None)
        if granted is not None:
            in_call, predicted_tool = granted
            invalid = (num_invalid_spec_tokens or {}).get(request_id, 0)
            self._gate.observe(
                request_id,
                num_draft_tokens - invalid,
                num_accepted_tokens,
                in_call,
                predicted_tool,
            )
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
        self._granted.pop(request.request_id, None)
        self._predictions.pop(request.request_id, None)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]

    def prompt_lookup_stats(self) -> dict[str, object]:
        return self._gate.take_stats().as_dict()
