"""The tokenize cache on the running cluster, through the `openai` SDK: the turns
of one program after its first are tokenized from the cache (the hits reach the
metrics), and the prompt ids the engine ran are a full tokenization's."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest
from openai import OpenAI
from prometheus_text import metric_total
from transformers import AutoTokenizer

from cluster.config import ToolserveConfig
from cluster.launch.launcher import Endpoints
from cluster.models import resolve_model

pytestmark = pytest.mark.e2e


def _front_end(cluster: Endpoints) -> tuple[float, float]:
    """Tokenize cache hits, and prompt tokens whose ids it held."""
    text = httpx.get(cluster.metrics_url, timeout=30).text
    return (
        metric_total(text, "toolserve_tokenize_cache_lookups_total", result="hit"),
        metric_total(text, "toolserve_tokenize_cache_tokens_total", source="cached"),
    )


def test_a_programs_later_turns_tokenize_only_what_they_add(
    cluster: Endpoints, cluster_config: ToolserveConfig, client: OpenAI, model_name: str
) -> None:
    assert cluster_config.main.chat.tokenize_cache.enabled
    tokenizer = AutoTokenizer.from_pretrained(
        resolve_model(cluster_config.main.engine.model, cluster_config.cache_dir)
    )
    template_path = cluster_config.main.chat.resolved_chat_template()
    assert template_path is not None
    with open(template_path) as handle:
        template = handle.read()
    hits_before, cached_before = _front_end(cluster)
    program = {"X-Session-ID": f"tokenize-{uuid.uuid4().hex[:8]}"}
    messages: list[Any] = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": f"Name a fruit. ({uuid.uuid4().hex[:8]})"},
    ]
    for turn in range(3):
        reply = client.chat.completions.create(
            model=model_name,
            messages=messages,
            max_tokens=8,
            temperature=0,
            extra_headers=program | {"Cache-Control": "no-cache"},
            extra_body={"return_token_ids": True},
        )
        full = tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=True
        )
        expected = tokenizer(full, add_special_tokens=False)["input_ids"]
        assert reply.model_extra is not None
        assert reply.model_extra["prompt_token_ids"] == expected, f"turn {turn}"
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"And another, number {turn + 2}."},
        ]

    deadline = time.monotonic() + 90
    while True:
        hits, cached = _front_end(cluster)
        if hits >= hits_before + 2 and cached > cached_before:
            break
        assert time.monotonic() < deadline, (
            f"two cache hits expected in the metrics, saw {hits - hits_before}"
        )
        time.sleep(2)
