from types import SimpleNamespace

from cluster.config import AdmissionConfig
from deployments.engine.admission import settings as admission_settings
from deployments.engine.pinning.settings import (
    ADDITIONAL_CONFIG_KEY,
    EnginePinningSettings,
)
from deployments.engine.setup import select_scheduler


def settings(**overrides: object) -> EnginePinningSettings:
    return EnginePinningSettings.model_validate(
        {"replica_id": "r1", "redis_url": "redis://127.0.0.1:6379/0"} | overrides
    )


def test_engine_kwargs_carry_the_settings_to_the_engine_process() -> None:
    pinning = settings(mode="fixed", fixed_ttl_s=3.5)
    kwargs = pinning.engine_kwargs()
    assert kwargs["scheduling_policy"] == "priority"
    restored = EnginePinningSettings.from_additional_config(kwargs["additional_config"])
    assert restored == pinning


def test_program_fcfs_off_keeps_vllms_fcfs_policy() -> None:
    assert settings(program_fcfs=False).engine_kwargs()["scheduling_policy"] == "fcfs"


def test_everything_off_leaves_the_engine_stock() -> None:
    assert settings(mode="off", program_fcfs=False).engine_kwargs() == {}
    assert EnginePinningSettings.from_additional_config({}) is None
    assert EnginePinningSettings.from_additional_config(None) is None


def test_the_settings_live_beside_other_users_of_additional_config() -> None:
    pinning = settings()
    carried = pinning.engine_kwargs()["additional_config"]
    assert set(carried) == {ADDITIONAL_CONFIG_KEY}
    shared = {"another_plugin": {"enabled": True}} | carried
    assert EnginePinningSettings.from_additional_config(shared) == pinning


def test_scheduler_follows_vllms_choice_of_async_scheduling() -> None:
    for async_scheduling, expected in [
        (True, "PinningAsyncScheduler"),
        (False, "PinningScheduler"),
    ]:
        vllm_config = SimpleNamespace(
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling, scheduler_cls=None)
        )
        select_scheduler(vllm_config, settings())
        assert vllm_config.scheduler_config.scheduler_cls == (
            f"deployments.engine.schedulers.{expected}"
        )


def test_admission_alone_gets_a_scheduler_of_its_own_and_rides_along_otherwise() -> None:
    admission = AdmissionConfig(enabled=True)
    for async_scheduling, expected in [
        (True, "AdmissionAsyncScheduler"),
        (False, "AdmissionScheduler"),
    ]:
        vllm_config = SimpleNamespace(
            scheduler_config=SimpleNamespace(async_scheduling=async_scheduling, scheduler_cls=None)
        )
        select_scheduler(vllm_config, None, None, admission)
        assert vllm_config.scheduler_config.scheduler_cls == (
            f"deployments.engine.schedulers.{expected}"
        )
    vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=False, scheduler_cls=None)
    )
    select_scheduler(vllm_config, settings(), None, admission)
    assert vllm_config.scheduler_config.scheduler_cls == (
        "deployments.engine.schedulers.PinningScheduler"
    )
    carried = admission_settings.engine_kwargs(admission)["additional_config"]
    assert admission_settings.from_additional_config(carried) == admission
    assert admission_settings.engine_kwargs(AdmissionConfig()) == {}
