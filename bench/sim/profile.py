"""Times a real vLLM engine's steps, in this process, over a designed mix of
prefills (with and without a cached prefix), decoding batches of several sizes
and contexts, and n-gram drafts, and fits the simulator's step-time model to
them. The engine is the stock one the benchmark's vLLM arms run, with their
settings; each step's work is read off the scheduler's output."""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bench.sim.step_time import StepTimeModel, StepWork
from bench.systems import EngineSettings

TOKEN_IDS = range(1000, 20000)
"""Ordinary tokens of the embedded models' vocabularies, away from special ones."""


@dataclass(frozen=True)
class TimedStep:
    work: StepWork
    seconds: float


@dataclass(frozen=True)
class Scenario:
    """Prompts sent together, each decoding `max_tokens`."""

    name: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int


class StepProfile(BaseModel):
    """A fitted step-time model and what it was fitted on."""

    model_config = ConfigDict(extra="forbid")

    step_time: StepTimeModel
    model: str = Field(description="The model the engine ran.")
    machine: str = Field(description="Where: CPU model and cores, or the published source.")
    recorded: str = Field(description="When (UTC) or the source's date.")
    block_size: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    max_batched_tokens: int = Field(gt=0, description="The engine's token budget a step.")
    kv_bytes_per_token: int = Field(gt=0, description="KV cache bytes per context token.")
    steps: int = Field(ge=0, description="Timed steps fitted (0: taken from a source).")
    median_relative_error: float | None = Field(
        default=None, description="Median |fitted - timed| / timed over the steps."
    )
    source: str = Field(default="", description="Where the figures come from.")

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> StepProfile:
        return cls.model_validate_json(path.read_text())


def scenarios(rng: random.Random) -> list[Scenario]:
    def prompt(length: int) -> tuple[int, ...]:
        return tuple(rng.choice(TOKEN_IDS) for _ in range(length))

    def repetitive(length: int) -> tuple[int, ...]:
        phrase = prompt(24)
        return (phrase * (length // 24 + 1))[:length]

    shared = prompt(2048)
    plans = [
        Scenario(f"prefill {length}", (prompt(length),), 2)
        for length in (64, 256, 512, 1024, 2048, 4096, 6000)
    ]
    plans += [
        Scenario("cached prefix 2048", (shared,), 2),
        Scenario("extends a cached 2048", (shared + prompt(256),), 2),
        Scenario("extends a cached 2048 more", (shared + prompt(1024),), 2),
    ]
    plans += [
        Scenario(f"decode {batch} at {context}", tuple(prompt(context) for _ in range(batch)), 24)
        for batch, context in ((1, 256), (4, 256), (8, 512), (16, 256), (32, 128), (4, 2048))
    ]
    plans += [
        Scenario(f"drafts {batch}", tuple(repetitive(480) for _ in range(batch)), 48)
        for batch in (1, 4)
    ]
    return plans


def step_work(scheduler: Any, output: Any) -> StepWork:
    """What the step the scheduler just planned computes."""
    prefills = []
    decodes = []
    drafts = 0
    for request_id, scheduled in output.num_scheduled_tokens.items():
        request = scheduler.requests[request_id]
        proposed = len(output.scheduled_spec_decode_tokens.get(request_id, ()))
        before = request.num_computed_tokens - scheduled
        own = scheduled - proposed
        if own == 1 and before >= request.num_prompt_tokens:
            decodes.append(before + 1)
            drafts += proposed
        else:
            prefills.append((scheduled, before))
    return StepWork(tuple(prefills), tuple(decodes), drafts)


@contextmanager
def _in_process_engine(engine_arguments: dict[str, Any]) -> Iterator[Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(EngineArgs(**engine_arguments))
    try:
        yield engine
    finally:
        engine.engine_core.shutdown()


def time_steps(
    engine_arguments: dict[str, Any], plans: Sequence[Scenario], log: Callable[[str], None]
) -> tuple[list[TimedStep], Any]:
    """Every step of every scenario, timed (after the first scenario once more,
    untimed, to warm the engine up); and the engine's scheduler."""
    from vllm import SamplingParams

    timed: list[TimedStep] = []
    with _in_process_engine(engine_arguments) as engine:
        scheduler = engine.engine_core.engine_core.scheduler
        planned: list[StepWork] = []
        schedule = scheduler.schedule

        def recorded_schedule(*args: Any, **kwargs: Any) -> Any:
            output = schedule(*args, **kwargs)
            planned.append(step_work(scheduler, output))
            return output

        scheduler.schedule = recorded_schedule
        for number, plan in enumerate([plans[0], *plans]):
            params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=plan.max_tokens)
            for index, prompt in enumerate(plan.prompts):
                engine.add_request(f"{number}-{index}", {"prompt_token_ids": list(prompt)}, params)
            steps_before = len(timed)
            while engine.has_unfinished_requests():
                planned.clear()
                started = time.perf_counter()
                engine.step()
                seconds = time.perf_counter() - started
                if number == 0:
                    continue
                for work in planned:
                    if not work.idle:
                        timed.append(TimedStep(work, seconds / len(planned)))
            if number:
                log(f"sim profile: {plan.name}: {len(timed) - steps_before} steps")
    return timed, scheduler


def kv_bytes_per_token(scheduler: Any) -> int:
    """KV bytes a context token takes over all layers, from the engine's cache layout."""
    config = scheduler.kv_cache_config
    per_block = sum(
        group.kv_cache_spec.page_size_bytes * len(group.layer_names)
        for group in config.kv_cache_groups
    )
    return int(per_block // scheduler.block_size)


def profile_engine(settings: EngineSettings, seed: int, log: Callable[[str], None]) -> StepProfile:
    """The benchmark's vLLM engine, timed and fitted."""
    os.environ.update(settings.process_environment())
    arguments = {
        name: value
        for name, value in settings.vllm_engine_kwargs().items()
        if name not in settings.frontend_args
    } | {"model": settings.model_path}
    timed, scheduler = time_steps(arguments, scenarios(random.Random(seed)), log)
    return fit_profile(
        timed,
        model=settings.served_model_name,
        block_size=settings.block_size,
        max_num_seqs=settings.max_num_seqs,
        max_batched_tokens=scheduler.max_num_scheduled_tokens,
        kv_bytes_per_token=kv_bytes_per_token(scheduler),
    )


def fit_profile(
    timed: Sequence[TimedStep],
    *,
    model: str,
    block_size: int,
    max_num_seqs: int,
    max_batched_tokens: int,
    kv_bytes_per_token: int,
) -> StepProfile:
    step_time = StepTimeModel.fit([step.work for step in timed], [step.seconds for step in timed])
    errors = [abs(step_time.seconds(step.work) - step.seconds) / step.seconds for step in timed]
    return StepProfile(
        step_time=step_time,
        model=model,
        machine=f"{_cpu_model()}, {os.cpu_count()} cores",
        recorded=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_batched_tokens=max_batched_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        steps=len(timed),
        median_relative_error=statistics.median(errors),
        source="timed steps of vLLM's CPU engine in this process (`toolserve sim-profile`)",
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
