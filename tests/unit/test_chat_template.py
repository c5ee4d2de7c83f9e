"""The SmolLM2 tool template renders what vLLM's hermes parser reads back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read <a> file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
}


def _render(
    smollm2_tokenizer: PreTrainedTokenizerBase,
    tool_template: str,
    messages: list[Any],
    **kwargs: Any,
) -> str:
    return str(
        smollm2_tokenizer.apply_chat_template(
            messages, chat_template=tool_template, tokenize=False, **kwargs
        )
    )


def test_tools_are_listed_in_the_system_turn(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    text = _render(
        smollm2_tokenizer, tool_template, [{"role": "user", "content": "hi"}], tools=TOOLS
    )
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n")
    assert json.dumps(TOOLS[0]) in system
    assert "<tool_call>" in system


def test_without_tools_there_is_no_tool_section(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    text = _render(
        smollm2_tokenizer,
        tool_template,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
    )
    assert (
        text == "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("arguments", ['{"path": "a.txt"}', {"path": "a.txt"}])
def test_assistant_tool_calls_render_as_hermes_calls(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str, arguments: Any
) -> None:
    call = {**CALL, "function": {"name": "read_file", "arguments": arguments}}
    text = _render(
        smollm2_tokenizer,
        tool_template,
        [
            {"role": "user", "content": "read a"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ],
        tools=TOOLS,
    )
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "read_file", '
        '"arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>' in text
    )


def test_consecutive_tool_results_share_one_turn(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    messages = [
        {"role": "user", "content": "read both"},
        {"role": "assistant", "content": "", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "one"},
        {"role": "tool", "tool_call_id": "call_2", "content": "two"},
    ]
    text = _render(
        smollm2_tokenizer, tool_template, messages, tools=TOOLS, add_generation_prompt=True
    )
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\none\n</tool_response>\n<tool_response>\ntwo\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_content_parts_are_joined(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    parts = [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]
    text = _render(smollm2_tokenizer, tool_template, [{"role": "user", "content": parts}])
    assert "<|im_start|>user\nhello<|im_end|>" in text


def test_hermes_parser_reads_back_a_rendered_call(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    prompt = _render(
        smollm2_tokenizer,
        tool_template,
        [{"role": "user", "content": "read a"}],
        tools=TOOLS,
        add_generation_prompt=True,
    )
    full = _render(
        smollm2_tokenizer,
        tool_template,
        [
            {"role": "user", "content": "read a"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
        ],
        tools=TOOLS,
    )
    completion = full.removeprefix(prompt).removesuffix("<|im_end|>\n")
    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS
    )
    parsed = Hermes2ProToolParser(smollm2_tokenizer).extract_tool_calls(completion, request)
    assert parsed.tools_called
    assert parsed.tool_calls[0].function.name == "read_file"
    assert json.loads(parsed.tool_calls[0].function.arguments) == {"path": "a.txt"}
