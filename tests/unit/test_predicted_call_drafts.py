"""Drafts from predicted calls (pure): the n-gram that ends a request's output is
looked up in the calls its turn predicted, and what follows is proposed."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from cluster.config import PromptLookupConfig, load_config
from cluster.models import EMBEDDED_SCHEME, SMOLLM2, resolve_model
from cluster.policies.predicted_drafts import (
    PredictedCallDrafter,
    PredictedCallTokens,
    predicted_call_text,
)

SEARCH = PredictedCallTokens("search", (1, 2, 3, 4, 5, 6, 7, 8))
CALCULATOR = PredictedCallTokens("calculator", (1, 2, 30, 40, 50))


def test_the_continuation_of_the_longest_match_is_proposed_up_to_the_window() -> None:
    drafter = PredictedCallDrafter(min_match=2, max_match=4)
    draft = drafter.propose([SEARCH], [9, 9, 2, 3], window=3)
    assert draft is not None and (draft.tool, draft.tokens) == ("search", [4, 5, 6])
    end = drafter.propose([SEARCH], [6, 7], window=3)
    assert end is not None and end.tokens == [8]


def test_a_longer_match_picks_its_call_over_a_shorter_one() -> None:
    drafter = PredictedCallDrafter(min_match=2, max_match=4)
    # (1, 2) starts both calls; (9, 1, 2, 30) only the calculator's.
    assert drafter.propose([SEARCH, CALCULATOR], [1, 2], window=2).tool == "search"  # type: ignore[union-attr]
    draft = drafter.propose([SEARCH, CALCULATOR], [2, 30], window=2)
    assert draft is not None and (draft.tool, draft.tokens) == ("calculator", [40, 50])


def test_nothing_is_proposed_without_a_match_at_the_end_of_a_call_or_of_the_window() -> None:
    drafter = PredictedCallDrafter(min_match=2, max_match=4)
    assert drafter.propose([SEARCH], [3, 9], window=4) is None  # the last n-gram is new
    assert drafter.propose([SEARCH], [7, 8], window=4) is None  # the call is written
    assert drafter.propose([SEARCH], [2], window=4) is None  # shorter than min_match
    assert drafter.propose([SEARCH], [1, 2], window=0) is None
    assert drafter.propose([], [1, 2], window=4) is None


@given(st.lists(st.integers(min_value=0, max_value=6), min_size=3, max_size=30), st.data())
def test_following_the_proposals_writes_the_predicted_call(
    call: list[int], data: st.DataObject
) -> None:
    """A request that writes exactly a predicted call, having written its first
    `min_match` tokens, is proposed each next token (whatever else the call
    repeats, the first occurrence of a longer match still continues it)."""
    window = data.draw(st.integers(min_value=1, max_value=5))
    drafter = PredictedCallDrafter(min_match=2, max_match=len(call))
    prediction = PredictedCallTokens("t", tuple(call))
    written = call[:2]
    while len(written) < len(call):
        draft = drafter.propose([prediction], written, window)
        assert draft is not None
        assert len(draft.tokens) <= window
        written += draft.tokens[:1]
    assert written == call


def test_smollm2_writes_a_predicted_call_in_the_tokens_of_its_text() -> None:
    """The predicted call's text, tokenized alone, continues the tokens SmolLM2's
    tokenizer gives the whole reply once the call is opened."""
    tokenizer = AutoTokenizer.from_pretrained(
        resolve_model(EMBEDDED_SCHEME + SMOLLM2, load_config().cache_dir)
    )
    markers = PromptLookupConfig()
    call_json = json.dumps({"name": "calculator", "arguments": {"expression": "48271 * 9"}})
    call_text = predicted_call_text(markers.call_opening, markers.call_closing, call_json)
    reply = tokenizer.encode("Sure.\n" + call_text, add_special_tokens=False)
    prediction = PredictedCallTokens(
        "calculator", tuple(tokenizer.encode(call_text, add_special_tokens=False))
    )
    drafter = PredictedCallDrafter(markers.min_match, markers.max_match)
    opened = next(
        end for end in range(1, len(reply)) if tokenizer.decode(reply[:end]).endswith("<tool_call>")
    )
    proposed = 0
    for end in range(opened, len(reply)):
        draft = drafter.propose([prediction], reply[:end], window=4)
        assert draft is not None, tokenizer.decode(reply[:end])
        assert draft.tokens[0] == reply[end]
        proposed += 1
    assert proposed == len(reply) - opened
