"""The embedded default model's tokenizer, for workloads sized in its tokens
(loaded once, when a workload first builds its programs)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


@functools.cache
def _embedded_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from cluster.config import load_config
    from cluster.models import resolve_model

    config = load_config()
    return AutoTokenizer.from_pretrained(resolve_model(config.main.engine.model, config.cache_dir))


def embedded_token_count() -> Callable[[str], int]:
    """Tokens of a text for the embedded default's model."""
    tokenizer = _embedded_tokenizer()
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


@functools.cache
def embedded_vocabulary_words(count: int = 4000) -> tuple[str, ...]:
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
