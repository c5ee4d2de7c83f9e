"""LMCache's CPU tier under a GPU engine: the arguments of vLLM's LMCache
connector, and the KV bytes a token takes in the engine's own layout (what a
reload from the CPU tier copies)."""

from __future__ import annotations

from typing import Any

from cluster.config import KvOffloadConfig

LMCACHE_CONNECTOR = "LMCacheConnectorV1"


def kv_transfer_kwargs(config: KvOffloadConfig) -> dict[str, Any] | None:
    """Keyword arguments of vLLM's `KVTransferConfig`, or None with offload off.
    LMCache reads settings prefixed `lmcache.` from the connector's extra config."""
    if not config.enabled:
        return None
    lmcache = {
        "local_cpu": True,
        "max_local_cpu_size": config.cpu_gib,
        "chunk_size": config.chunk_size,
    } | config.lmcache_config
    return {
        "kv_connector": LMCACHE_CONNECTOR,
        # Both: the engine saves what it computes and loads what the tier holds.
        "kv_role": "kv_both",
        "kv_connector_extra_config": {f"lmcache.{key}": value for key, value in lmcache.items()},
    }


def kv_bytes_per_token(kv_cache_config: Any) -> float:
    """Bytes one token's KV takes across every layer, from vLLM's `KVCacheConfig`
    (each group's layers share one spec; a page holds `block_size` tokens of one layer)."""
    return float(
        sum(
            len(group.layer_names)
            * group.kv_cache_spec.page_size_bytes
            / group.kv_cache_spec.block_size
            for group in kv_cache_config.kv_cache_groups
        )
    )
