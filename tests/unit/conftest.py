"""Fixtures several unit modules share."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from cluster.config import load_config
from cluster.models import EMBEDDED_SCHEME, SMOLLM2, resolve_model


@pytest.fixture(scope="session")
def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """The embedded model's tokenizer."""
    config = load_config()
    return AutoTokenizer.from_pretrained(resolve_model(EMBEDDED_SCHEME + SMOLLM2, config.cache_dir))


@pytest.fixture(scope="session")
def tool_template() -> str:
    """The embedded profile's chat template with tools."""
    path = load_config().main.chat.resolved_chat_template()
    assert path is not None
    return Path(path).read_text()
