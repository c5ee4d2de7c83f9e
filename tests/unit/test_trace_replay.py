"""The trace-replay workload: turns by token counts, exact decode lengths, the
published shapes, and contexts within the model's limit."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import statistics
import time
from typing import Any

import pytest

from bench.workloads import SIZES, plan_workload
from bench.workloads.distributions import Distribution
from bench.workloads.program import Reply, ToolCall
from bench.workloads.replay import (
    ASSISTANT_PROFILE,
    ASSISTANT_TOOLS_PROFILE,
    CODING_PROFILE,
    CODING_TOOLS_PROFILE,
    ReplayConfig,
    ReplayTool,
    generate_replay,
    vocabulary_text,
)

WORDS = [f"w{index}" for index in range(50)]


def _tokens(text: str) -> int:
    """Tokens of `vocabulary_text(WORDS)` output: a word each, a break each."""
    return len(text.split()) + text.count("\n")


def _reply(tokens: int) -> Reply:
    return Reply(" x" * tokens, (), "length", 0, 0, tokens)


@pytest.mark.parametrize("count", [1, 11, 12, 13, 100, 1500])
def test_vocabulary_text_has_the_asked_number_of_tokens(count: int) -> None:
    text = vocabulary_text(WORDS)(random.Random(count), count)
    assert _tokens(text) == count


def test_replay_is_deterministic_and_programs_differ() -> None:
    config = ReplayConfig(programs=8, arrival_rate_per_s=0.5, max_context=8192)
    first = generate_replay(config, 3, vocabulary_text(WORDS))
    again = generate_replay(config, 3, vocabulary_text(WORDS))
    assert [(p.program_id, p.messages, p.shapes) for p in first] == [
        (p.program_id, p.messages, p.shapes) for p in again
    ]
    assert len({p.messages[0]["content"] for p in first}) == len(first)
    assert {p.agent_type for p in first} == {"coding", "assistant"}


def test_no_program_outgrows_the_context_limit() -> None:
    config = ReplayConfig(programs=200, arrival_rate_per_s=1.0, max_context=3072)
    for program in generate_replay(config, 0, vocabulary_text(WORDS)):
        first = _tokens(program.messages[0]["content"])
        grown = sum(_tokens(shape.appended_text) + shape.output_tokens for shape in program.shapes)
        # A break may merge with its line's last word: at most one token per line.
        assert first + grown <= config.max_context + sum(
            shape.appended_text.count("\n") + 1 for shape in program.shapes
        )
        assert program.shapes and program.shapes[0].appended_text == ""


def test_shapes_keep_the_published_turn_counts_when_the_context_allows() -> None:
    for profile, mean in ((CODING_PROFILE, 10.9), (ASSISTANT_PROFILE, 6.3)):
        config = ReplayConfig(
            programs=400, arrival_rate_per_s=1.0, max_context=10**6, profiles=(profile,)
        )
        turns = [len(p.shapes) for p in generate_replay(config, 1, vocabulary_text(WORDS))]
        assert abs(statistics.mean(turns) - mean) < 0.4, profile.name


def test_a_replayed_turn_asks_for_exactly_its_tokens_then_pauses() -> None:
    pause = Distribution(kind="constant", mean=0.05)
    profile = CODING_PROFILE.model_copy(
        update={"tool_pause_s": pause, "turns": Distribution(kind="constant", mean=3)}
    )
    config = ReplayConfig(programs=1, arrival_rate_per_s=0, max_context=10**6, profiles=(profile,))
    (program,) = generate_replay(config, 0, vocabulary_text(WORDS))
    for index, shape in enumerate(program.shapes):
        request = program.next_request()
        assert request is not None
        assert request.exact_length and request.max_tokens == shape.output_tokens
        assert request.stream, "streamed, for the time to the turn's first token"
        assert not program.tools and not request.expects_tool_call
        if index:
            assert program.messages[-1] == {"role": "user", "content": shape.appended_text}
        started = time.monotonic()
        tool_round = asyncio.run(program.act(request, _reply(shape.output_tokens)))
        last = index == len(program.shapes) - 1
        assert (tool_round.latency_s == 0.0) == last
        assert last or time.monotonic() - started >= 0.05
        assert program.messages[-1]["role"] == "assistant"
    assert program.next_request() is None
    assert program.temperature == config.temperature


@pytest.fixture(scope="module")
def smollm2_chat() -> tuple[Any, str]:
    from transformers import AutoTokenizer

    from cluster.config import load_config
    from cluster.models import resolve_model

    config = load_config()
    tokenizer = AutoTokenizer.from_pretrained(
        resolve_model(config.main.engine.model, config.cache_dir)
    )
    template_path = config.main.chat.resolved_chat_template()
    assert template_path is not None
    with open(template_path) as template_file:
        return tokenizer, template_file.read()


@pytest.mark.parametrize("workload", ["trace-replay", "trace-replay-tools"])
@pytest.mark.parametrize("size", SIZES)
def test_replayed_conversations_fit_the_model_and_reach_toward_its_limit(
    size: str, workload: str, smollm2_chat: tuple[Any, str]
) -> None:
    """Played to the end in the real template and tokenizer, with replies of the
    drawn lengths (or the fixed call texts): every request fits max_model_len,
    and the longest programs come near the workload's context limit."""
    tokenizer, template = smollm2_chat
    plan = plan_workload(workload, size)  # type: ignore[arg-type]
    longest = 0
    rng = random.Random(0)
    for program in plan.build(0):
        program.shapes = [dataclasses.replace(shape, pause_s=0.0) for shape in program.shapes]
        while (request := program.next_request()) is not None:
            rendered = tokenizer.apply_chat_template(
                program.messages,
                tools=program.tools or None,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=True,
            )
            length = len(tokenizer(rendered)["input_ids"]) + request.max_tokens
            assert length <= plan.max_model_len
            longest = max(longest, length)
            if request.structured_outputs is not None:
                (text,) = request.structured_outputs["choice"]
                assert len(tokenizer(text)["input_ids"]) <= request.max_tokens
                call = json.loads(text.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
                reply = Reply(
                    text.split("\n<tool_call>")[0],
                    (
                        ToolCall(
                            f"call-{rng.random()}", call["name"], json.dumps(call["arguments"])
                        ),
                    ),
                    "tool_calls",
                    0,
                    0,
                    request.max_tokens,
                )
            else:
                text = tokenizer.decode(rng.choices(range(1000, 20000), k=request.max_tokens))
                reply = Reply(text, (), "length", 0, 0, request.max_tokens)
            asyncio.run(program.act(request, reply))
    assert longest > 0.7 * plan.max_model_len


def test_a_tool_turn_writes_a_fixed_call_and_pauses_for_that_tools_time() -> None:
    slow = Distribution(kind="constant", mean=0.2)
    fast = Distribution(kind="constant", mean=0.01)
    profile = CODING_PROFILE.model_copy(
        update={
            "turns": Distribution(kind="constant", mean=6),
            "tools": (
                ReplayTool(name="run_tests", share=1, pause_s=slow),
                ReplayTool(name="read_file", share=1, pause_s=fast),
            ),
        }
    )
    config = ReplayConfig(programs=1, arrival_rate_per_s=0, max_context=10**6, profiles=(profile,))
    (program,) = generate_replay(config, 0, vocabulary_text(WORDS))
    assert [tool["function"]["name"] for tool in program.tools] == ["run_tests", "read_file"]
    called = set()
    for index, shape in enumerate(program.shapes):
        request = program.next_request()
        assert request is not None and request.structured_outputs is not None
        assert request.structured_outputs["choice"] == [shape.call_text]
        assert request.tool_choice == "auto" and not request.exact_length
        if index:
            assert program.messages[-1] == {
                "role": "tool",
                "tool_call_id": f"call-{index - 1}",
                "content": shape.appended_text,
            }
        assert shape.call_text is not None
        call = json.loads(shape.call_text.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
        called.add(call["name"])
        assert shape.pause_s == (0.2 if call["name"] == "run_tests" else 0.01)
        reply = Reply(
            None,
            (ToolCall(f"call-{index}", call["name"], json.dumps(call["arguments"])),),
            "tool_calls",
            0,
            0,
            30,
        )
        asyncio.run(program.act(request, reply))
    assert called == {"run_tests", "read_file"}


def test_the_tool_mixes_keep_the_sources_mean_pauses() -> None:
    """Coding agents about 0.9 s between turns, assistants about 1.9 s (Continuum's
    SWE-bench and BFCL v4 figures), from tools of milliseconds to tens of seconds."""
    rng = random.Random(0)
    for profile, mean in ((CODING_TOOLS_PROFILE, 0.925), (ASSISTANT_TOOLS_PROFILE, 1.923)):
        weights = [tool.share for tool in profile.tools]
        pauses = [
            rng.choices(profile.tools, weights=weights)[0].pause_s.sample(rng)
            for _ in range(20_000)
        ]
        assert abs(statistics.mean(pauses) - mean) / mean < 0.15, profile.name
        assert min(pauses) < 0.05 and max(pauses) > 10, profile.name


# SmolLM2-135M's KV in float32: keys and values, 30 layers, 3 KV heads of 64.
_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4


_FINAL_CONTEXTS_OVER_POOL = {"quick": (1.2, 1.7), "default": (2.2, 3.0)}
"""At the quick size the live contexts at any moment, fewer than all final ones,
about fit; at the default size they outgrow the pool (1.6x at the busiest moment
in `trace-replay-default-24-ae7f6bf`), not the 2.4x of 32 programs."""


@pytest.mark.parametrize("size", SIZES)
def test_the_kv_pool_is_under_pressure_without_thrashing(
    size: str, smollm2_chat: tuple[Any, str]
) -> None:
    """The programs' final contexts add up to more than the pool holds (pinning and
    scheduling matter) but not to many times it."""
    tokenizer, _ = smollm2_chat
    plan = plan_workload("trace-replay", size)  # type: ignore[arg-type]
    finals = 0
    for program in plan.build(0):
        texts = [program.messages[0]["content"], *(s.appended_text for s in program.shapes)]
        finals += sum(len(tokenizer.encode(text, add_special_tokens=False)) for text in texts)
        finals += sum(shape.output_tokens for shape in program.shapes)
    pool = plan.kv_cache_mib * 2**20 // _KV_BYTES_PER_TOKEN
    low, high = _FINAL_CONTEXTS_OVER_POOL[size]
    assert low < finals / pool < high, (finals, pool)
