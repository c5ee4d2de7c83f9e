"""Predicted calls as drafts in a real vLLM engine (CPU backend, SmolLM2 with the
embedded tools template): shown two calculator calls, the model writes a third
call of its own; with that call predicted, the gated scheduler drafts the call's
tokens from the prediction, so the same reply costs fewer decode steps, whether
the prediction came with the request or while it ran (the draft model's)."""

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
from deployments.engine.plugin import PREDICTED_CALLS_METHOD, PROMPT_LOOKUP_STATS_METHOD
from deployments.engine.setup import create_engine_config

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


def _engine_and_prompt() -> tuple[Any, list[int], str]:
    """SmolLM2's engine settings with prompt lookup on, the few-shot prompt's
    token ids and its text."""
    from transformers import AutoTokenizer

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
    return vllm_config, tokenizer.encode(rendered, add_special_tokens=False), rendered


Reply = tuple[str, int, dict[str, Any]]
"""A reply's text, its token count and the gate's stats for it."""


async def _reply(
    engine: Any, prompt: list[int], predicted: list[str], late: list[str] | None = None
) -> Reply:
    """Greedy reply to `prompt`, with `predicted` calls sent with the request and
    `late` ones sent to the engine once its first token is out."""
    from vllm import SamplingParams

    program_id = uuid.uuid4().hex
    final = None
    async for output in engine.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(
            max_tokens=64,
            temperature=0,
            extra_args={PREDICTED_CALLS_ARG: predicted} if predicted else None,
        ),
        request_id=uuid.uuid4().hex,
        session_id=program_id,
    ):
        if final is None and late is not None:
            taken = await engine.engine_core.call_utility_async(
                PREDICTED_CALLS_METHOD, program_id, late
            )
            assert taken == 1, "the running request takes the late prediction"
        final = output
    assert final is not None
    stats = await engine.engine_core.call_utility_async(PROMPT_LOOKUP_STATS_METHOD)
    return final.outputs[0].text, len(final.outputs[0].token_ids), stats


def test_an_exactly_predicted_call_costs_fewer_decode_steps(
    event_loop_runner: asyncio.AbstractEventLoop,
) -> None:
    from vllm.v1.engine.async_llm import AsyncLLM

    vllm_config, prompt, rendered = _engine_and_prompt()

    async def scenario() -> list[Reply]:
        engine = AsyncLLM.from_vllm_config(vllm_config)
        try:
            unpredicted = await _reply(engine, prompt, [])
            call = _call_json(unpredicted[0])
            return [
                unpredicted,
                await _reply(engine, prompt, [call]),
                await _reply(engine, prompt, [], late=[call]),
            ]
        finally:
            engine.shutdown()

    replies = event_loop_runner.run_until_complete(scenario())
    (unpredicted_text, unpredicted_tokens, unpredicted) = replies[0]
    assert _call_json(unpredicted_text) not in rendered
    assert unpredicted["predicted"] == {}, unpredicted
    unpredicted_steps = _decode_steps(unpredicted, unpredicted_tokens)
    for how, (text, tokens, predicted) in zip(
        ("with the request", "late"), replies[1:], strict=True
    ):
        steps = _decode_steps(predicted, tokens)
        print(
            f"reply {text!r}: {tokens} tokens in {steps} steps with the call predicted "
            f"{how}, {unpredicted_steps} without; gate stats {predicted}"
        )
        assert text == unpredicted_text
        assert predicted["predicted"]["calculator"]["accepted"] > 0, (how, predicted)
        assert steps < unpredicted_steps, how
