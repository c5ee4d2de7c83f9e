"""Benchmark workloads by name and size."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.workloads.aiperf import AiperfWorkload
from bench.workloads.bfcl import BfclConfig, generate_bfcl
from bench.workloads.bfcl_speculation import (
    BfclSpeculationConfig,
    generate_bfcl_speculation,
    hosted_bfcl_tools,
)
from bench.workloads.codegen import CodegenConfig, generate_codegen
from bench.workloads.conveyor import (
    CONVEYOR_REFERENCE,
    ConveyorConfig,
    generate_conveyor,
    hosted_conveyor_tools,
)
from bench.workloads.conveyor import TASKS as CONVEYOR_TASKS
from bench.workloads.conveyor import TOOL_OF_TASK as CONVEYOR_TOOL_OF_TASK
from bench.workloads.distributions import Distribution
from bench.workloads.hot_path import HotPathConfig
from bench.workloads.program import AgentProgram
from bench.workloads.replay import ReplayConfig, generate_replay, vocabulary_text
from bench.workloads.speculation import (
    RecordsTaskConfig,
    generate_speculation,
    hosted_records_tools,
)
from bench.workloads.trace import (
    BFCL_V4_PROFILE,
    SWE_BENCH_PROFILE,
    TraceConfig,
    generate_trace,
)
from bench.workloads.workflows import WorkflowConfig, generate_workflows

Size = Literal["quick", "default"]
SIZES: tuple[Size, ...] = ("quick", "default")


@dataclass(frozen=True)
class WorkloadPlan:
    """A workload at one size, with the engine budget it is meant to run under."""

    name: str
    size: Size
    description: str
    build: Callable[[int], Sequence[AgentProgram]]
    kv_cache_mib: int
    max_model_len: int
    toolserve_overrides: dict[str, Any] = field(default_factory=dict)
    """Configuration toolserve systems need for this workload (hosted tools)."""
    reference_system: str | None = None
    """The system per-agent-kind time saved is measured against, when it ran."""
    tool_of_agent_type: dict[str, str] = field(default_factory=dict)
    """The hosted tool each agent kind calls, whose own run time the report sets
    beside the kind's time to its first tool result."""
    peer: AiperfWorkload | None = None
    """Conversations AIPerf sends instead of this harness's programs (`build` is
    then empty)."""
    hot_path: HotPathConfig | None = None
    """Phases of one-token completions sent instead of programs (`build` is then
    empty)."""


def _quick_profile_turns(mean: float) -> Distribution:
    return Distribution(kind="normal", mean=mean, sd=1, low=2, high=5)


def _many_agent(size: Size) -> WorkloadPlan:
    if size == "quick":
        config = TraceConfig(
            programs=6,
            arrival_rate_per_s=0.5,
            profiles=(
                SWE_BENCH_PROFILE.model_copy(update={"turns": _quick_profile_turns(4)}),
                BFCL_V4_PROFILE.model_copy(update={"turns": _quick_profile_turns(3)}),
            ),
        )
        kv_cache_mib, max_model_len = 128, 2048
    else:
        # Sized so three rounds of the default system set (six systems) fit in about
        # an hour on 2 cores. The engine is busy throughout, so an arm's time goes with
        # the prompt tokens the trace sends (12 programs took 4-6 minutes a system);
        # seed 0's 7 programs send about half of what its 12 do, and their live
        # contexts still outgrow the KV budget about threefold.
        config = TraceConfig(programs=7, arrival_rate_per_s=0.25)
        kv_cache_mib, max_model_len = 256, 4096
    return WorkloadPlan(
        name="many-agent",
        size=size,
        description=(
            f"{config.programs} agent programs, Poisson arrivals at "
            f"{config.arrival_rate_per_s}/s, SWE-bench and BFCL v4 turn and tool-latency "
            "statistics (Continuum, arXiv 2511.02230, Table 1); every non-final turn must "
            "call a tool (tool_choice=required). Not reproduced: program size (about 2k "
            "tokens here, tens of thousands in Continuum's traces; memory pressure comes "
            "from a small KV budget instead) and real tools (simulated latency and output)"
        ),
        build=lambda seed: generate_trace(config, seed),
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
    )


def _workflow(name: str, size: Size) -> WorkloadPlan:
    if name == "bugfix-6":
        sessions, rate = (3, 0.5) if size == "quick" else (12, 0.2)
        kv_cache_mib, max_model_len = 128, 2048
    else:
        # Four sessions took about 15 minutes a system; two keep three rounds of the
        # default systems near an hour while contexts still outgrow the KV budget.
        sessions, rate = (1, 0.0) if size == "quick" else (2, 0.05)
        kv_cache_mib, max_model_len = 384, 8192
    config = WorkflowConfig(workflow=name, sessions=sessions, arrival_rate_per_s=rate)
    turns = 6 if name == "bugfix-6" else 35
    return WorkloadPlan(
        name=name,
        size=size,
        description=(
            f"{sessions} sessions of the {turns}-turn "
            f"{'bug-fix' if name == 'bugfix-6' else 'coding'} workflow (named tool each "
            "turn, context grows every turn, unique file names per session). Turn count "
            "from arXiv 2605.26289; not reproduced: its prompts, tools and context sizes "
            "(unpublished), the steps and repository here are this project's own"
        ),
        build=lambda seed: generate_workflows(config, seed),
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
    )


def _bfcl(size: Size) -> WorkloadPlan:
    config = BfclConfig(
        entries=3 if size == "quick" else 20,
        arrival_rate_per_s=0.5 if size == "quick" else 0.1,
    )
    return WorkloadPlan(
        name="bfcl",
        size=size,
        description=(
            f"{config.entries} BFCL v4 multi-turn ({config.category}) entries, real BFCL "
            f"backends, at most {config.steps_per_turn} model requests per user turn. Not "
            "reproduced: BFCL's scoring (answers are not graded); the in-memory backends "
            "answer at once, so each tool round adds a latency drawn from Continuum's "
            "BFCL v4 statistics"
        ),
        build=lambda seed: generate_bfcl(config, seed),
        kv_cache_mib=256,
        max_model_len=4096,
        # Every system's calls run on the client, with the same simulated latency;
        # toolserve's hosted BFCL tools (same schemas) would run them server-side.
        toolserve_overrides={"tools.hosted": []},
    )


def _codegen(size: Size) -> WorkloadPlan:
    config = CodegenConfig(
        programs=3 if size == "quick" else 8,
        tasks_per_program=1 if size == "quick" else 2,
        arrival_rate_per_s=0.5 if size == "quick" else 0.2,
    )
    return WorkloadPlan(
        name="codegen",
        size=size,
        description=(
            f"{config.programs} programs writing {config.tasks_per_program} Python "
            "script(s) each, run by a real interpreter"
        ),
        build=lambda seed: generate_codegen(config, seed),
        kv_cache_mib=128,
        max_model_len=2048,
    )


def _speculation(size: Size) -> WorkloadPlan:
    config = (
        RecordsTaskConfig(latencies_s=(0.1, 1.0), programs_per_latency=3, arrival_gap_s=6.0)
        if size == "quick"
        else RecordsTaskConfig()
    )
    programs = config.programs_per_latency * len(config.latencies_s)
    return WorkloadPlan(
        name="speculation",
        size=size,
        description=(
            f"{programs} records tasks (plan sentence, a records lookup with a key the "
            f"model writes, answer), one every "
            f"{config.arrival_gap_s:g}s, records-service latency "
            + ", ".join(f"{latency:g}s" for latency in config.latencies_s)
        ),
        build=lambda seed: generate_speculation(config, seed),
        kv_cache_mib=128,
        max_model_len=2048,
        toolserve_overrides={
            "tools.hosted": hosted_records_tools(config.latencies_s),
        },
        reference_system="toolserve-no-speculation",
    )


def _bfcl_speculation(size: Size) -> WorkloadPlan:
    config = (
        BfclSpeculationConfig(entries=3, user_turns=2, arrival_gap_s=8.0)
        if size == "quick"
        else BfclSpeculationConfig(entries=12, arrival_gap_s=15.0)
    )
    return WorkloadPlan(
        name="bfcl-speculation",
        size=size,
        description=(
            f"{config.entries} BFCL v4 multi-turn ({config.category}) entries, the first "
            f"{config.user_turns} user turns each, one program every {config.arrival_gap_s:g}s; "
            "each turn a plan sentence, a call of the entry's functions the model writes, "
            f"run on BFCL's backends ({config.tool_latency_s:g}s each, hosted by toolserve), "
            "and the answer. Not reproduced: the papers' capable models, per-call latencies, "
            "BFCL's scoring"
        ),
        build=lambda seed: generate_bfcl_speculation(config, seed),
        kv_cache_mib=768,
        max_model_len=8192,
        toolserve_overrides={"tools.hosted": hosted_bfcl_tools(config.tool_latency_s)},
        reference_system="toolserve-no-speculation",
    )


def _aiperf_multi_turn(size: Size) -> WorkloadPlan:
    if size == "quick":
        peer = AiperfWorkload(
            conversations=6, turns=4, turn_delay_ms=1000, turn_delay_stddev_ms=500,
            input_tokens=64, output_tokens=32, concurrency=6,
        )  # fmt: skip
        kv_cache_mib, max_model_len = 128, 2048
    else:
        # Pause between turns: BFCL v4 tool time (Continuum, arXiv 2511.02230, Table 1).
        peer = AiperfWorkload(
            conversations=24, turns=8, turn_delay_ms=1923, turn_delay_stddev_ms=2133,
            input_tokens=64, output_tokens=48, concurrency=12,
        )  # fmt: skip
        kv_cache_mib, max_model_len = 256, 4096
    return WorkloadPlan(
        name="aiperf-multi-turn",
        size=size,
        description=(
            f"AIPerf's synthetic multi-turn conversations, driven by `aiperf profile`: "
            f"{peer.conversations} conversations of {peer.turns} turns, {peer.concurrency} "
            f"at once, {peer.input_tokens} new prompt tokens and {peer.output_tokens} "
            f"generated per turn, {peer.turn_delay_ms:g} ms (sd {peer.turn_delay_stddev_ms:g}) "
            "between turns for the tool, one X-Session-ID per conversation. Not reproduced: "
            "tool calls (AIPerf's synthetic turns are plain chat; it replays tool turns only "
            "from recorded histories, not the server's live replies)"
        ),
        build=lambda seed: [],
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
        peer=peer,
    )


def _hot_path(size: Size) -> WorkloadPlan:
    config = (
        HotPathConfig(
            sequential_requests=30, concurrency=(8, 32), requests_per_phase=64, streamed_requests=20
        )
        if size == "quick"
        else HotPathConfig(
            sequential_requests=100,
            concurrency=(8, 32, 128),
            requests_per_phase=256,
            streamed_requests=50,
        )
    )
    return WorkloadPlan(
        name="hot-path",
        size=size,
        description=(
            f"the serving layer's cost per request: {config.sequential_requests} one-token "
            f"completions one at a time, {config.requests_per_phase} with "
            + ", ".join(str(c) for c in config.concurrency)
            + f" in flight, {config.streamed_requests} streamed one at a time (time to "
            "first token); no tools, no session"
        ),
        build=lambda seed: [],
        kv_cache_mib=128,
        max_model_len=2048,
        hot_path=config,
    )


def _burst(size: Size) -> WorkloadPlan:
    config = HotPathConfig(burst_width=8, burst_iterations=5 if size == "quick" else 10)
    return WorkloadPlan(
        name="burst",
        size=size,
        description=(
            f"{config.burst_iterations} bursts of {config.burst_width} requests sent at "
            "once, one burst after another: each burst a team of agents sharing a preamble "
            "of their own (a long system prompt and eight tool schemas: prompts of about "
            "1,170 tokens with SmolLM2's template), each "
            f"agent asking its own question, greedy, up to {config.burst_max_tokens} tokens "
            "per reply, no session. Latency at the API (p50, p99 over all bursts)"
        ),
        build=lambda seed: [],
        kv_cache_mib=384,
        max_model_len=4096,
        hot_path=config,
    )


def _repeated_prompt(size: Size) -> WorkloadPlan:
    config = HotPathConfig(repeated_requests=50 if size == "quick" else 200)
    return WorkloadPlan(
        name="repeated-prompt",
        size=size,
        description=(
            f"one question asked {config.repeated_requests} times, one at a time, greedy, "
            f"up to {config.repeated_max_tokens} tokens per reply, no session: toolserve "
            "answers every repeat from its response cache; vLLM's server decodes each "
            "again, its prefix cache holding the prompt. Latency at the API (p50, p99)"
        ),
        build=lambda seed: [],
        kv_cache_mib=128,
        max_model_len=2048,
        hot_path=config,
    )


@functools.cache
def _embedded_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from cluster.config import load_config
    from cluster.models import resolve_model

    config = load_config()
    return AutoTokenizer.from_pretrained(resolve_model(config.main.engine.model, config.cache_dir))


def _embedded_token_count() -> Callable[[str], int]:
    """Tokens of a text for the embedded default's model."""
    tokenizer = _embedded_tokenizer()
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


@functools.cache
def _embedded_vocabulary_words(count: int = 4000) -> tuple[str, ...]:
    """Lower-case words the embedded model's tokenizer reads as one token after a
    space, most frequent merges first."""
    tokenizer = _embedded_tokenizer()
    words = []
    for token, token_id in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        word = tokenizer.convert_tokens_to_string([token])
        stripped = word[1:]
        candidate = word.startswith(" ") and len(stripped) >= 3
        candidate = candidate and stripped.isascii() and stripped.isalpha() and stripped.islower()
        if candidate and tokenizer.encode(word, add_special_tokens=False) == [token_id]:
            words.append(stripped)
        if len(words) == count:
            break
    return tuple(words)


def _trace_replay(size: Size) -> WorkloadPlan:
    if size == "quick":
        config = ReplayConfig(programs=6, arrival_rate_per_s=0.5, max_context=3072)
        kv_cache_mib, max_model_len = 384, 4096
    else:
        # The chat template's markup comes on top of the content's tokens.
        config = ReplayConfig(programs=16, arrival_rate_per_s=0.2, max_context=7680)
        kv_cache_mib, max_model_len = 1536, 8192
    return WorkloadPlan(
        name="trace-replay",
        size=size,
        description=(
            f"{config.programs} agent programs replayed by token counts, Poisson arrivals "
            f"at {config.arrival_rate_per_s}/s, contexts up to {config.max_context} tokens: "
            "each turn appends a drawn number of tokens and decodes exactly a drawn number "
            "(min_tokens = max_tokens, ignore_eos; temperature "
            f"{config.temperature}), tool pauses between turns. Coding "
            "agents and tool assistants with Continuum's SWE-bench and BFCL v4 turn and "
            "pause statistics (arXiv 2511.02230, Table 1), coding contexts growing toward "
            "the model's limit (vLLM's AgentX write-up, Mooncake's SWE-bench traces); "
            "sources and token counts in bench/workloads/replay.py"
        ),
        build=lambda seed: generate_replay(
            config, seed, vocabulary_text(_embedded_vocabulary_words())
        ),
        kv_cache_mib=kv_cache_mib,
        max_model_len=max_model_len,
    )


def _conveyor(size: Size) -> WorkloadPlan:
    config = (
        ConveyorConfig(programs_per_task=1, turns=2, arrival_rate_per_s=0.5)
        if size == "quick"
        else ConveyorConfig(programs_per_task=3, turns=3, arrival_rate_per_s=0.1)
    )
    return WorkloadPlan(
        name="conveyor",
        size=size,
        description=(
            f"partial tool execution (Conveyor, arXiv 2406.00059, §4): {config.programs_per_task} "
            f"program(s) of each task ({', '.join(CONVEYOR_TASKS)}), {config.turns} turns each, "
            f"Poisson arrivals at {config.arrival_rate_per_s}/s; each turn one streamed call of "
            "a hosted tool whose text structured outputs fix (the same tokens for every "
            f"system), then an answer of up to {config.answer_max_tokens} tokens. CodeGen: a "
            "script that counts primes and draws a sine plot into a PNG (the paper's plot, "
            "with the standard library); Validation: a calculator call whose first argument "
            "is a number where a string belongs, followed by a note of forty to seventy words; "
            "Calculator and Database (a read-only SQL query over the Python reference's "
            "topics): the null cases (no partial input). Not reproduced: the paper's models "
            "and GPU decoding speed"
        ),
        build=lambda seed: generate_conveyor(config, seed, _embedded_token_count()),
        # Three CodeGen turns (each call some 600 tokens as the engine writes it)
        # outgrow 2048 tokens by the last one.
        kv_cache_mib=128 if size == "quick" else 256,
        max_model_len=2048 if size == "quick" else 4096,
        toolserve_overrides={"tools.hosted": hosted_conveyor_tools()},
        reference_system=CONVEYOR_REFERENCE,
        # Validation's calls are rejected, not run: no overlap bound applies.
        tool_of_agent_type={
            task: tool for task, tool in CONVEYOR_TOOL_OF_TASK.items() if task != "validation"
        },
    )


WORKLOADS: dict[str, Callable[[Size], WorkloadPlan]] = {
    "many-agent": _many_agent,
    "trace-replay": _trace_replay,
    "bugfix-6": lambda size: _workflow("bugfix-6", size),
    "coding-35": lambda size: _workflow("coding-35", size),
    "bfcl": _bfcl,
    "codegen": _codegen,
    "speculation": _speculation,
    "bfcl-speculation": _bfcl_speculation,
    "aiperf-multi-turn": _aiperf_multi_turn,
    "hot-path": _hot_path,
    "repeated-prompt": _repeated_prompt,
    "burst": _burst,
    "conveyor": _conveyor,
}


def plan_workload(name: str, size: Size) -> WorkloadPlan:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return WORKLOADS[name](size)
