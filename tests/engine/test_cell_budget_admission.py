"""Cell-budget admission in a real vLLM engine (CPU backend, tiny random model,
64 blocks of 64 tokens): eight sequences whose prompts fit the pool together but
whose replies do not are preempted by vLLM's own scheduler; with admission they
start as their demand fits and none is preempted, with the same greedy output.
And a burst sharing a preamble prefills it once: vLLM caches a block's hash
when the block is allocated for computing, so the burst's followers, admitted
in the same step or later, find the leader's blocks (grouped prefill needs no
holding of its own; admission counts the followers' shared blocks as cached)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from cluster.config import AdmissionConfig
from cluster.models import EMBEDDED_SCHEME, TINY_RANDOM_LLAMA, resolve_model
from deployments.engine.setup import create_engine_config

from .test_kv_pinning import BLOCK, cache_dir, engine_config, event_loop_runner, tokens

pytestmark = pytest.mark.engine

__all__ = ["cache_dir", "event_loop_runner"]  # module fixtures shared with the pinning tests

PROMPT_TOKENS, REPLY_TOKENS, SEQUENCES = 384, 256, 8


class _Preemptions:
    """vLLM stat logger counting the preemptions the engine reports."""

    total = 0

    def __init__(self, vllm_config: Any, engine_index: int = 0):
        pass

    def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kwargs: Any) -> None:
        if iteration_stats is not None:
            type(self).total += iteration_stats.num_preempted_reqs

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


def _run(
    loop: asyncio.AbstractEventLoop,
    cache_dir: Path,
    admission: AdmissionConfig | None,
    prompts: list[list[int]],
    reply_tokens: int,
) -> tuple[list[tuple[list[int], int]], int]:
    """Greedy outputs of the prompts with their prompt tokens found cached, and
    the preemptions the engine reported."""
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.loggers import StatLoggerBase

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    model = resolve_model(EMBEDDED_SCHEME + TINY_RANDOM_LLAMA, cache_dir)
    _, vllm_config = create_engine_config(
        engine_config().engine_kwargs(model), None, None, admission, disable_log_stats=False
    )
    if admission is not None:
        assert vllm_config.scheduler_config.scheduler_cls.endswith(".AdmissionScheduler")
    counter = type("Preemptions", (_Preemptions, StatLoggerBase), {"total": 0})

    async def scenario() -> list[tuple[list[int], int]]:
        engine = AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[counter])
        try:

            async def complete(prompt: list[int]) -> tuple[list[int], int]:
                final = None
                async for output in engine.generate(
                    {"prompt_token_ids": prompt},
                    SamplingParams(max_tokens=reply_tokens, ignore_eos=True, temperature=0),
                    request_id=uuid.uuid4().hex,
                ):
                    final = output
                assert final is not None
                return list(final.outputs[0].token_ids), final.num_cached_tokens or 0

            return list(await asyncio.gather(*(complete(p) for p in prompts)))
        finally:
            engine.shutdown()

    outputs = loop.run_until_complete(scenario())
    return outputs, counter.total


ADMISSION = AdmissionConfig(enabled=True, kv_share=1.0, output_reserve_tokens=REPLY_TOKENS)


def test_admission_keeps_decoding_sequences_from_preempting_each_other(
    event_loop_runner: asyncio.AbstractEventLoop, cache_dir: Path
) -> None:
    prompts = [tokens(PROMPT_TOKENS, seed) for seed in range(SEQUENCES)]
    plain, plain_preemptions = _run(event_loop_runner, cache_dir, None, prompts, REPLY_TOKENS)
    assert plain_preemptions > 0, "the scenario must overfill the pool without admission"
    admitted, admitted_preemptions = _run(
        event_loop_runner, cache_dir, ADMISSION, prompts, REPLY_TOKENS
    )
    assert admitted_preemptions == 0
    assert [output for output, _ in admitted] == [output for output, _ in plain]


def test_a_burst_sharing_a_preamble_prefills_it_once(
    event_loop_runner: asyncio.AbstractEventLoop, cache_dir: Path
) -> None:
    preamble = tokens(1500, 99)
    burst = [preamble + tokens(60, seed) for seed in range(SEQUENCES)]
    replies, _ = _run(event_loop_runner, cache_dir, ADMISSION, burst, 4)
    cached = sorted(found for _, found in replies)
    whole_blocks = len(preamble) // BLOCK * BLOCK
    assert cached[0] == 0, "the leader computes the preamble"
    assert cached[1:] == [whole_blocks] * (SEQUENCES - 1)
