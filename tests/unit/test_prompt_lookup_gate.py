"""The prompt-lookup gate (pure): tool-call regions of a token stream, and each
request's draft length from its region, its acceptance and the batch."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from cluster.config import PromptLookupConfig, load_config
from cluster.models import EMBEDDED_SCHEME, SMOLLM2, resolve_model
from cluster.policies.draft_gate import (
    CALL,
    PROSE,
    CallRegions,
    GateSettings,
    ProposalGate,
    gate_settings,
)
from deployments.engine.prompt_lookup.scheduler import opening_tokens

OPENING, CLOSING = (8, 9), (7, 8, 9)  # as `tool_call>` and `</tool_call>`
SETTINGS = GateSettings(
    window=5, prose_floor=1, ema_weight=0.5, initial_acceptance=0.4, max_decoders=4
)


def _inside_at_the_end(tokens: list[int]) -> bool:
    """The reference: the last marker to end is an opening one that is not the
    end of a closing one."""

    def ends_with(end: int, marker: tuple[int, ...]) -> bool:
        return end >= len(marker) and tuple(tokens[end - len(marker) : end]) == marker

    for end in range(len(tokens), 0, -1):
        if ends_with(end, CLOSING):
            return False
        if ends_with(end, OPENING):
            return True
    return False


@given(
    st.lists(st.sampled_from([1, 7, 8, 9]), max_size=40),
    st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
def test_a_call_region_does_not_depend_on_how_the_tokens_arrive(
    tokens: list[int], cuts: list[int]
) -> None:
    regions = CallRegions(OPENING, CLOSING)
    bounds = [0, *sorted(min(cut, len(tokens)) for cut in cuts), len(tokens)]
    for start, end in itertools.pairwise(bounds):
        regions.feed("r", tokens[start:end])
    assert regions.inside("r") == _inside_at_the_end(tokens)


def test_regions_are_per_request_and_forgotten() -> None:
    regions = CallRegions(OPENING, CLOSING)
    assert regions.feed("a", [1, 6, 8]) is False
    assert regions.feed("b", [9]) is False
    assert regions.feed("a", [9, 1, 1]) is True  # `.<` `tool_call>`: opened
    assert regions.feed("a", [7, 8]) is True
    assert regions.feed("a", [9]) is False  # `</tool_call>`: closed, not opened
    regions.feed("b", [5, 8, 9])
    regions.forget("b")
    assert regions.inside("b") is False


def test_a_call_gets_the_window_and_prose_follows_its_own_acceptance() -> None:
    gate = ProposalGate(SETTINGS)
    assert gate.draft_length("r", in_call=True) == 5
    assert gate.draft_length("r", in_call=False) == 2  # round(5 * 0.4)
    for _ in range(6):
        gate.observe("r", drafted=2, accepted=0, in_call=False)
    assert gate.draft_length("r", in_call=False) == SETTINGS.prose_floor
    assert gate.draft_length("r", in_call=True) == 5, "a call's window does not shrink"
    for _ in range(6):
        gate.observe("r", drafted=1, accepted=1, in_call=False)
    assert gate.draft_length("r", in_call=False) == 5
    assert gate.draft_length("other", in_call=False) == 2
    gate.forget("r")
    assert gate.draft_length("r", in_call=False) == 2


def test_acceptance_in_calls_does_not_lengthen_prose_drafts() -> None:
    gate = ProposalGate(SETTINGS)
    for _ in range(10):
        gate.observe("r", drafted=5, accepted=5, in_call=True)
    assert gate.draft_length("r", in_call=False) == 2


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.booleans()), max_size=30))
def test_the_draft_length_stays_between_the_floor_and_the_window(
    steps: list[tuple[int, int, bool]],
) -> None:
    gate = ProposalGate(SETTINGS)
    for drafted, accepted, in_call in steps:
        gate.observe("r", drafted, min(accepted, drafted), in_call)
        length = gate.draft_length("r", in_call=False)
        assert SETTINGS.prose_floor <= length <= SETTINGS.window


def test_past_the_concurrency_cap_no_request_gets_drafts_and_the_step_is_counted() -> None:
    gate = ProposalGate(SETTINGS)
    assert not gate.over_cap(4)
    assert gate.over_cap(5)
    assert gate.draft_length("r", in_call=True, over_cap=True) == 0
    assert gate.draft_length("r", in_call=False, over_cap=True) == 0
    assert gate.take_stats().capped_steps == 1


def test_without_a_cap_as_configured_by_default_any_batch_keeps_its_drafts() -> None:
    gate = ProposalGate(gate_settings(PromptLookupConfig()))
    assert gate.settings.max_decoders is None
    assert not gate.over_cap(1024)
    assert gate.draft_length("r", in_call=True, over_cap=gate.over_cap(1024)) == 4
    assert gate.take_stats().capped_steps == 0


def test_past_the_cap_only_prose_that_keeps_being_accepted_gets_drafts() -> None:
    gate = ProposalGate(dataclasses.replace(SETTINGS, past_cap_acceptance=0.6))
    for _ in range(6):
        gate.observe("copies", drafted=2, accepted=2, in_call=False)
        gate.observe("writes", drafted=2, accepted=0, in_call=False)
    assert gate.draft_length("copies", in_call=False, over_cap=True) == 5
    assert gate.draft_length("writes", in_call=False, over_cap=True) == 0
    assert gate.draft_length("new", in_call=False, over_cap=True) == 0  # 0.4 to start with
    assert gate.draft_length("copies", in_call=True, over_cap=True) == 0
    assert gate.draft_length("writes", in_call=False) == SETTINGS.prose_floor


def test_stats_count_drafts_and_acceptance_by_region_until_taken() -> None:
    gate = ProposalGate(SETTINGS)
    gate.observe("a", drafted=5, accepted=4, in_call=True)
    gate.observe("b", drafted=2, accepted=0, in_call=False)
    gate.observe("b", drafted=0, accepted=0, in_call=False)  # nothing verified
    stats = gate.take_stats().as_dict()
    assert stats["regions"] == {
        CALL: {"steps": 1, "drafted": 5, "accepted": 4},
        PROSE: {"steps": 1, "drafted": 2, "accepted": 0},
    }
    assert gate.take_stats().regions[CALL].steps == 0


def test_drafts_from_a_predicted_call_count_in_the_call_region_and_by_tool() -> None:
    gate = ProposalGate(SETTINGS)
    gate.observe("a", drafted=5, accepted=5, in_call=True, predicted_tool="search")
    gate.observe("a", drafted=3, accepted=1, in_call=True)
    gate.observe("b", drafted=2, accepted=2, in_call=False, predicted_tool="search")
    stats = gate.take_stats().as_dict()
    assert stats["regions"][CALL] == {"steps": 2, "drafted": 8, "accepted": 6}
    assert stats["predicted"] == {"search": {"steps": 1, "drafted": 5, "accepted": 5}}


def test_smollm2s_hermes_calls_are_found_in_its_token_stream_token_by_token() -> None:
    tokenizer = AutoTokenizer.from_pretrained(
        resolve_model(EMBEDDED_SCHEME + SMOLLM2, load_config().cache_dir)
    )
    markers = PromptLookupConfig()
    regions = CallRegions(
        opening_tokens(tokenizer, markers.call_opening),
        tokenizer.encode(markers.call_closing, add_special_tokens=False),
    )
    reply = 'I will look.<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call> Done.'
    seen, states = "", []
    for token in tokenizer.encode(reply, add_special_tokens=False):
        inside = regions.feed("r", [token])
        seen += tokenizer.decode([token])
        states.append((seen, inside))

    def inside_once_written(text: str) -> bool:
        return next(inside for prefix, inside in states if text in prefix)

    assert inside_once_written("I will look") is False
    assert inside_once_written("<tool_call>") is True
    assert inside_once_written('"name": "ls"') is True
    assert inside_once_written("</tool_call>") is False
    assert inside_once_written("Done.") is False


PROBING = GateSettings(
    window=4,
    prose_floor=1,
    ema_weight=0.5,
    initial_acceptance=0.5,
    max_decoders=8,
    min_prose_acceptance=0.1,
    probe_every=4,
)


def test_prose_drafts_nobody_accepts_are_withheld_but_for_probes() -> None:
    gate = ProposalGate(PROBING)
    assert gate.draft_length("r", in_call=False) == 2
    for _ in range(4):
        gate.observe("r", drafted=2, accepted=0, in_call=False)
    lengths = [gate.draft_length("r", in_call=False) for _ in range(8)]
    assert lengths == [0, 0, 0, 1, 0, 0, 0, 1], "one probe step in four"
    assert gate.draft_length("r", in_call=True) == 4, "a call still gets the window"
    for _ in range(3):  # probes whose drafts are accepted bring the drafts back
        gate.observe("r", drafted=1, accepted=1, in_call=False)
    assert gate.draft_length("r", in_call=False) == 4
    assert gate.draft_length("other", in_call=False) == 2
    gate.forget("r")
    assert gate.draft_length("r", in_call=False) == 2


def test_a_new_requests_prose_acceptance_starts_from_the_engines_recent_one() -> None:
    settings = dataclasses.replace(PROBING, learned_initial_acceptance=True)
    gate = ProposalGate(settings)
    assert gate.draft_length("first", in_call=False) == 2, "nothing learned yet"
    for _ in range(6):
        gate.observe("first", drafted=2, accepted=0, in_call=False)
    gate.forget("first")
    assert gate.initial_acceptance() == 0.0
    # The next turn's request starts where the engine's prose stands: probes only.
    assert [gate.draft_length("next", in_call=False) for _ in range(4)] == [0, 0, 0, 1]
    assert gate.draft_length("next", in_call=True) == 4, "a call still gets the window"
    # Prose that repeats its prompt brings the engine's acceptance back up.
    for _ in range(60):
        gate.observe("next", drafted=1, accepted=1, in_call=False)
    assert gate.initial_acceptance() > 0.5
    assert gate.draft_length("third", in_call=False) >= 2
    # Drafts inside calls say nothing of prose.
    fixed = ProposalGate(settings)
    fixed.observe("r", drafted=4, accepted=0, in_call=True)
    assert fixed.initial_acceptance() == 0.5


def test_the_configured_default_learns_the_initial_acceptance() -> None:
    assert PromptLookupConfig().learned_initial_acceptance is True
