from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from cluster.config import (
    CONFIGS_DIR,
    ConfigError,
    EngineConfig,
    ModelDeploymentConfig,
    PinningConfig,
    ToolserveConfig,
    load_config,
)

PROFILES = sorted(CONFIGS_DIR.glob("*.yaml"))


def _engine(**overrides: object) -> EngineConfig:
    return EngineConfig.model_validate({"model": "m", "served_model_name": "m"} | overrides)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda path: path.name)
def test_every_shipped_profile_validates(profile: Path) -> None:
    config = load_config(profile)
    assert config.main.engine.served_model_name


def test_there_is_a_gpu_profile() -> None:
    assert any(load_config(profile).main.num_gpus >= 1 for profile in PROFILES)


def test_embedded_default_matches_the_cpu_recipe() -> None:
    config = load_config()
    engine = config.main.engine
    assert engine.model == "embedded:smollm2-135m-instruct"
    assert engine.dtype == "float32"
    assert engine.enforce_eager
    assert engine.enable_prefix_caching
    assert engine.block_size in (32, 64)
    assert engine.kv_cache_memory_bytes
    assert config.draft is not None
    assert config.main.chat.resolved_chat_template() is not None
    assert Path(str(config.main.chat.resolved_chat_template())).exists()


def test_engine_kwargs_pass_extra_arguments_through() -> None:
    engine = _engine(extra_engine_args={"scheduling_policy": "priority"}, kv_cache_memory_bytes=1)
    kwargs = engine.engine_kwargs("/models/m")
    assert kwargs["model"] == "/models/m"
    assert kwargs["served_model_name"] == ["m"]
    assert kwargs["scheduling_policy"] == "priority"
    assert kwargs["kv_cache_memory_bytes"] == 1
    assert "gpu_memory_utilization" not in kwargs


def test_extra_engine_args_may_not_shadow_typed_fields() -> None:
    with pytest.raises(ValidationError, match="block_size"):
        _engine(extra_engine_args={"block_size": 16})


def test_block_size_must_be_a_multiple_of_16() -> None:
    with pytest.raises(ValidationError, match="multiple of 16"):
        _engine(block_size=40)


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(ValidationError, match="blok_size"):
        _engine(blok_size=64)


def test_main_and_draft_need_distinct_names() -> None:
    deployment = ModelDeploymentConfig(engine=_engine())
    with pytest.raises(ValidationError, match="different served_model_name"):
        ToolserveConfig(name="x", main=deployment, draft=deployment)


def test_a_draft_on_the_main_replicas_is_served_under_its_name_by_the_main_engine() -> None:
    main = ModelDeploymentConfig(engine=_engine())
    draft = ModelDeploymentConfig(engine=_engine(served_model_name="draft"))
    own = ToolserveConfig(name="x", main=main, draft=draft)
    assert own.draft_replicas is draft
    assert own.names_served_by_main == [main.engine.served_model_name]
    shared = ToolserveConfig(name="x", main=main, draft=draft, draft_placement="main_replicas")
    assert shared.draft_replicas is None
    assert shared.names_served_by_main == [main.engine.served_model_name, "draft"]
    assert shared.main.engine.engine_kwargs("/m", shared.names_served_by_main)[
        "served_model_name"
    ] == [main.engine.served_model_name, "draft"]


def test_only_the_main_model_can_be_drafted_on_the_main_replicas() -> None:
    main = ModelDeploymentConfig(engine=_engine())
    other = ModelDeploymentConfig(engine=_engine(served_model_name="draft", model="other/model"))
    with pytest.raises(ValidationError, match="main model"):
        ToolserveConfig(name="x", main=main, draft=other, draft_placement="main_replicas")
    with pytest.raises(ValidationError, match="main model"):
        ToolserveConfig(name="x", main=main, draft_placement="main_replicas")


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no configuration file"):
        load_config(tmp_path / "absent.yaml")


def test_invalid_yaml_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("main: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_invalid_values_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: x\nmain: {engine: {model: m, served_model_name: m, max_model_len: -1}}\n"
    )
    with pytest.raises(ConfigError, match=r"(?s)bad\.yaml.*max_model_len"):
        load_config(path)


def _models(root: type[BaseModel]) -> set[type[BaseModel]]:
    found = {root}
    for field in root.model_fields.values():
        for candidate in (field.annotation, *getattr(field.annotation, "__args__", ())):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                found |= _models(candidate)
    return found


@pytest.mark.parametrize("model", sorted(_models(ToolserveConfig), key=lambda m: m.__name__))
def test_every_field_is_described(model: type[BaseModel]) -> None:
    undocumented = [name for name, field in model.model_fields.items() if not field.description]
    assert not undocumented


def test_pinning_owns_the_scheduler_arguments() -> None:
    engine = _engine(extra_engine_args={"scheduling_policy": "priority"})
    with pytest.raises(ValidationError, match="pinning, prompt lookup and admission set"):
        ModelDeploymentConfig(engine=engine)
    off = ModelDeploymentConfig.model_validate(
        {"engine": engine, "pinning": {"mode": "off", "program_fcfs": False}}
    )
    assert not off.pinning.enabled


def test_embedded_default_pins_on_the_main_model_only() -> None:
    config = load_config()
    assert config.main.pinning.mode == "cost_model" and config.main.pinning.program_fcfs
    assert config.main.pinning.admission_share == 0.5
    assert config.draft is not None and not config.draft.pinning.enabled
    assert config.draft.pinning.admission_share is None


def test_program_admission_applies_with_program_fcfs() -> None:
    assert PinningConfig(program_fcfs=False, program_admission_share=0.5).admission_share is None
    assert PinningConfig(program_admission_share=None).admission_share is None
    assert PinningConfig(program_admission_share=1.5).admission_share == 1.5


def test_replicas_bind_cores_by_their_node_local_rank() -> None:
    main = load_config().main
    assert main.cpu_binding(0) == main.cpu_binding(3) == main.cpu_threads_bind
    split = main.model_copy(update={"cpu_threads_bind_by_local_rank": ["0", "1"]})
    assert [split.cpu_binding(rank) for rank in range(3)] == ["0", "1", "0"]


def test_direct_ingress_needs_a_local_ray_instance() -> None:
    main = ModelDeploymentConfig(engine=_engine())
    assert ToolserveConfig(name="x", main=main).server.ingress == "direct"
    with pytest.raises(ValidationError, match=r"server\.ingress: proxy"):
        ToolserveConfig(name="x", main=main, ray={"address": "auto"})
    joined = ToolserveConfig(
        name="x", main=main, ray={"address": "auto"}, server={"ingress": "proxy"}
    )
    assert joined.server.ingress == "proxy"
    assert load_config("gpu-llama-3.1-8b.yaml").server.ingress == "proxy"


def test_the_main_model_in_the_ingress_is_one_replica() -> None:
    one = ModelDeploymentConfig(engine=_engine())
    assert ToolserveConfig(name="x", main=one, main_placement="ingress").main.num_replicas == 1
    two = ModelDeploymentConfig(engine=_engine(), num_replicas=2)
    with pytest.raises(ValidationError, match="main_placement: own_replicas"):
        ToolserveConfig(name="x", main=two, main_placement="ingress")
    assert load_config().main_placement == "ingress"


def test_serve_replicas_run_on_one_event_loop_unless_told_otherwise() -> None:
    from cluster.launch.launcher import serve_event_loop_environment

    assert load_config().ray.serve_one_event_loop
    assert serve_event_loop_environment(True) == {
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    }
    assert set(serve_event_loop_environment(False).values()) == {"1"}


def test_a_tensor_parallel_replica_reserves_its_shards_gpus() -> None:
    config = load_config("gpu-llama-3.1-70b-tp4.yaml")
    raw = config.main.model_dump()
    raw["num_gpus"] = 0
    with pytest.raises(ValidationError, match="set num_gpus: 4"):
        ModelDeploymentConfig.model_validate(raw)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda path: path.stem)
def test_every_profile_runs_hosted_tools(profile: Path) -> None:
    """Speculation, partial execution and continuation need tools the cluster runs."""
    assert load_config(profile).tools.hosted, profile.name
