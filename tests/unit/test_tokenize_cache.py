"""The tokenize cache (pure): which prefix a prompt is split at, what is kept and
for how long, when joins are audited; and, on SmolLM2's own tokenizer and the
embedded chat template, that a conversation tokenized turn by turn through the
cache gets exactly the ids of a full tokenization."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from cluster.config import CONFIGS_DIR, load_config
from cluster.models import EMBEDDED_SCHEME, SMOLLM2, resolve_model
from deployments.replica.prompt_cache.frontend import boundary_tokens
from deployments.replica.prompt_cache.tokens import JoinAudit, PrefixTokenCache

OPEN, CLOSE = "<s>", "</s>"
BOUNDARIES = {OPEN: 1, CLOSE: 2}


def _toy_ids(text: str) -> list[int]:
    """A tokenizer for the pure tests: boundary tokens are 1 and 2, every other
    character its code point."""
    ids, position = [], 0
    while position < len(text):
        for token, token_id in BOUNDARIES.items():
            if text.startswith(token, position):
                ids.append(token_id)
                position += len(token)
                break
        else:
            ids.append(ord(text[position]))
            position += 1
    return ids


def test_a_prompt_extending_a_kept_one_is_split_where_the_kept_text_ends() -> None:
    cache = PrefixTokenCache(BOUNDARIES, max_cached_tokens=1000)
    first = "<s>system</s><s>user hi</s><s>assistant"
    cache.remember(first, _toy_ids(first))
    kept = "<s>system</s><s>user hi</s>"
    later = kept + "<s>assistant hello</s><s>user more</s><s>assistant"
    split = cache.split(later)
    assert split is not None
    assert list(split.prefix_ids) == _toy_ids(kept)
    assert split.suffix == later[len(kept) :]
    assert [*split.prefix_ids, *_toy_ids(split.suffix)] == _toy_ids(later)


def test_no_split_where_the_kept_text_is_not_followed_by_a_boundary_token() -> None:
    cache = PrefixTokenCache(BOUNDARIES, max_cached_tokens=1000)
    first = "<s>system</s><s>user"
    cache.remember(first, _toy_ids(first))
    assert cache.split("<s>system</s>x<s>user") is None
    assert cache.split("<s>system</s") is None
    assert cache.split("<s>other</s><s>user") is None


def test_the_longest_kept_prefix_wins() -> None:
    cache = PrefixTokenCache(BOUNDARIES, max_cached_tokens=1000)
    for prompt in ("<s>a</s><s>b", "<s>a</s><s>b</s><s>c"):
        cache.remember(prompt, _toy_ids(prompt))
    split = cache.split("<s>a</s><s>b</s><s>c</s><s>d")
    assert split is not None
    assert split.suffix == "<s>c</s><s>d"


def test_nothing_is_kept_when_the_ids_do_not_end_as_the_text_does() -> None:
    cache = PrefixTokenCache(BOUNDARIES, max_cached_tokens=1000)
    cache.remember("<s>a</s><s>b", [1, 97, 2, 98])  # the last `<s>` missing
    cache.remember("no boundary at all", _toy_ids("no boundary at all"))
    cache.remember("<s>only at the start", _toy_ids("<s>only at the start"))
    assert len(cache) == 0


def test_the_least_recently_used_prefix_goes_past_the_token_bound() -> None:
    cache = PrefixTokenCache(BOUNDARIES, max_cached_tokens=12)
    old, new = "<s>aaaa</s><s>x", "<s>bbbb</s><s>x"
    cache.remember(old, _toy_ids(old))
    cache.remember(new, _toy_ids(new))
    assert cache.cached_tokens == 12
    assert cache.split(old + "</s><s>y") is not None  # `old` is now the newest
    third = "<s>cc</s><s>x"
    cache.remember(third, _toy_ids(third))
    assert cache.split(new + "</s><s>y") is None
    assert cache.split(old + "</s><s>y") is not None
    assert cache.cached_tokens <= 12


def test_a_prefix_longer_than_the_bound_is_not_kept() -> None:
    cache = PrefixTokenCache(BOUNDARIES, max_cached_tokens=3)
    prompt = "<s>long text</s><s>x"
    cache.remember(prompt, _toy_ids(prompt))
    assert len(cache) == 0


def test_the_audit_checks_the_first_joins_then_one_in_every() -> None:
    audit = JoinAudit(first=2, every=3)
    assert [audit.should_check() for _ in range(9)] == [
        True,
        True,
        False,
        False,
        True,
        False,
        False,
        True,
        False,
    ]
    assert not audit.failed
    audit.record(True)
    assert not audit.failed
    audit.record(False)
    assert audit.failed
    never_again = JoinAudit(first=1, every=0)
    assert [never_again.should_check() for _ in range(4)] == [True, False, False, False]


@functools.cache
def _smollm2() -> Any:
    return AutoTokenizer.from_pretrained(
        resolve_model(EMBEDDED_SCHEME + SMOLLM2, load_config().cache_dir)
    )


@functools.cache
def _template() -> str:
    return (CONFIGS_DIR / "chat_templates" / "smollm2-tools.jinja").read_text()


def test_smollm2s_turn_markers_are_boundary_tokens() -> None:
    boundaries = boundary_tokens(_smollm2())
    assert {"<|im_start|>", "<|im_end|>"} <= boundaries.keys()
    tokenizer = _smollm2()
    assert boundaries["<|im_start|>"] == tokenizer.convert_tokens_to_ids("<|im_start|>")


_PIECE = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8),
    st.sampled_from([" ", "\n", "\n\n", "\t", "<", "|>", "<|im_start|>", "<|im_end|>", "é", "日"]),
)
_TEXT = st.lists(_PIECE, max_size=6).map("".join)
_CALL = st.fixed_dictionaries(
    {
        "id": st.just("call_1"),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["ls", "read_file"]), "arguments": _TEXT}
        ),
    }
)
_TURN = st.tuples(
    _TEXT,
    st.one_of(
        st.fixed_dictionaries({"role": st.just("assistant"), "content": _TEXT}),
        st.fixed_dictionaries(
            {
                "role": st.just("assistant"),
                "content": _TEXT,
                "tool_calls": st.lists(_CALL, min_size=1, max_size=2),
            }
        ),
    ),
    st.lists(_TEXT, max_size=2),
)
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=_TEXT, turns=st.lists(_TURN, min_size=1, max_size=5), with_tools=st.booleans())
def test_a_conversation_tokenized_through_the_cache_gets_a_full_tokenizations_ids(
    system: str, turns: list[tuple[str, dict[str, Any], list[str]]], with_tools: bool
) -> None:
    tokenizer = _smollm2()
    cache = PrefixTokenCache(boundary_tokens(tokenizer), max_cached_tokens=100_000)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    hits = 0
    for user, reply, tool_outputs in turns:
        messages.append({"role": "user", "content": user})
        prompt = tokenizer.apply_chat_template(
            messages,
            tools=_TOOLS if with_tools else None,
            chat_template=_template(),
            tokenize=False,
            add_generation_prompt=True,
        )
        full = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        split = cache.split(prompt)
        if split is not None:
            hits += 1
            suffix = tokenizer(split.suffix, add_special_tokens=False)["input_ids"]
            assert [*split.prefix_ids, *suffix] == full
        cache.remember(prompt, full)
        messages.append(reply)
        if "tool_calls" in reply:
            messages += [{"role": "tool", "content": output} for output in tool_outputs]
    assert hits == len(turns) - 1
