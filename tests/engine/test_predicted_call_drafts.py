"""Predicted calls as drafts in a real vLLM engine (CPU backend, SmolLM2 with the
embedded tools template): shown two calculator calls, the model writes a third
call of its own; with that call predicted, the gated scheduler drafts the call's
tokens from the prediction, so the same reply costs fewer decode steps."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import pytest
from written_calls import CALCULATOR_FEW_SHOT

from cluster.config import CONFIGS_DIR, PromptLookupConfig, load_config
from cluster.models import EMBEDDED_SCHEME, SMOLLM2, resolve_model
from cluster.openai_protocol import PREDICTED_CALLS_ARG
from deployments.engine_setup import create_engine_config
from deployments.pinning.plugin import PROMPT_LOOKUP_STATS_METHOD

from .test_kv_pinning import event_loop_runner

pytestmark = pytest.mark.engine

__all__ = ["event_loop_runner"]  # the module's event loop, shared with the pinning tests

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def _decode_steps(stats: dict[str, Any], generated: int) -> int:
    """Steps that produced the request's tokens: each yields one token of its own
    and the drafts it accepted."""
    accepted = sum(region["accepted"] for region in stats["regions"].values())
    return generated - accepted


def _call_json(reply: str) -> str:
    opening, closing = "<tool_call>\n", "\n</tool_call>"
    assert opening in reply and closing in reply, reply
    return reply.split(opening, 1)[1].split(closing, 1)[0]


def test_an_exactly_predicted_call_costs_fewer_decode_steps(
    event_loop_runner: asyncio.AbstractEventLoop,
) -> None:
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    config = load_config()
    model = resolve_model(EMBEDDED_SCHEME + SMOLLM2, config.cache_dir)
    _, vllm_config = create_engine_config(
        config.main.engine.engine_kwargs(model),
        None,
        PromptLookupConfig(enabled=True, window=4, max_decoders=8),
        disable_log_stats=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    rendered = tokenizer.apply_chat_template(
        CALCULATOR_FEW_SHOT,
        tools=[CALCULATOR],
        chat_template=(CONFIGS_DIR / "chat_templates" / "smollm2-tools.jinja").read_text(),
        add_generation_prompt=True,
        tokenize=False,
    )
    prompt = tokenizer.encode(rendered, add_special_tokens=False)

    async def scenario() -> list[tuple[str, int, dict[str, Any]]]:
        engine = AsyncLLM.from_vllm_config(vllm_config)

        async def reply(predicted: list[str]) -> tuple[str, int, dict[str, Any]]:
            final = None
            async for output in engine.generate(
                {"prompt_token_ids": prompt},
                SamplingParams(
                    max_tokens=64,
                    temperature=0,
                    extra_args={PREDICTED_CALLS_ARG: predicted} if predicted else None,
                ),
                request_id=uuid.uuid4().hex,
            ):
                final = output
            assert final is not None
            stats = await engine.engine_core.call_utility_async(PROMPT_LOOKUP_STATS_METHOD)
            return final.outputs[0].text, len(final.outputs[0].token_ids), stats

        try:
            unpredicted = await reply([])
            return [unpredicted, await reply([_call_json(unpredicted[0])])]
        finally:
            engine.shutdown()

    (unpredicted_text, unpredicted_tokens, unpredicted), (text, tokens, predicted) = (
        event_loop_runner.run_until_complete(scenario())
    )
    assert text == unpredicted_text
    assert _call_json(text) not in rendered
    assert unpredicted["predicted"] == {}, unpredicted
    steps = _decode_steps(predicted, tokens)
    unpredicted_steps = _decode_steps(unpredicted, unpredicted_tokens)
    print(
        f"reply {text!r}: {tokens} tokens in {steps} steps with the call predicted, "
        f"{unpredicted_steps} without; gate stats {predicted}"
    )
    assert predicted["predicted"]["calculator"]["accepted"] > 0, predicted
    assert steps < unpredicted_steps
