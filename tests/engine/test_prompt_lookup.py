"""Prompt-lookup decoding in a real vLLM engine (CPU backend, tiny random model):
the gated scheduler has n-gram drafts verified, and greedy output is the output
of the same engine without drafts, token for token, also beside a sampled
request (whose temperature vLLM's CPU kernel once lost: `engine/cpu_kernels.py`)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from cluster.config import PromptLookupConfig
from cluster.models import EMBEDDED_SCHEME, TINY_RANDOM_LLAMA, resolve_model
from deployments.engine.plugin import PROMPT_LOOKUP_STATS_METHOD
from deployments.engine.setup import create_engine_config

from .test_kv_pinning import cache_dir, engine_config, event_loop_runner, tokens

pytestmark = pytest.mark.engine

__all__ = ["cache_dir", "event_loop_runner"]  # module fixtures shared with the pinning tests


def _prompts() -> list[list[int]]:
    """Prompts that repeat themselves, so their n-grams recur and get drafted."""
    return [tokens(24, seed) * 6 for seed in range(4)]


def _worker_torch_threads(_worker: Any = None) -> int:
    import torch

    return torch.get_num_threads()


def _run(
    loop: asyncio.AbstractEventLoop,
    cache_dir: Path,
    prompt_lookup: PromptLookupConfig | None,
    threads_seen: list[int] | None = None,
    sampled_beside: bool = False,
) -> tuple[list[list[int]], dict[str, Any] | None]:
    """Greedy outputs of the prompts, and the gate's stats when it runs; with
    `threads_seen`, the worker's torch threads before and after them; with
    `sampled_beside`, a request at temperature 1 runs among them."""
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    model = resolve_model(EMBEDDED_SCHEME + TINY_RANDOM_LLAMA, cache_dir)
    _, vllm_config = create_engine_config(
        engine_config().engine_kwargs(model), None, prompt_lookup, disable_log_stats=True
    )
    if prompt_lookup is not None:
        assert vllm_config.scheduler_config.scheduler_cls.endswith(".GatedScheduler")

    async def scenario() -> tuple[list[list[int]], dict[str, Any] | None]:
        engine = AsyncLLM.from_vllm_config(vllm_config)
        try:
            if threads_seen is not None:
                threads_seen.extend(await engine.collective_rpc(_worker_torch_threads))

            async def complete(prompt: list[int], temperature: float = 0.0) -> list[int]:
                final = None
                async for output in engine.generate(
                    {"prompt_token_ids": prompt},
                    SamplingParams(max_tokens=48, ignore_eos=True, temperature=temperature),
                    request_id=uuid.uuid4().hex,
                ):
                    final = output
                assert final is not None
                return list(final.outputs[0].token_ids)

            sampled = [complete(tokens(24, 99) * 6, temperature=1.0)] if sampled_beside else []
            replies = await asyncio.gather(*(complete(p) for p in _prompts()), *sampled)
            outputs = list(replies[: len(_prompts())])
            if threads_seen is not None:
                threads_seen.extend(await engine.collective_rpc(_worker_torch_threads))
            stats = (
                await engine.engine_core.call_utility_async(PROMPT_LOOKUP_STATS_METHOD)
                if prompt_lookup is not None
                else None
            )
            return outputs, stats
        finally:
            engine.shutdown()

    return loop.run_until_complete(scenario())


@pytest.fixture(scope="module")
def plain_outputs(event_loop_runner: asyncio.AbstractEventLoop, cache_dir: Path) -> list[list[int]]:
    outputs, _ = _run(event_loop_runner, cache_dir, None)
    return outputs


def test_past_the_concurrency_cap_nothing_is_drafted(
    event_loop_runner: asyncio.AbstractEventLoop, cache_dir: Path, plain_outputs: list[list[int]]
) -> None:
    config = PromptLookupConfig(enabled=True, window=4, max_decoders=0)
    outputs, stats = _run(event_loop_runner, cache_dir, config)
    assert outputs == plain_outputs
    assert stats is not None
    assert stats["regions"]["prose"]["drafted"] == 0, stats
    assert stats["capped_steps"] > 0


def test_gated_drafts_beside_a_sampled_request_change_no_greedy_token_and_leave_the_threads_alone(
    event_loop_runner: asyncio.AbstractEventLoop,
    cache_dir: Path,
    plain_outputs: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bound to every core, as replicas are: vLLM's n-gram proposer (numba) must
    not leave the worker's torch kernels on one thread after the first draft."""
    cores = os.cpu_count() or 1
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # a function over collective_rpc
    threads_seen: list[int] = []
    config = PromptLookupConfig(enabled=True, window=4, prose_floor=4, max_decoders=8)
    outputs, stats = _run(event_loop_runner, cache_dir, config, threads_seen, sampled_beside=True)
    assert outputs == plain_outputs
    assert stats is not None
    print(f"prompt lookup on the tiny model: {stats}")
    prose = stats["regions"]["prose"]
    assert prose["steps"] > 0 and prose["drafted"] > 0, stats
    assert threads_seen == [cores, cores]
