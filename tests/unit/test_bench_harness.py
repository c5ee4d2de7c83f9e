"""The benchmark harness: equal baselines, isolated ablations, engine work from
vLLM's counters, CPU seconds and provenance."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.baselines.vllm_router import router_command
from bench.cpu import ProcessTreeCpu
from bench.metrics import engine_counters, engine_work, front_end_work, retention_work
from bench.options import BenchOptions, parse_system
from bench.provenance import DirtyTreeError, code_state, note_code_state, start_provenance
from bench.runner import arm_setup, check_nodes_run
from bench.summary import comparison_pairs
from bench.systems import (
    ABLATIONS,
    BASELINE_SYSTEMS,
    DELIBERATE_DIFFERENCES,
    NODES_READY_LINE,
    ROUTER_READY_LINE,
    bound_core_count,
    engine_settings,
    expand_system_names,
    ladder_systems,
    replica_environment,
    system_catalog,
    toolserve_config,
)
from cluster.config import DEFAULT_CONFIG_PATH, ToolserveConfig, load_config
from cluster.node_layout import DEFAULT_NODES, head_node, model_nodes
from deployments.engine.pinning.settings import EnginePinningSettings
from deployments.engine.setup import engine_arguments, engine_environment, scheduler_class


def _settings():  # type: ignore[no-untyped-def]
    config = load_config(DEFAULT_CONFIG_PATH)
    return engine_settings(config, 256 * 2**20, 4096)


def test_every_baseline_starts_with_the_same_process_environment(tmp_path: Path) -> None:
    raw = load_config(DEFAULT_CONFIG_PATH).model_dump(mode="json")
    environments = {}
    session_nices = set()
    for name in BASELINE_SYSTEMS:
        arm = arm_setup(name, raw, 256, 4096)
        plan = arm.spec.plan(arm.settings, arm.raw_config, tmp_path, name)
        environments[name] = plan.environment
        session_nices.add(plan.session_nice)
    assert len({tuple(sorted(env.items())) for env in environments.values()}) == 1
    assert session_nices == {load_config(DEFAULT_CONFIG_PATH).ray.session_nice}
    environment = environments["stock-vllm"]
    settings = _settings()
    assert environment["RAY_worker_niceness"] == "0"
    assert environment["VLLM_CPU_OMP_THREADS_BIND"] == settings.cpu_threads_bind
    assert environment["OMP_NUM_THREADS"] == str(bound_core_count(settings.cpu_threads_bind))
    assert environment["NUMBA_THREADING_LAYER"] == "workqueue"
    replica_capacity = load_config(DEFAULT_CONFIG_PATH).main.cpu_primitive_cache_capacity
    assert environment["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(replica_capacity)


def _stock_server_arguments(command: list[str]) -> dict[str, Any]:
    """vLLM's engine and front-end arguments as its server reads them off a command."""
    flags = command[command.index("vllm.entrypoints.openai.api_server") + 1 :]
    arguments: dict[str, Any] = {}
    index = 0
    while index < len(flags):
        name = flags[index].removeprefix("--").replace("-", "_")
        has_value = index + 1 < len(flags) and not flags[index + 1].startswith("--")
        if has_value:
            value = flags[index + 1]
            arguments[name] = json.loads(value) if value.startswith("{") else value
            index += 2
        elif name.startswith("no_"):
            arguments[name.removeprefix("no_")] = False
            index += 1
        else:
            arguments[name] = True
            index += 1
    for name in ("host", "port"):
        arguments.pop(name)
    return arguments


def _toolserve_engine(tmp_path: Path, system: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The arguments and environment toolserve's main engine starts with, assembled
    by the functions its replica uses."""
    raw = load_config(DEFAULT_CONFIG_PATH).model_dump(mode="json")
    arm = arm_setup(system, raw, 256, 4096)
    plan = arm.spec.plan(arm.settings, arm.raw_config, tmp_path, system)
    assert plan.toolserve_config is not None
    config = ToolserveConfig.model_validate(plan.toolserve_config)
    main = config.main
    pinning = EnginePinningSettings(**main.pinning.model_dump(), replica_id="main-0")
    served_names = config.names_served_by_main
    engine_kwargs = main.engine.engine_kwargs(arm.settings.model_path, served_names)
    arguments = engine_arguments(engine_kwargs, pinning, main.prompt_lookup, main.admission)
    arguments |= main.chat.frontend_kwargs()
    scheduler = scheduler_class(
        pinning_on=main.pinning.enabled,
        gated=main.prompt_lookup.enabled,
        admitting=main.admission.enabled,
        asynchronous=False,
    )
    if scheduler is not None:
        arguments["scheduler_cls"] = scheduler
    environment = (
        plan.environment
        | engine_environment(main.prompt_lookup)
        | {"VLLM_CPU_OMP_THREADS_BIND": main.cpu_binding(0)}
    )
    return arguments, environment


def _stock_engine(tmp_path: Path, system: str) -> tuple[dict[str, Any], dict[str, str]]:
    raw = load_config(DEFAULT_CONFIG_PATH).model_dump(mode="json")
    arm = arm_setup(system, raw, 256, 4096)
    plan = arm.spec.plan(arm.settings, arm.raw_config, tmp_path, system)
    return _stock_server_arguments(plan.command), plan.environment


def _differing(first: dict[str, Any], second: dict[str, Any]) -> set[str]:
    def comparable(value: Any) -> Any:
        return value if isinstance(value, bool | dict | list | type(None)) else str(value)

    return {
        name
        for name in first.keys() | second.keys()
        if comparable(first.get(name)) != comparable(second.get(name))
    }


def test_toolserve_engine_and_stock_vllm_differ_only_where_named(tmp_path: Path) -> None:
    toolserve_arguments, toolserve_environment = _toolserve_engine(tmp_path, "toolserve")
    stock_arguments, stock_environment = _stock_engine(tmp_path, "stock-vllm")
    assert _differing(toolserve_arguments, stock_arguments) == set(DELIBERATE_DIFFERENCES)
    assert stock_arguments["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }
    assert stock_environment == toolserve_environment
    assert "scheduling_policy" not in stock_arguments
    assert toolserve_arguments["scheduling_policy"] == "priority"


def test_the_plain_stock_arm_differs_from_the_strong_one_by_the_drafts(tmp_path: Path) -> None:
    strong_arguments, strong_environment = _stock_engine(tmp_path, "stock-vllm")
    plain_arguments, plain_environment = _stock_engine(tmp_path, "stock-vllm-plain")
    assert _differing(strong_arguments, plain_arguments) == {
        "speculative_config",
        "async_scheduling",
    }
    assert strong_environment.keys() - plain_environment.keys() == {"NUMBA_THREADING_LAYER"}


def test_any_engine_argument_reaches_both_arms(tmp_path: Path) -> None:
    setting = "@main.engine.extra_engine_args.long_prefill_token_threshold=512"
    toolserve_arguments, _ = _toolserve_engine(tmp_path, "toolserve" + setting)
    stock_arguments, _ = _stock_engine(tmp_path, "stock-vllm" + setting)
    assert toolserve_arguments["long_prefill_token_threshold"] == 512
    assert stock_arguments["long_prefill_token_threshold"] == "512"
    assert _differing(toolserve_arguments, stock_arguments) == set(DELIBERATE_DIFFERENCES)


def test_each_ablation_turns_off_one_mechanism_and_keeps_the_other() -> None:
    base = load_config(DEFAULT_CONFIG_PATH).model_dump(mode="json")
    settings = _settings()
    catalog = system_catalog()

    def pinning(name: str) -> tuple[str, bool, float, float | None]:
        raw = toolserve_config(settings, base, catalog[name].overrides, 1, 2)
        config = ToolserveConfig.model_validate(raw).main.pinning
        return config.mode, config.program_fcfs, config.fixed_ttl_s, config.program_admission_share

    assert pinning("toolserve") == ("cost_model", True, 2.0, 0.5)
    assert pinning("toolserve-no-pinning")[:2] == ("off", True)
    assert pinning("toolserve-no-fcfs")[:2] == ("cost_model", False)
    assert pinning("toolserve-no-program-admission") == ("cost_model", True, 2.0, None)
    assert pinning("toolserve-fixed-ttl") == ("fixed", True, 2.0, 0.5)

    def engine_mechanisms(name: str) -> tuple[bool, bool, bool]:
        raw = toolserve_config(settings, base, catalog[name].overrides, 1, 2)
        config = ToolserveConfig.model_validate(raw)
        return (
            config.server.response_cache.enabled,
            config.main.prompt_lookup.enabled,
            config.main.chat.tokenize_cache.enabled,
        )

    assert engine_mechanisms("toolserve") == (True, True, True)
    assert engine_mechanisms("toolserve-no-response-cache") == (False, True, True)
    assert engine_mechanisms("toolserve-no-prompt-lookup") == (True, False, True)
    assert engine_mechanisms("toolserve-no-tokenize-cache") == (True, True, False)
    assert pinning("toolserve-no-prompt-lookup") == pinning("toolserve")
    assert pinning("toolserve-no-tokenize-cache") == pinning("toolserve")
    assert {f"toolserve-no-{name}" for name in ABLATIONS} == {
        "toolserve-no-pinning",
        "toolserve-no-fcfs",
        "toolserve-no-program-admission",
        "toolserve-no-response-cache",
        "toolserve-no-prompt-lookup",
        "toolserve-no-tokenize-cache",
    }


@pytest.mark.parametrize(
    ("binding", "cores"),
    [("0-1", 2), ("0", 1), ("0,2", 2), ("0-3|4-7", 8), ("auto", os.cpu_count() or 1)],
)
def test_bound_core_count(binding: str, cores: int) -> None:
    assert bound_core_count(binding) == cores


STOCK_BEFORE = """\
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 60.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 40.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 10.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
"""
STOCK_AFTER = STOCK_BEFORE.replace("100.0", "1100.0").replace("60.0", "460.0")
STOCK_AFTER = STOCK_AFTER.replace("40.0", "640.0").replace("10.0", "210.0").replace(" 1.0", " 4.0")
STOCK_AFTER += """\
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 80.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0
"""
# Ray's agent: one series per replica, and per-request histograms whose names must
# not be mistaken for the counters.
RAY_AFTER = """\
# TYPE ray_vllm_prompt_tokens_total counter
ray_vllm_prompt_tokens_total{ReplicaId="a",engine="0"} 700.0
ray_vllm_prompt_tokens_total{ReplicaId="b",engine="0"} 300.0
# TYPE ray_vllm_request_prompt_tokens histogram
ray_vllm_request_prompt_tokens_sum{ReplicaId="a",engine="0"} 99999.0
ray_vllm_request_prompt_tokens_count{ReplicaId="a",engine="0"} 9.0
# TYPE ray_vllm_num_preemptions_total counter
ray_vllm_num_preemptions_total{ReplicaId="a",engine="0"} 2.0
"""


def test_engine_work_is_the_difference_of_vllms_counters() -> None:
    assert engine_work(STOCK_BEFORE, STOCK_AFTER) == {
        "prompt_tokens": 1000.0,
        "prompt_tokens_computed": 400.0,
        "prompt_tokens_from_cache": 600.0,
        "generation_tokens": 200.0,
        "preemptions": 3.0,
        "draft_tokens": 80.0,
        "accepted_draft_tokens": 30.0,
    }


def test_ray_exported_counters_sum_over_replicas_and_skip_histograms() -> None:
    assert engine_counters(RAY_AFTER) == {"prompt_tokens": 1000.0, "preemptions": 2.0}
    work = engine_work("", RAY_AFTER)
    assert work["prompt_tokens"] == 1000.0 and work["generation_tokens"] == 0.0
    assert engine_work("", "") == dict.fromkeys(work)


TOOLSERVE_FRONT_END_BEFORE = """\
# TYPE ray_toolserve_prompt_cpu_seconds_total counter
ray_toolserve_prompt_cpu_seconds_total{ReplicaId="a",stage="render"} 1.0
ray_toolserve_prompt_cpu_seconds_total{ReplicaId="a",stage="tokenize"} 2.0
# TYPE ray_toolserve_prompts_prepared_total counter
ray_toolserve_prompts_prepared_total{ReplicaId="a",stage="render"} 10.0
ray_toolserve_prompts_prepared_total{ReplicaId="a",stage="tokenize"} 10.0
"""
TOOLSERVE_FRONT_END_AFTER = """\
# TYPE ray_toolserve_prompt_cpu_seconds_total counter
ray_toolserve_prompt_cpu_seconds_total{ReplicaId="a",stage="render"} 1.5
ray_toolserve_prompt_cpu_seconds_total{ReplicaId="a",stage="tokenize"} 2.25
ray_toolserve_prompt_cpu_seconds_total{ReplicaId="b",stage="tokenize"} 0.25
# TYPE ray_toolserve_prompts_prepared_total counter
ray_toolserve_prompts_prepared_total{ReplicaId="a",stage="render"} 110.0
ray_toolserve_prompts_prepared_total{ReplicaId="a",stage="tokenize"} 110.0
# TYPE ray_toolserve_tokenize_cache_tokens_total counter
ray_toolserve_tokenize_cache_tokens_total{ReplicaId="a",source="cached"} 900.0
ray_toolserve_tokenize_cache_tokens_total{ReplicaId="a",source="tokenized"} 100.0
"""


def test_front_end_work_is_cpu_per_prompt_between_the_scrapes() -> None:
    work = front_end_work(TOOLSERVE_FRONT_END_BEFORE, TOOLSERVE_FRONT_END_AFTER)
    assert work["render_cpu_ms_per_prompt"] == pytest.approx(5.0)
    assert work["tokenize_cpu_ms_per_prompt"] == pytest.approx(5.0)
    assert work["tokenize_cache_token_share"] == pytest.approx(0.9)
    assert set(front_end_work(STOCK_BEFORE, STOCK_AFTER).values()) == {None}


def test_retention_work_is_the_pinned_token_seconds_between_the_scrapes() -> None:
    before = (
        "# TYPE ray_toolserve_kv_pinned_token_seconds_total counter\n"
        'ray_toolserve_kv_pinned_token_seconds_total{ReplicaId="a",outcome="used"} 100.0\n'
    )
    after = (
        "# TYPE ray_toolserve_kv_pinned_token_seconds_total counter\n"
        'ray_toolserve_kv_pinned_token_seconds_total{ReplicaId="a",outcome="used"} 400.0\n'
        'ray_toolserve_kv_pinned_token_seconds_total{ReplicaId="b",outcome="used"} 50.0\n'
        'ray_toolserve_kv_pinned_token_seconds_total{ReplicaId="a",outcome="wasted"} 70.0\n'
    )
    assert retention_work(before, after) == {
        "pinned_token_s_used": 350.0,
        "pinned_token_s_wasted": 70.0,
    }
    assert set(retention_work(STOCK_BEFORE, STOCK_AFTER).values()) == {None}


def test_cpu_of_a_process_tree_counts_its_children() -> None:
    spinner = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass"
    parent = subprocess.Popen(
        [
            "python3",
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spinner!r}])",
        ]
    )
    try:
        sampler = ProcessTreeCpu(parent.pid, interval_s=0.05)
        sampler.start()
        parent.wait(timeout=30)
        use = sampler.stop()
    finally:
        parent.kill()
    assert use.total_s >= 0.4
    assert use.engine_s == 0.0
    assert max(use.by_process_name.values()) >= 0.4


def test_vllm_engine_processes_are_told_apart_by_their_titles() -> None:
    titled = "import setproctitle, time; setproctitle.setproctitle('VLLM::Worker')"
    spin = "end = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    # The worker stays alive after its work, so the last sample sees all of it
    # however late a loaded machine schedules the sampler.
    done = "print('spun', flush=True)\ntime.sleep(60)"
    worker = subprocess.Popen(
        [sys.executable, "-c", "\n".join((titled, spin, done))], stdout=subprocess.PIPE, text=True
    )
    try:
        sampler = ProcessTreeCpu(worker.pid, interval_s=0.05)
        sampler.start()
        assert worker.stdout is not None and worker.stdout.readline().strip() == "spun"
        use = sampler.stop()
    finally:
        worker.kill()
        worker.wait(timeout=30)
    assert use.engine_s >= 0.3 and use.by_process_name.get("VLLM::Worker", 0) >= 0.3


def test_a_spawned_engine_process_counts_before_it_takes_its_title(tmp_path: Path) -> None:
    """vLLM starts its engine processes with multiprocessing's spawn; they title
    themselves only once running."""
    script = (
        "import multiprocessing, time\n"
        "def spin():\n"
        "    end = time.process_time() + 0.5\n"
        "    while time.process_time() < end: pass\n"
        "    print('spun', flush=True)\n"
        "    time.sleep(60)\n"
        "if __name__ == '__main__':\n"
        "    multiprocessing.set_start_method('spawn')\n"
        "    child = multiprocessing.Process(target=spin)\n"
        "    child.start()\n"
        "    child.join()\n"
    )
    main = tmp_path / "engine.py"  # spawn imports the parent's main module by path
    main.write_text(script)
    parent = subprocess.Popen([sys.executable, str(main)], stdout=subprocess.PIPE, text=True)
    try:
        sampler = ProcessTreeCpu(parent.pid, interval_s=0.05)
        sampler.start()
        assert parent.stdout is not None and parent.stdout.readline().strip() == "spun"
        use = sampler.stop()
    finally:
        for process in psutil.Process(parent.pid).children(recursive=True):
            process.kill()
        parent.kill()
        parent.wait(timeout=30)
    assert use.engine_s >= 0.3


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "commit", "-qm", "one")
    return tmp_path


def test_a_clean_tree_is_recorded_with_its_commit(repo: Path) -> None:
    results = repo / "bench" / "results"
    (results / "earlier-run").mkdir(parents=True)
    (results / "earlier-run" / "summary.json").write_text("{}")
    provenance = start_provenance(["toolserve", "bench", "--name", "a b"], repo, results, False)
    assert not provenance.dirty and len(provenance.commit or "") == 40
    assert provenance.command == "toolserve bench --name 'a b'"
    assert provenance.packages["toolserve"] is not None
    assert provenance.machine["cores"] == os.cpu_count()
    assert provenance.started_utc.endswith("Z")


def test_a_dirty_tree_is_refused_unless_allowed(repo: Path) -> None:
    results = repo / "bench" / "results"
    (repo / "code.py").write_text("x = 2\n")
    (repo / "new.py").write_text("")
    with pytest.raises(DirtyTreeError, match="--allow-dirty"):
        start_provenance(["toolserve"], repo, results, False)
    provenance = start_provenance(["toolserve"], repo, results, True)
    assert provenance.dirty and provenance.allow_dirty
    assert sorted(provenance.dirty_paths) == ["code.py", "new.py"]


def test_a_commit_during_the_run_is_noted(repo: Path) -> None:
    results = repo / "bench" / "results"
    provenance = start_provenance(["toolserve"], repo, results, False)
    assert note_code_state(provenance, repo, results)
    time.sleep(0.01)
    (repo / "code.py").write_text("x = 3\n")
    _git(repo, "commit", "-qam", "two")
    assert not note_code_state(provenance, repo, results)
    assert provenance.code_changed_during_run
    assert code_state(repo).commit != provenance.commit


def test_a_system_can_carry_settings_of_its_own() -> None:
    assert parse_system("stock-vllm") == ("stock-vllm", {})
    assert parse_system("stock-vllm@main.cpu_threads_bind=0") == (
        "stock-vllm",
        {"main.cpu_threads_bind": 0},
    )
    assert parse_system('toolserve@main.cpu_threads_bind="0"@main.pinning.max_ttl_s=5') == (
        "toolserve",
        {"main.cpu_threads_bind": "0", "main.pinning.max_ttl_s": 5},
    )
    with pytest.raises(ValueError, match="NAME@PATH=VALUE"):
        parse_system("stock-vllm@nonsense")


def test_an_arm_with_its_own_thread_setting_gets_its_own_environment(tmp_path: Path) -> None:
    raw = load_config(DEFAULT_CONFIG_PATH).model_dump(mode="json")
    one = arm_setup('stock-vllm@main.cpu_threads_bind="0"', raw, 256, 4096)
    both = arm_setup("stock-vllm", raw, 256, 4096)
    assert one.settings.process_environment()["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert one.settings.process_environment()["OMP_NUM_THREADS"] == "1"
    assert both.settings.process_environment()["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert one.settings.kv_cache_memory_bytes == both.settings.kv_cache_memory_bytes
    command = one.spec.plan(one.settings, one.raw_config, tmp_path, "one").command
    assert "--model" in command and one.spec.name == "stock-vllm"


def test_thread_variants_of_one_system_are_compared_with_each_other() -> None:
    labels = [
        f"{system}@main.cpu_threads_bind={cores}"
        for system in ("stock-vllm", "toolserve")
        for cores in ("0-1", "0")
    ]
    pairs = comparison_pairs(labels)
    assert (labels[2], labels[3]) in pairs
    assert (labels[0], labels[1]) in pairs and (labels[0], labels[2]) in pairs
    assert len(pairs) == len(set(pairs)) == 4


def test_each_ladder_rung_adds_one_mechanism_and_the_last_plus_caches_is_toolserve() -> None:
    base = load_config(DEFAULT_CONFIG_PATH).model_dump(mode="json")
    settings = _settings()
    catalog = system_catalog()

    def config(name: str) -> ToolserveConfig:
        return ToolserveConfig.model_validate(
            toolserve_config(settings, base, catalog[name].overrides, 1, 2)
        )

    def mechanisms(name: str) -> dict[str, Any]:
        main = config(name).main
        gate = main.prompt_lookup
        return {
            "gate": (
                gate.prose_floor,
                gate.max_decoders,
                gate.min_prose_acceptance,
                gate.predicted_calls,
            ),
            "fcfs": main.pinning.program_fcfs,
            "pinning": main.pinning.mode,
            "admission": main.admission.enabled,
            "program admission": main.pinning.program_admission_share,
            "caches": (
                config(name).server.response_cache.enabled,
                main.chat.tokenize_cache.enabled,
            ),
        }

    rungs = list(ladder_systems())
    assert rungs[0] == "toolserve-bare" and rungs[-1].endswith("+program-admission")
    bare = mechanisms(rungs[0])
    assert bare == {
        "gate": (4, None, 0.0, False),
        "fcfs": False,
        "pinning": "off",
        "admission": False,
        "program admission": None,
        "caches": (False, False),
    }
    changed = [
        {key for key in bare if mechanisms(lower)[key] != mechanisms(upper)[key]}
        for lower, upper in itertools.pairwise(rungs)
    ]
    assert changed == [{"gate"}, {"fcfs"}, {"pinning"}, {"pinning"}, {"program admission"}]
    assert mechanisms(rungs[-1]) | {"caches": (True, True)} == mechanisms("toolserve")
    assert mechanisms("toolserve-admission") == mechanisms("toolserve") | {"admission": True}
    assert all(config(rung).main.prompt_lookup.enabled for rung in rungs)
    assert expand_system_names(["ladder", "stock-vllm-plain"]) == [
        "stock-vllm",
        *rungs,
        "toolserve",
        "stock-vllm-plain",
    ]


def test_the_router_arm_starts_one_bound_server_per_replica_behind_vllm_router(
    tmp_path: Path,
) -> None:
    raw = load_config(DEFAULT_CONFIG_PATH).model_dump(mode="json")
    two_replicas = (
        "@main.num_replicas=2@main_placement=own_replicas"
        '@main.cpu_threads_bind_by_local_rank=["0","1"]'
    )
    for system, scheduling in (
        ("stock-vllm-router", False),
        ("stock-vllm-router-programs", True),
    ):
        arm = arm_setup(system + two_replicas, raw, 256, 4096)
        plan = arm.spec.plan(arm.settings, arm.raw_config, tmp_path, system)
        command = plan.command
        assert command[command.index("-m") + 1] == "bench.baselines.vllm_router"
        assert command[command.index("--bindings") + 1 :][:2] == ["0", "1"]
        assert ("--program-scheduling" in command) == scheduling
        assert plan.ready_line == ROUTER_READY_LINE
    replica = replica_environment(arm.settings, "1")
    assert replica["VLLM_CPU_OMP_THREADS_BIND"] == "1" and replica["OMP_NUM_THREADS"] == "1"
    assert replica["NUMBA_THREADING_LAYER"] == "workqueue"
    router = router_command(["http://a:1", "http://b:2"], 30, 31, program_scheduling=True)
    assert router[router.index("--policy") + 1] == "consistent_hash"
    assert router[router.index("--worker-urls") + 1 :][:2] == ["http://a:1", "http://b:2"]
    assert "--enable-program-scheduling" in router


def _nodes_arm(system: str) -> Any:
    raw = load_config("multinode-cpu.yaml").model_dump(mode="json")
    return arm_setup(system, raw, 256, 4096)


def test_on_the_nodes_toolserve_starts_with_nodes_up_and_is_read_on_every_node(
    tmp_path: Path,
) -> None:
    arm = _nodes_arm("toolserve")
    plan = arm.spec.plan(arm.settings, arm.raw_config, tmp_path, "ts", on_nodes=True)
    command = plan.command
    assert command[command.index("cluster.launch.cli") + 1 :][:3] == ["nodes", "up", "--config"]
    assert plan.ready_line == NODES_READY_LINE
    assert plan.endpoint.base_url.startswith(f"http://{head_node().address}:")
    assert plan.endpoint.metrics_urls == tuple(node.metrics_url for node in DEFAULT_NODES)
    assert plan.toolserve_config is not None
    # `nodes up` refuses a profile that names another cluster: this one is its own.
    assert plan.toolserve_config["ray"]["address"] == "10.77.0.2:6379"
    assert plan.toolserve_config["redis"]["url"].startswith("redis://10.77.0.9:6379/")


def test_on_the_nodes_the_router_arm_puts_a_replica_on_each_model_node(tmp_path: Path) -> None:
    arm = _nodes_arm("stock-vllm-router-programs")
    plan = arm.spec.plan(arm.settings, arm.raw_config, tmp_path, "stock", on_nodes=True)
    command = plan.command
    assert command[command.index("-m") + 1] == "bench.baselines.vllm_router"
    assert "--on-nodes" in command and "--program-scheduling" in command
    # The profile's two replicas, one per model node; both engines use both cores.
    assert command[command.index("--bindings") + 1 :][:2] == ["nobind", "nobind"]
    assert len(model_nodes()) == 2
    assert plan.endpoint.base_url.startswith(f"http://{head_node().address}:")
    router = router_command(["http://a:1"], 30, 31, False, host=head_node().address)
    assert router[router.index("--host") + 1] == head_node().address


def test_systems_that_run_on_one_host_are_refused_on_the_nodes(tmp_path: Path) -> None:
    for system in ("stock-vllm", "stock-ray-serve-llm"):
        arm = _nodes_arm(system)
        with pytest.raises(ValueError, match="runs on one host only"):
            arm.spec.plan(arm.settings, arm.raw_config, tmp_path, system, on_nodes=True)
    options = BenchOptions(
        workload="many-agent",
        size="quick",
        systems=["toolserve", "stock-vllm"],
        seed=0,
        repeats=1,
        config_path=Path("configs/multinode-cpu.yaml"),
        output_dir=tmp_path,
        run_name="refused",
        argv=[],
        nodes=True,
    )
    with pytest.raises(ValueError, match="stock-vllm run on one host only"):
        check_nodes_run(options, list(options.systems))
    check_nodes_run(options, ["toolserve", "toolserve-no-pinning", "stock-vllm-router"])
    with pytest.raises(ValueError, match="--dashboards"):
        check_nodes_run(replace(options, dashboards=True), ["toolserve"])


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of its own needs root")
def test_cpu_on_the_nodes_counts_processes_in_other_network_namespaces() -> None:
    """A node's daemons are no launcher's children: the sampler finds them by
    their network namespace."""
    spinner = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass"
    spin_then_wait = f"{spinner}\nprint('spun', flush=True)\ntime.sleep(60)"
    launcher = subprocess.Popen(["sleep", "60"])
    in_a_namespace = ["unshare", "--net", sys.executable, "-c", spin_then_wait]
    elsewhere = subprocess.Popen(in_a_namespace, stdout=subprocess.PIPE, text=True)
    try:
        counting = ProcessTreeCpu(launcher.pid, interval_s=0.05, other_network_namespaces=True)
        tree_only = ProcessTreeCpu(launcher.pid, interval_s=0.05)
        counting.start()
        tree_only.start()
        assert elsewhere.stdout is not None and elsewhere.stdout.readline().strip() == "spun"
        assert counting.stop().total_s >= 0.3
        assert tree_only.stop().total_s < 0.1
    finally:
        launcher.kill()
        elsewhere.kill()


def test_only_systems_whose_metrics_ray_reports_are_waited_for_before_a_scrape() -> None:
    catalog = system_catalog()
    for name in ("toolserve", "toolserve-no-pinning", "stock-ray-serve-llm"):
        assert catalog[name].metrics_lag_s > 10, name  # Ray reports every 10 s
    for name in ("stock-vllm", "stock-vllm-plain", "stock-vllm-router"):
        assert catalog[name].metrics_lag_s == 0, name
