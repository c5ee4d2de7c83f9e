"""The tokenize cache inside vLLM's own renderer (SmolLM2, the embedded chat
template): a conversation rendered turn by turn through the patched renderer
gets the prompt ids of an unpatched renderer, its later turns tokenize only
what they add, and a request the cache must not serve is tokenized in full."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cluster.config import CONFIGS_DIR, TokenizeCacheConfig, load_config
from cluster.models import EMBEDDED_SCHEME, SMOLLM2, resolve_model
from deployments.engine.setup import create_engine_config
from deployments.replica.prompt_cache.frontend import install_prompt_preparation

pytestmark = pytest.mark.engine

TEMPLATE = (CONFIGS_DIR / "chat_templates" / "smollm2-tools.jinja").read_text()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def _renderer() -> Any:
    from vllm.renderers import renderer_from_config

    config = load_config()
    model = resolve_model(EMBEDDED_SCHEME + SMOLLM2, config.cache_dir)
    _, vllm_config = create_engine_config(
        config.main.engine.engine_kwargs(model), None, None, disable_log_stats=True
    )
    return renderer_from_config(vllm_config)


async def _prompt_ids(renderer: Any, messages: list[dict[str, Any]], **tokenize: Any) -> list[int]:
    from vllm.renderers.params import ChatParams, TokenizeParams

    chat = ChatParams(
        chat_template=TEMPLATE,
        # As vLLM's chat front end asks: text from the template, then tokenized.
        chat_template_kwargs={"add_generation_prompt": True, "tools": TOOLS, "tokenize": False},
    )
    params = TokenizeParams(
        max_total_tokens=8192, max_output_tokens=64, add_special_tokens=False, **tokenize
    )
    _, (prompt,) = await renderer.render_chat_async([messages], chat, params)
    return list(prompt["prompt_token_ids"])


def _conversation(turns: int) -> list[list[dict[str, Any]]]:
    """Each turn's messages: the agent reads a file, gets it, and is asked again."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in src/app.py."},
    ]
    prompts = []
    for turn in range(turns):
        prompts.append(list(messages))
        messages += [
            {
                "role": "assistant",
                "content": f"Reading file {turn}.",
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {
                            "name": "read_file",
                            "arguments": f'{{"path": "src/module_{turn}.py"}}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": f"call_{turn}",
                "content": f"def f{turn}(x):\n    return x + {turn}\n" * 8,
            },
            {"role": "user", "content": f"Now step {turn + 1}, please."},
        ]
    return prompts


def test_a_conversation_through_the_cached_renderer_gets_the_plain_renderers_ids() -> None:
    plain, cached = _renderer(), _renderer()
    install_prompt_preparation(cached, TokenizeCacheConfig(enabled=True, audit_first=0))
    tokenized: list[int] = []
    original = cached.get_tokenizer()

    class CountingTokenizer:
        """The renderer's tokenizer, counting the text it is asked to tokenize."""

        def __getattr__(self, name: str) -> Any:
            return getattr(original, name)

        def __call__(self, text: str, **kwargs: Any) -> Any:
            encoding = original(text, **kwargs)
            tokenized.append(len(encoding["input_ids"]))
            return encoding

    counting = CountingTokenizer()
    cached.get_tokenizer = lambda: counting
    loop = asyncio.new_event_loop()
    try:
        for messages in _conversation(6):
            tokenized.clear()
            expected = loop.run_until_complete(_prompt_ids(plain, messages))
            assert len(expected) > 150
            assert loop.run_until_complete(_prompt_ids(cached, messages)) == expected
            if len(messages) > 2:
                # Only what the turn added: the reply, the tool output, the question.
                assert 0 < sum(tokenized) < len(expected) / 2
        tokenized.clear()
        messages = _conversation(6)[-1]
        offsets = loop.run_until_complete(_prompt_ids(cached, messages, return_token_offsets=True))
        assert offsets == loop.run_until_complete(_prompt_ids(plain, messages))
        assert tokenized == [len(offsets)]  # offsets asked for: a full tokenization
    finally:
        loop.close()
