"""The replica's chat front end with the tokenize cache, and the CPU time it
spends preparing prompts (rendering the chat template, tokenizing), counted.

vLLM's renderer runs both stages on its thread pool through two attributes of
the renderer instance; toolserve replaces them with the same stages, timed, the
tokenization going through `PrefixTokenCache` when the request allows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from cluster.config import TokenizeCacheConfig
from deployments.replica.prompt_cache.tokens import JoinAudit, PrefixTokenCache

if TYPE_CHECKING:
    from vllm.inputs import TextPrompt, TokensPrompt
    from vllm.renderers.base import BaseRenderer
    from vllm.renderers.params import TokenizeParams

logger = logging.getLogger("toolserve.prompt_cache")

_Result = TypeVar("_Result")


class PromptPreparationMetrics:
    def __init__(self) -> None:
        from ray.serve.metrics import Counter

        self._cpu = Counter(
            "toolserve_prompt_cpu_seconds",
            description="CPU time the replica's chat front end spent preparing prompts, "
            "by stage (render: the chat template; tokenize).",
            tag_keys=("stage",),
        )
        self._prepared = Counter(
            "toolserve_prompts_prepared",
            description="Prompts through each stage of the chat front end.",
            tag_keys=("stage",),
        )
        self._lookups = Counter(
            "toolserve_tokenize_cache_lookups",
            description="Tokenizations by how the cache served them (hit: only a suffix "
            "tokenized; miss; bypass: the request needs a full tokenization).",
            tag_keys=("result",),
        )
        self._tokens = Counter(
            "toolserve_tokenize_cache_tokens",
            description="Prompt tokens by where their ids came from (cached, tokenized).",
            tag_keys=("source",),
        )
        self._audits = Counter(
            "toolserve_tokenize_cache_audits",
            description="Joined tokenizations checked against a full one, by result "
            "(match, mismatch: the cache turned itself off).",
            tag_keys=("result",),
        )

    def prepared(self, stage: str, cpu_s: float) -> None:
        tags = {"stage": stage}
        self._cpu.inc(cpu_s, tags=tags)
        self._prepared.inc(1, tags=tags)

    def looked_up(self, result: str, cached_tokens: int, tokenized_tokens: int) -> None:
        self._lookups.inc(1, tags={"result": result})
        if cached_tokens:
            self._tokens.inc(cached_tokens, tags={"source": "cached"})
        if tokenized_tokens:
            self._tokens.inc(tokenized_tokens, tags={"source": "tokenized"})

    def audited(self, matched: bool) -> None:
        self._audits.inc(1, tags={"result": "match" if matched else "mismatch"})


def _timed(
    stage: str, work: Callable[..., _Result], metrics: PromptPreparationMetrics
) -> Callable[..., _Result]:
    def timed(*args: Any, **kwargs: Any) -> _Result:
        started = time.thread_time()
        try:
            return work(*args, **kwargs)
        finally:
            metrics.prepared(stage, time.thread_time() - started)

    return timed


def boundary_tokens(tokenizer: Any) -> dict[str, int]:
    """The special tokens a prompt may be split at: matched whole wherever they
    appear, taking no whitespace from either side."""
    added = getattr(tokenizer, "added_tokens_decoder", None)
    if not isinstance(added, dict):
        return {}
    return {
        token.content: token_id
        for token_id, token in added.items()
        if getattr(token, "special", False)
        and not getattr(token, "lstrip", True)
        and not getattr(token, "rstrip", True)
        and not getattr(token, "single_word", True)
        and token.content
    }


class CachedTokenizer:
    """vLLM's prompt tokenization with `PrefixTokenCache` in front, for requests
    whose ids are the tokenizer's plain ids of the text (no special tokens added,
    no offsets)."""

    def __init__(
        self,
        renderer: BaseRenderer[Any],
        cache: PrefixTokenCache,
        audit: JoinAudit,
        metrics: PromptPreparationMetrics,
    ):
        self._renderer = renderer
        self._cache = cache
        self._audit = audit
        self._metrics = metrics

    def tokenize(self, prompt: TextPrompt, params: TokenizeParams) -> TokensPrompt:
        renderer = self._renderer
        if (
            self._audit.failed
            or params.add_special_tokens
            or renderer._wants_offsets(prompt, params)
            or "multi_modal_data" in prompt
        ):
            self._metrics.looked_up("bypass", 0, 0)
            return renderer._tokenize_prompt(prompt, params)
        text = prompt["prompt"]
        tokenizer = renderer.get_tokenizer()
        encode = params.get_encode_kwargs()
        split = self._cache.split(text)
        token_ids: list[int] | None = None
        if split is not None:
            suffix_ids = tokenizer(split.suffix, add_special_tokens=False)["input_ids"]
            joined = [*split.prefix_ids, *suffix_ids]
            if self._within_length(joined, encode) and self._passes_audit(joined, text, encode):
                token_ids = joined
                self._metrics.looked_up("hit", len(split.prefix_ids), len(suffix_ids))
        if token_ids is None:
            token_ids = tokenizer(text, **encode)["input_ids"]
            self._metrics.looked_up("miss", 0, len(token_ids))
        if not self._audit.failed and self._within_length(token_ids, encode, truncated=True):
            self._cache.remember(text, token_ids)
        return renderer._build_tokens_prompt(token_ids, prompt)

    @staticmethod
    def _within_length(
        token_ids: list[int], encode: dict[str, Any], *, truncated: bool = False
    ) -> bool:
        """Whether the tokenizer (called with `encode`) would leave these ids
        whole: a joined prompt it would truncate is tokenized in full, as vLLM
        does, and a truncated one (as long as the limit) is not kept."""
        if not encode.get("truncation"):
            return True
        limit = encode["max_length"] - 1 if truncated else encode["max_length"]
        return bool(len(token_ids) <= limit)

    def _passes_audit(self, joined: list[int], text: str, encode: dict[str, Any]) -> bool:
        if not self._audit.should_check():
            return True
        tokenizer = self._renderer.get_tokenizer()
        full = tokenizer(text, **encode)["input_ids"]
        matched = list(full) == joined
        self._audit.record(matched)
        self._metrics.audited(matched)
        if not matched:
            self._cache.clear()
            logger.warning(
                "tokenize cache off for this replica: a joined tokenization differed from "
                "the full one (the tokenizer does not split prompts at its special tokens)"
            )
        return matched


def install_prompt_preparation(renderer: BaseRenderer[Any], config: TokenizeCacheConfig) -> None:
    """Replace the renderer's threaded render and tokenize stages with timed ones,
    tokenizing through the cache when `config` enables it and the tokenizer has
    special tokens to split at."""
    from vllm.renderers.hf import HfRenderer, safe_apply_chat_template
    from vllm.utils.async_utils import make_async

    metrics = PromptPreparationMetrics()
    executor = renderer._executor
    if isinstance(renderer, HfRenderer):
        renderer._apply_chat_template_async = make_async(
            _timed("render", safe_apply_chat_template, metrics), executor=executor
        )
    tokenize: Callable[[TextPrompt, TokenizeParams], TokensPrompt] = renderer._tokenize_prompt
    boundaries = boundary_tokens(renderer.tokenizer) if renderer.tokenizer is not None else {}
    if config.enabled and boundaries:
        cache = PrefixTokenCache(boundaries, config.max_cached_tokens)
        tokenize = CachedTokenizer(
            renderer, cache, JoinAudit(config.audit_first, config.audit_every), metrics
        ).tokenize
    elif config.enabled:
        logger.warning("tokenize cache off: the tokenizer has no special tokens to split at")
    renderer._tokenize_prompt_async = make_async(
        _timed("tokenize", tokenize, metrics), executor=executor
    )
