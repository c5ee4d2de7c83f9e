"""LMCache offload's engine arguments, checked against the installed vLLM's own
config classes (LMCache does not run on vLLM's CPU backend, so no engine here
loads it)."""

import pytest
import torch
from pydantic import ValidationError
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)

from cluster.config import KvOffloadConfig, ModelDeploymentConfig, load_config
from deployments.engine.kv_offload import kv_bytes_per_token, kv_transfer_kwargs

GPU_PROFILES = ["gpu-llama-3.1-8b-4gpu.yaml", "gpu-llama-3.1-70b-tp4.yaml"]


def test_offload_off_adds_no_connector() -> None:
    assert kv_transfer_kwargs(KvOffloadConfig()) is None


def test_offload_builds_vllms_lmcache_connector_config() -> None:
    offload = KvOffloadConfig(
        enabled=True, cpu_gib=40, chunk_size=512, lmcache_config={"save_decode_cache": True}
    )
    kwargs = kv_transfer_kwargs(offload)
    assert kwargs is not None
    transfer = KVTransferConfig(**kwargs)
    assert transfer.kv_connector in KVConnectorFactory._registry
    assert transfer.is_kv_producer and transfer.is_kv_consumer
    assert transfer.get_from_extra_config("lmcache.local_cpu", None) is True
    assert transfer.get_from_extra_config("lmcache.max_local_cpu_size", None) == 40
    assert transfer.get_from_extra_config("lmcache.chunk_size", None) == 512
    assert transfer.get_from_extra_config("lmcache.save_decode_cache", None) is True
    engine_args = AsyncEngineArgs(
        model="meta-llama/Llama-3.1-8B-Instruct", kv_transfer_config=transfer
    )
    assert engine_args.kv_transfer_config is transfer


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_multi_gpu_profiles_offload_their_main_replicas(profile: str) -> None:
    main = load_config(profile).main
    assert main.kv_offload.enabled and main.pinning.mode == "cost_model"
    kwargs = kv_transfer_kwargs(main.kv_offload)
    assert kwargs is not None
    KVTransferConfig(**kwargs)


def test_offload_is_refused_on_cpu_replicas() -> None:
    cpu_main = load_config("embedded-cpu.yaml").main
    with pytest.raises(ValidationError, match="LMCache does not run on vLLM's CPU backend"):
        ModelDeploymentConfig.model_validate(
            cpu_main.model_dump() | {"kv_offload": {"enabled": True}}
        )


def test_offload_owns_the_kv_transfer_config() -> None:
    gpu_main = load_config("gpu-llama-3.1-8b-4gpu.yaml").main.model_dump()
    gpu_main["engine"]["extra_engine_args"] = {"kv_transfer_config": {}}
    with pytest.raises(ValidationError, match="kv_offload sets kv_transfer_config"):
        ModelDeploymentConfig.model_validate(gpu_main)


def test_kv_bytes_per_token_from_vllms_kv_layout() -> None:
    # Llama 3.1 8B: 32 layers, 8 KV heads of 128 dims in bfloat16: 128 KiB per token.
    spec = FullAttentionSpec(block_size=32, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    layers = [f"model.layers.{index}.self_attn.attn" for index in range(32)]
    kv_cache_config = KVCacheConfig(
        num_blocks=1000,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)],
    )
    assert kv_bytes_per_token(kv_cache_config) == 32 * 8 * 2 * 128 * 2


def test_an_engine_on_the_cpu_backend_refuses_offload() -> None:
    from deployments.engine.setup import create_engine_config

    with pytest.raises(ValueError, match="LMCache does not run on vLLM's CPU backend"):
        create_engine_config({"model": "unused"}, None, kv_offload=KvOffloadConfig(enabled=True))
