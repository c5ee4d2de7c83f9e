"""Workload generators: determinism, published statistics, program state machines,
and the real tool backends (BFCL, the Python runner)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import statistics
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from bench.tools import record_text
from bench.workloads import PROGRAM_COUNT_WORKLOADS, SIZES, WORKLOADS, plan_workload
from bench.workloads.bfcl import (
    BfclConfig,
    SafeDispatcher,
    generate_bfcl,
    load_entries,
    tool_schemas,
)
from bench.workloads.bfcl_speculation import BfclSpeculationConfig, generate_bfcl_speculation
from bench.workloads.codegen import CodegenConfig, generate_codegen, run_python
from bench.workloads.conveyor import TASKS as CONVEYOR_TASKS
from bench.workloads.conveyor import (
    ConveyorConfig,
    ConveyorProgram,
    codegen_script,
    conveyor_run,
    conveyor_tool_schemas,
    generate_conveyor,
)
from bench.workloads.distributions import Distribution, poisson_arrivals
from bench.workloads.plan import programs_update
from bench.workloads.program import AGENT_TEMPERATURE, Reply, ToolCall, ToolOutcome
from bench.workloads.speculation import RecordsProgram, RecordsTaskConfig, generate_speculation
from bench.workloads.trace import (
    BFCL_V4_PROFILE,
    SWE_BENCH_PROFILE,
    AgentProfile,
    TraceConfig,
    TraceProgram,
    generate_trace,
)
from bench.workloads.workflows import (
    BUG_FIX_STEPS,
    WorkflowConfig,
    coding_steps,
    generate_workflows,
)
from cluster.config import ToolsConfig
from toolworkers.builtin_tools import calculate
from toolworkers.registry import ToolRegistry

ZERO_LATENCY = Distribution(kind="constant", mean=0.0)


def _reply(*calls: ToolCall, content: str | None = None) -> Reply:
    return Reply(
        content=content,
        tool_calls=calls,
        finish_reason="tool_calls" if calls else "stop",
        prompt_tokens=100,
        cached_tokens=64,
        completion_tokens=20,
    )


def _program_fingerprint(program: object) -> str:
    fields = {
        key: value
        for key, value in vars(program).items()
        if key not in ("dispatcher", "repository")
    }
    return json.dumps(fields, sort_keys=True, default=str)


# --- distributions -----------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "mean", "sd"), [(SWE_BENCH_PROFILE, 0.925, 3.55), (BFCL_V4_PROFILE, 1.923, 2.133)]
)
def test_shipped_tool_latencies_keep_the_published_mean_and_spread(
    profile: AgentProfile, mean: float, sd: float
) -> None:
    rng = random.Random(7)
    samples = [profile.tool_latency_s.sample(rng) for _ in range(200_000)]
    # A lognormal's sample sd converges too slowly to test; its log's does not.
    logs = [math.log(value) for value in samples]
    sigma = math.sqrt(math.log1p((sd / mean) ** 2))
    assert statistics.pstdev(logs) == pytest.approx(sigma, rel=0.02)
    assert statistics.fmean(logs) == pytest.approx(math.log(mean) - sigma**2 / 2, abs=0.02)
    assert statistics.fmean(samples) == pytest.approx(mean, rel=0.05)
    assert statistics.median(samples) < mean  # heavy tail: most tools are fast
    # Uncapped: the tail past 30 s is there in the share the distribution gives it.
    tail = statistics.NormalDist(math.log(mean) - sigma**2 / 2, sigma)
    expected_over_30 = 1 - tail.cdf(math.log(30))
    observed_over_30 = sum(value > 30 for value in samples) / len(samples)
    assert observed_over_30 == pytest.approx(expected_over_30, rel=0.25, abs=2e-5)


def test_normal_turns_match_the_published_statistics() -> None:
    rng = random.Random(3)
    turns = [BFCL_V4_PROFILE.turns.sample_int(rng) for _ in range(50_000)]
    assert statistics.fmean(turns) == pytest.approx(6.3, abs=0.1)
    assert statistics.pstdev(turns) == pytest.approx(2.3, abs=0.15)
    assert min(turns) >= 2


def test_distribution_clips_and_validates() -> None:
    clipped = Distribution(kind="normal", mean=0, sd=10, low=-1, high=1)
    rng = random.Random(0)
    assert all(-1 <= clipped.sample(rng) <= 1 for _ in range(1000))
    assert Distribution(kind="constant", mean=2.5).sample(rng) == 2.5
    with pytest.raises(ValidationError):
        Distribution(kind="lognormal", mean=0, sd=1)
    with pytest.raises(ValidationError):
        Distribution(kind="normal", mean=0, low=2, high=1)


def test_poisson_arrivals_start_at_zero_and_match_the_rate() -> None:
    arrivals = poisson_arrivals(20_000, 0.5, random.Random(1))
    assert arrivals[0] == 0.0
    assert arrivals == sorted(arrivals)
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    assert statistics.fmean(gaps) == pytest.approx(2.0, rel=0.05)
    assert poisson_arrivals(3, 0, random.Random(1)) == [0.0, 0.0, 0.0]


# --- many-agent trace --------------------------------------------------------


def test_trace_is_deterministic_given_the_seed() -> None:
    config = TraceConfig(programs=12, arrival_rate_per_s=0.5)
    first = [_program_fingerprint(p) for p in generate_trace(config, seed=5)]
    again = [_program_fingerprint(p) for p in generate_trace(config, seed=5)]
    other = [_program_fingerprint(p) for p in generate_trace(config, seed=6)]
    assert first == again
    assert first != other


def test_trace_programs_are_unique_and_mix_agent_types() -> None:
    programs = generate_trace(TraceConfig(programs=60, arrival_rate_per_s=1.0), seed=0)
    assert len({p.program_id for p in programs}) == 60
    assert {p.agent_type for p in programs} == {"swe", "assistant"}
    tasks = [p.messages[1]["content"] for p in programs]
    assert len(set(tasks)) == len(tasks)
    swe_turns = [p.turns for p in programs if p.agent_type == "swe"]
    assistant_turns = [p.turns for p in programs if p.agent_type == "assistant"]
    assert statistics.fmean(swe_turns) > statistics.fmean(assistant_turns)


def test_trace_program_requires_tools_until_its_last_turn() -> None:
    program = generate_trace(TraceConfig(programs=1, arrival_rate_per_s=0), seed=1)[0]
    program = replace(program, turns=3, tool_latencies_s=[0.0] * 3, output_lines=[4] * 3)
    choices = []
    while (request := program.next_request()) is not None:
        choices.append(request.tool_choice)
        call = ToolCall("call-1", "read_file", '{"path": "a.py"}')
        asyncio.run(program.act(request, _reply(call) if request.expects_tool_call else _reply()))
    assert choices == ["required", "required", "none"]
    roles = [message["role"] for message in program.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert program.messages[3]["tool_call_id"] == "call-1"
    assert len(program.messages[3]["content"].splitlines()) == 4


def test_trace_program_counts_unusable_calls() -> None:
    program: TraceProgram = generate_trace(TraceConfig(programs=1, arrival_rate_per_s=0), 1)[0]
    program = replace(program, turns=4, tool_latencies_s=[0.0] * 4, output_lines=[2] * 4)
    outcomes = []
    for reply in (
        _reply(content="I will read the file."),  # no call where one is required
        _reply(ToolCall("c1", "delete_everything", "{}")),  # unknown tool
        _reply(ToolCall("c2", "read_file", '{"path": ')),  # malformed arguments
    ):
        request = program.next_request()
        assert request is not None
        outcomes.append(asyncio.run(program.act(request, reply)))
    assert [outcome.unusable_calls for outcome in outcomes] == [1, 1, 1]
    assert program.messages[3] == {
        "role": "user",
        "content": "You did not call a tool. Call exactly one tool next.",
    }


# --- workflows ---------------------------------------------------------------


def test_workflow_scripts_have_the_papers_turn_counts() -> None:
    assert len(BUG_FIX_STEPS) == 6
    scripts = {coding_steps(random.Random(seed)) for seed in range(5)}
    assert {len(script) for script in scripts} == {35} and len(scripts) == 5


def test_coding_workflow_grows_every_turn_with_session_unique_files() -> None:
    config = WorkflowConfig(
        workflow="coding-35", sessions=2, arrival_rate_per_s=0, tool_latency_s=ZERO_LATENCY
    )
    first, second = generate_workflows(config, seed=0)
    sizes = []
    requests = 0
    while (request := first.next_request()) is not None:
        requests += 1
        if request.expects_tool_call:
            assert isinstance(request.tool_choice, dict)
            name = request.tool_choice["function"]["name"]
            asyncio.run(first.act(request, _reply(ToolCall(f"c{requests}", name, "{}"))))
        else:
            asyncio.run(first.act(request, _reply(content="Fixed it.")))
        sizes.append(len(json.dumps(first.messages)))
    assert requests == 35
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    assert first.repository is not None and second.repository is not None
    assert set(first.repository.files).isdisjoint(second.repository.files)


def test_workflow_answers_do_not_depend_on_call_order_elsewhere() -> None:
    config = WorkflowConfig(workflow="bugfix-6", sessions=1, arrival_rate_per_s=0)
    one, two = generate_workflows(config, 3)[0], generate_workflows(config, 3)[0]
    assert one.repository is not None and two.repository is not None
    two.repository.answer("run_tests", 9)  # an extra call must not shift later answers
    assert one.repository.answer("run_tests", 3) == two.repository.answer("run_tests", 3)


def test_unknown_workflow_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown workflow"):
        generate_workflows(WorkflowConfig(workflow="x", sessions=1, arrival_rate_per_s=0), 0)


# --- BFCL --------------------------------------------------------------------


def test_bfcl_tools_are_valid_schemas_without_excluded_functions() -> None:
    tools = tool_schemas(["GorillaFileSystem", "TwitterAPI"], excluded=["cp"])
    names = [tool["function"]["name"] for tool in tools]
    assert "cp" not in names and {"ls", "cd", "post_tweet"} <= set(names)
    for tool in tools:
        parameters = tool["function"]["parameters"]
        assert parameters["type"] == "object"
        assert "This tool belongs to" not in tool["function"]["description"]
        for prop in parameters.get("properties", {}).values():
            assert prop["type"] in {"string", "integer", "number", "boolean", "array", "object"}


def test_safe_dispatcher_runs_the_real_backends() -> None:
    entry = load_entries("base")[0]
    dispatcher = SafeDispatcher(
        entry["involved_classes"], entry["initial_config"], entry["excluded_function"]
    )
    assert "workspace" in dispatcher("pwd", {})
    dispatcher("cd", {"folder": "document"})
    assert "final_report.pdf" in dispatcher("ls", {})
    with pytest.raises(KeyError):
        dispatcher("cp", {})  # excluded in this entry
    with pytest.raises(KeyError):
        dispatcher("__init__", {})
    with pytest.raises(TypeError):
        dispatcher("cd", {"no_such_argument": 1})


def test_bfcl_program_replays_user_turns_with_a_step_limit() -> None:
    config = BfclConfig(entries=1, arrival_rate_per_s=0, steps_per_turn=2)
    program = generate_bfcl(config, seed=0)[0]
    program.latencies_s = [0.0]
    user_turns = len(program.user_turns)
    requests = 0
    while (request := program.next_request()) is not None:
        requests += 1
        # The model keeps calling `pwd`: every user turn hits the step limit.
        asyncio.run(program.act(request, _reply(ToolCall(f"c{requests}", "pwd", "{}"))))
    assert requests == 2 * user_turns
    assert program.step_limit_hits == user_turns
    users = [m["content"] for m in program.messages if m["role"] == "user"]
    assert users == [turn[0]["content"] for turn in program.user_turns]


def test_bfcl_selection_is_deterministic() -> None:
    config = BfclConfig(entries=4, arrival_rate_per_s=0.2)
    ids = [p.program_id for p in generate_bfcl(config, seed=2)]
    assert ids == [p.program_id for p in generate_bfcl(config, seed=2)]
    assert ids != [p.program_id for p in generate_bfcl(config, seed=3)]


# --- BFCL-derived speculation ---------------------------------------------------


def test_bfcl_speculation_programs_declare_the_hosted_schemas_and_their_state() -> None:
    plan = plan_workload("bfcl-speculation", "default")
    registry = ToolRegistry.from_config(
        ToolsConfig.model_validate({"hosted": plan.toolserve_overrides["tools.hosted"]})
    )
    hosted = registry.openai_schemas()
    programs = plan.build(0)
    assert len(programs) == 12 and plan.reference_system == "toolserve-no-speculation"
    readers = 0
    for program in programs:
        assert all(tool in hosted for tool in program.tools)
        assert program.tool_state(), "the server starts from the entry's initial_config"
        assert set(program.tool_state()) <= set(registry.state_slots())
        for tool in program.tools:
            hosted_tool = registry.get(tool["function"]["name"])
            readers += hosted_tool is not None and hosted_tool.spec.reads_state_only
    assert readers > 0, "some of the declared functions may be speculated"
    assert [p.program_id for p in plan.build(0)] == [p.program_id for p in programs]


def test_a_bfcl_speculation_turn_is_a_plan_and_a_call_the_model_writes() -> None:
    config = BfclSpeculationConfig(entries=200, user_turns=2, arrival_gap_s=1, tool_latency_s=0)
    program = next(
        program
        for program in generate_bfcl_speculation(config, seed=0)
        if "GorillaFileSystem" in program.tool_state() and len(program.user_turns) == 2
    )
    first = program.next_request()
    assert first is not None and first.tool_choice == "auto" and first.structured_outputs
    regex = re.compile(first.structured_outputs["regex"])
    call = '<tool_call>\n{"name": "%s", "arguments": {%s}}\n</tool_call>'
    plan = "I will look at the files first.\n"
    assert regex.fullmatch(plan + call % ("ls", ""))
    assert regex.fullmatch(plan + call % ("cd", '"folder": "document"'))
    # The function's own argument names and types; the values are the model's.
    assert not regex.fullmatch(plan + call % ("cd", '"folder": 3'))
    assert not regex.fullmatch(plan + call % ("cd", '"directory": "document"'))
    assert not regex.fullmatch(plan + call % ("ls", '"x": "y"'))
    assert not regex.fullmatch(call % ("ls", "")), "the plan sentence comes first"
    assert not regex.fullmatch(plan + call % ("no_such_function", ""))
    # A server that ran the call answered in the same request: the next user turn.
    executed = (
        {"role": "assistant", "content": None, "tool_calls": [{"id": "s1"}]},
        {"role": "tool", "tool_call_id": "s1", "content": "{}"},
    )
    asyncio.run(program.act(first, replace(_reply(content="Done."), executed_messages=executed)))
    second = program.next_request()
    assert second is not None and second.structured_outputs is not None
    assert program.messages[-1] == program.user_turns[1][0]
    # A server that handed the call back: the program runs it, then asks for the answer.
    round_ = asyncio.run(program.act(second, _reply(ToolCall("c1", "pwd", "{}"))))
    assert round_.calls == 1 and round_.unusable_calls == 0
    root = next(iter(program.tool_state()["GorillaFileSystem"]["root"]))
    assert json.loads(program.messages[-1]["content"]) == {"current_working_directory": f"/{root}"}
    answer = program.next_request()
    assert answer is not None and answer.tool_choice == "none" and not answer.structured_outputs
    asyncio.run(program.act(answer, _reply(content="Done.")))
    assert program.next_request() is None
    assert program.turns_sent == 3


# --- codegen -----------------------------------------------------------------


def test_run_python_really_runs_scripts_in_isolation() -> None:
    assert run_python("for i in range(3):\n    print(i * i)", 10).split() == ["0", "1", "4"]
    assert "ZeroDivisionError" in run_python("1 / 0", 10)
    assert "exit code 1" in run_python("1 / 0", 10)
    assert "stopped" in run_python("while True:\n    pass", 0.5)


def test_codegen_program_alternates_script_and_explanation() -> None:
    program = generate_codegen(
        CodegenConfig(programs=1, tasks_per_program=2, arrival_rate_per_s=0), seed=0
    )[0]
    kinds = []
    while (request := program.next_request()) is not None:
        if request.expects_tool_call:
            kinds.append("script")
            code = json.dumps({"code": "print(6 * 7)"})
            asyncio.run(program.act(request, _reply(ToolCall("c", "run_python", code))))
        else:
            kinds.append("explain")
            asyncio.run(program.act(request, _reply(content="It printed 42.")))
    assert kinds == ["script", "explain", "script", "explain"]
    assert any(m["role"] == "tool" and m["content"].strip() == "42" for m in program.messages)


# --- registry ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(WORKLOADS))
@pytest.mark.parametrize("size", SIZES)
def test_every_workload_builds_deterministically(name: str, size: str) -> None:
    plan = plan_workload(name, size)  # type: ignore[arg-type]
    programs = plan.build(0)
    assert programs or plan.peer or plan.hot_path or plan.client_agents, (
        "only AIPerf, the hot path and client libraries send no programs of the harness"
    )
    assert [p.program_id for p in programs] == [p.program_id for p in plan.build(0)]
    assert plan.kv_cache_mib > 0 and plan.max_model_len >= 2048


def test_the_many_agent_quick_programs_stay_the_same() -> None:
    """Seed 0's programs, pinned: a change to a workload's plan or to its draws shows
    here (recorded runs compare programs by id across systems and rounds)."""
    programs = plan_workload("many-agent", "quick").build(0)
    drawn = [
        (p.program_id, p.agent_type, p.arrival_s, p.turns, p.tool_latencies_s, p.output_lines)
        for p in programs
        if isinstance(p, TraceProgram)
    ]
    assert len(drawn) == len(programs)
    expected = [
        ("trace-0-0000", "swe", 0.0, 4, [3.091, 0.238, 1.573, 1.227], [6, 7, 2, 7]),
        ("trace-0-0001", "swe", 3.721, 3, [8.797, 2.959, 0.952], [9, 4, 13]),
        ("trace-0-0002", "swe", 6.558, 4, [1.488, 0.04, 0.433, 1.073], [9, 6, 7, 8]),
        (
            "trace-0-0003",
            "assistant",
            7.65,
            5,
            [0.837, 0.543, 2.907, 3.557, 0.899],
            [2, 9, 5, 8, 10],
        ),
        (
            "trace-0-0004",
            "assistant",
            8.249,
            5,
            [0.66, 7.749, 7.328, 1.393, 0.767],
            [10, 6, 3, 6, 9],
        ),
        ("trace-0-0005", "swe", 9.681, 3, [0.132, 0.339, 0.026], [4, 7, 9]),
    ]
    for (name, kind, arrival, turns, latencies, lines), want in zip(drawn, expected, strict=True):
        assert (name, kind, turns, lines) == (want[0], want[1], want[3], want[5])
        assert arrival == pytest.approx(want[2], abs=5e-4)
        assert latencies == pytest.approx(want[4], abs=5e-4)
    assert (
        programs[2]
        .messages[-1]["content"]
        .startswith("Issue 0002: `router_0002.process()` fails when the input is ")
    )


def _arrival_rate(description: str) -> float:
    found = re.search(r"Poisson arrivals at ([0-9.]+)/s", description)
    assert found is not None, description
    return float(found[1])


@pytest.mark.parametrize("name", list(PROGRAM_COUNT_WORKLOADS))
@pytest.mark.parametrize("size", SIZES)
def test_programs_sets_the_count_over_the_sizes_arrival_window_and_budget(
    name: str, size: str
) -> None:
    plan = plan_workload(name, size)  # type: ignore[arg-type]
    assert plan.programs is not None
    count = 4 * plan.programs
    scaled = plan_workload(name, size, count)  # type: ignore[arg-type]
    assert scaled.programs == count and len(scaled.build(0)) == count
    assert (scaled.kv_cache_mib, scaled.max_model_len) == (plan.kv_cache_mib, plan.max_model_len)
    assert scaled.description.startswith(f"{count} agent programs")
    assert f"--programs {count}: {count} programs instead of the size's {plan.programs}" in (
        scaled.description
    )
    # Four times the programs arrive four times as fast: the same window.
    assert _arrival_rate(scaled.description) == pytest.approx(4 * _arrival_rate(plan.description))


@pytest.mark.parametrize("name", list(PROGRAM_COUNT_WORKLOADS))
@pytest.mark.parametrize("size", SIZES)
def test_the_sizes_own_count_draws_the_programs_drawn_without_the_option(
    name: str, size: str
) -> None:
    plan = plan_workload(name, size)  # type: ignore[arg-type]
    same = plan_workload(name, size, plan.programs)  # type: ignore[arg-type]
    assert same.description == plan.description
    assert [_program_fingerprint(p) for p in same.build(0)] == [
        _program_fingerprint(p) for p in plan.build(0)
    ]


def test_programs_scales_the_arrival_rate_with_the_count() -> None:
    assert programs_update(16, 0.2, 64) == {"programs": 64, "arrival_rate_per_s": 0.8}
    assert programs_update(6, 0.5, 3) == {"programs": 3, "arrival_rate_per_s": 0.25}
    assert programs_update(16, 0.2, 16) == programs_update(16, 0.2, None) == {}
    # The trace replay's default (24 at 0.3/s) runs the same traces at 16 and 32
    # programs as its earlier default (16 at 0.2/s) did.
    assert programs_update(24, 0.3, 16) == {"programs": 16, "arrival_rate_per_s": 0.2}
    assert programs_update(24, 0.3, 32) == programs_update(16, 0.2, 32)
    with pytest.raises(ValueError, match="at least 1"):
        plan_workload("trace-replay", "quick", 0)


@pytest.mark.parametrize("name", sorted(set(WORKLOADS) - set(PROGRAM_COUNT_WORKLOADS)))
def test_workloads_not_sized_by_programs_refuse_a_count(name: str) -> None:
    with pytest.raises(ValueError, match=f"--programs applies to .* not to '{name}'"):
        plan_workload(name, "quick", 8)


def test_unknown_workload_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        plan_workload("nope", "quick")


@pytest.fixture(scope="module")
def smollm2_chat() -> tuple[Any, str]:
    """SmolLM2's tokenizer and the tool chat template the servers use."""
    from transformers import AutoTokenizer

    from cluster.config import load_config
    from cluster.models import EMBEDDED_SCHEME, SMOLLM2, resolve_model

    config = load_config()
    tokenizer = AutoTokenizer.from_pretrained(
        resolve_model(EMBEDDED_SCHEME + SMOLLM2, config.cache_dir)
    )
    template_path = config.main.chat.resolved_chat_template()
    assert template_path is not None
    with open(template_path) as template_file:
        return tokenizer, template_file.read()


@pytest.mark.parametrize("name", ["many-agent", "bugfix-6", "coding-35"])
@pytest.mark.parametrize("size", SIZES)
def test_every_conversation_fits_the_planned_context(
    name: str, size: str, smollm2_chat: tuple[Any, str]
) -> None:
    """Each program played to its end with mid-size calls: the whole conversation in
    the real template and tokenizer, plus the largest token cap, fits max_model_len
    (it bounds every request of the program, since the conversation only grows)."""
    tokenizer, template = smollm2_chat
    plan = plan_workload(name, size)  # type: ignore[arg-type]
    arguments = json.dumps({"path": "src/module_0001.py", "line": 7, "text": "return x * 2"})
    longest = 0
    for program in plan.build(0):
        for latencies in ("tool_latencies_s", "latencies_s"):
            if hasattr(program, latencies):
                setattr(program, latencies, [0.0] * len(getattr(program, latencies)))
        largest_cap = 0
        while (request := program.next_request()) is not None:
            largest_cap = max(largest_cap, request.max_tokens)
            choice = request.tool_choice
            tool = choice["function"]["name"] if isinstance(choice, dict) else program.tools[0]
            if isinstance(tool, dict):
                tool = tool["function"]["name"]
            calls = (ToolCall("c", tool, arguments),) if request.expects_tool_call else ()
            asyncio.run(program.act(request, _reply(*calls, content=None if calls else "Done.")))
        rendered = tokenizer.apply_chat_template(
            program.messages, tools=program.tools, chat_template=template, tokenize=False
        )
        longest = max(longest, len(tokenizer(rendered)["input_ids"]) + largest_cap)
    assert 0 < longest <= plan.max_model_len, (longest, plan.max_model_len)


@pytest.mark.parametrize("size", SIZES)
def test_bfcl_speculation_conversations_fit_the_planned_context(
    size: str, smollm2_chat: tuple[Any, str]
) -> None:
    """Each program played to its end, every turn a call the server ran with a
    mid-size result and an answer at the token cap, fits max_model_len."""
    tokenizer, template = smollm2_chat
    plan = plan_workload("bfcl-speculation", size)  # type: ignore[arg-type]
    longest = 0
    for program in plan.build(0):
        while (request := program.next_request()) is not None:
            call = {"id": "s1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            executed = (
                {"role": "assistant", "content": "I will check.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "s1", "content": " ".join(map(str, range(200)))},
            )
            answer = replace(
                _reply(content="word " * request.max_tokens), executed_messages=executed
            )
            asyncio.run(program.act(request, answer))
        rendered = tokenizer.apply_chat_template(
            program.messages, tools=program.tools, chat_template=template, tokenize=False
        )
        longest = max(longest, len(tokenizer(rendered)["input_ids"]))
    assert 0 < longest <= plan.max_model_len, (longest, plan.max_model_len)


# --- speculation ---------------------------------------------------------------


def _records_program(latency_s: float = 0.01) -> RecordsProgram:
    config = RecordsTaskConfig(latencies_s=(latency_s,), programs_per_latency=1)
    (program,) = generate_speculation(config, 3)
    return program


def test_records_programs_declare_the_hosted_schema_of_their_latency() -> None:
    plan = plan_workload("speculation", "default")
    hosted = ToolRegistry.from_config(
        ToolsConfig.model_validate({"hosted": plan.toolserve_overrides["tools.hosted"]})
    ).openai_schemas()
    programs = plan.build(0)
    assert len(programs) == 32
    assert {program.agent_type for program in programs} == {
        "records-0.1s",
        "records-0.5s",
        "records-1s",
        "records-3s",
    }
    for program in programs:
        (tool,) = program.tools
        assert tool in hosted, "the server runs it only when declared with its own schema"
    assert plan.reference_system == "toolserve-no-speculation"


def test_a_records_task_the_server_answered_ends_after_one_request() -> None:
    program = _records_program()
    request = program.next_request()
    assert request is not None and request.tool_choice == "auto"
    assert request.structured_outputs is not None
    regex = re.compile(request.structured_outputs["regex"])
    ticket = program.messages[-1]["content"].split()[1]
    call = '<tool_call>\n{"name": "%s", "arguments": {"key": "%s"}}\n</tool_call>'
    tool_name = program.tools[0]["function"]["name"]
    # The shape is held; the key is the model's to write, the task's ticket or not.
    assert regex.fullmatch("I will look it up.\n" + call % (tool_name, ticket))
    assert regex.fullmatch("I will look it up.\n" + call % (tool_name, "INC-2041"))
    assert not regex.fullmatch(call % (tool_name, ticket)), "the plan sentence comes first"
    assert not regex.fullmatch("I will look it up.\n" + call % ("other_tool", ticket))
    executed = (
        {"role": "assistant", "content": None, "tool_calls": [{"id": "s1"}]},
        {"role": "tool", "tool_call_id": "s1", "content": "record"},
    )
    reply = replace(_reply(content="It is open."), executed_messages=executed)
    asyncio.run(program.act(request, reply))
    assert program.messages[-3:-1] == list(executed)
    assert program.next_request() is None


def test_a_records_task_handed_the_call_runs_it_then_answers_within_budget() -> None:
    program = _records_program()
    first = program.next_request()
    assert first is not None
    name = program.tools[0]["function"]["name"]
    call = ToolCall("c1", name, '{"key": "INC-2041"}')
    round_ = asyncio.run(program.act(first, _reply(call)))
    assert round_.calls == 1 and round_.unusable_calls == 0
    assert program.messages[-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": record_text("INC-2041"),
    }
    second = program.next_request()
    assert second is not None
    assert second.tool_choice == "none" and second.structured_outputs is None
    assert second.max_tokens == first.max_tokens - 20
    asyncio.run(program.act(second, _reply(content="Done.")))
    assert program.next_request() is None


def test_a_records_task_reuses_outcomes_the_client_already_has() -> None:
    program = _records_program(latency_s=30.0)
    request = program.next_request()
    assert request is not None
    call = ToolCall("c1", program.tools[0]["function"]["name"], '{"key": "INC-1"}')
    ready = {"c1": ToolOutcome("speculated", usable=True)}
    round_ = asyncio.run(program.act(request, _reply(call), ready))
    assert round_.latency_s < 5, "the 30 s lookup did not run again"
    assert program.messages[-1]["content"] == "speculated"


# --- conveyor (partial tool execution) -----------------------------------------


def _conveyor_programs() -> list[ConveyorProgram]:
    return generate_conveyor(
        ConveyorConfig(programs_per_task=1, turns=2, arrival_rate_per_s=0.5),
        seed=0,
        count_tokens=lambda text: len(text) // 3,
    )


def test_conveyor_programs_force_hosted_calls_whose_text_parses_back() -> None:
    programs = _conveyor_programs()
    assert sorted(p.agent_type for p in programs) == sorted(CONVEYOR_TASKS)
    hosted = conveyor_tool_schemas()
    for program in programs:
        assert program.tools == [hosted[program.tool]]
        request = program.next_request()
        assert request is not None and request.stream and request.tool_choice == "auto"
        assert request.structured_outputs is not None
        (text,) = request.structured_outputs["choice"]
        lead, body = text.removesuffix("\n</tool_call>").split("\n<tool_call>\n")
        assert lead and "<" not in lead, "content first: the structured output's branch"
        assert json.loads(body) == {"name": program.tool, "arguments": program.calls[0]}
        margin = 3.5 if program.agent_type == "validation" else 1.6
        call_budget = math.ceil(len(text) // 3 * margin)
        assert request.max_tokens == call_budget + program.answer_max_tokens


def test_the_codegen_script_counts_primes_and_draws_its_plot() -> None:
    output = conveyor_run("python", {"code": codegen_script(3, 20_000)})
    assert output.startswith("primes below 20000 : 2262\n")
    assert "sine plot of 3 periods:" in output


def test_a_conveyor_turn_the_server_ran_goes_on_to_the_next_turn() -> None:
    program = next(p for p in _conveyor_programs() if p.agent_type == "search")
    first = program.next_request()
    assert first is not None
    executed = (
        {"role": "assistant", "content": None, "tool_calls": [{"id": "s1"}]},
        {"role": "tool", "tool_call_id": "s1", "content": "hits"},
    )
    asyncio.run(program.act(first, replace(_reply(content="Found."), executed_messages=executed)))
    second = program.next_request()
    assert second is not None and second.structured_outputs is not None
    assert program.messages[-1]["content"] == "Task 2: use the search tool."


def test_a_conveyor_call_handed_to_the_agent_runs_then_answers_within_the_turns_budget() -> None:
    program = next(p for p in _conveyor_programs() if p.agent_type == "calculator")
    first = program.next_request()
    assert first is not None
    call = ToolCall("c1", "calculator", json.dumps(program.calls[0]))
    asyncio.run(program.act(first, _reply(call)))
    assert program.messages[-1]["content"] == calculate(program.calls[0]["expression"])
    answer = program.next_request()
    assert answer is not None and answer.structured_outputs is None and answer.stream
    assert answer.max_tokens == first.max_tokens - 20  # what the call's 20 tokens left
    asyncio.run(program.act(answer, _reply(content="It is 7.")))
    assert program.next_request() is not None  # the second turn


def test_a_validation_call_breaks_its_schema_first_then_writes_a_long_note() -> None:
    program = next(p for p in _conveyor_programs() if p.agent_type == "validation")
    assert program.tool == "calculator"
    (arguments, *_) = program.calls
    assert list(arguments) == ["expression", "note"], "the violating field comes first"
    assert isinstance(arguments["expression"], int)
    assert len(arguments["note"].split()) >= 40
    outcome = program.execute(ToolCall("c1", "calculator", json.dumps(arguments)))
    assert not outcome.usable, "the agent's tool rejects the call as the server's does"


def test_a_database_call_runs_a_read_only_query_whole() -> None:
    program = next(p for p in _conveyor_programs() if p.agent_type == "database")
    assert program.tool == "query_database"
    output = conveyor_run("query_database", program.calls[0])
    assert output.splitlines()[0] == "name | words"
    assert len(output.splitlines()) > 1


@pytest.mark.parametrize(
    "name", ["many-agent", "bugfix-6", "coding-35", "bfcl", "codegen", "trace-replay"]
)
def test_agent_workloads_sample_their_turns(name: str) -> None:
    """Sampled, not greedy, so the model does not write the same call turn after turn."""
    programs = plan_workload(name, "quick").build(0)  # type: ignore[arg-type]
    assert programs and {program.temperature for program in programs} == {AGENT_TEMPERATURE}
