"""Prefix integrity: where a program's new prompt leaves what the engine held for
it, why, and the repair that puts the model's own tokens back where the client
sent an equivalent reply. The rendering case uses SmolLM2's tokenizer and the
embedded tool template, as the replica does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from client_tools import WEATHER_TOOL
from transformers import PreTrainedTokenizerBase

from deployments.replica.prompt_cache.integrity import (
    BreakCause,
    Call,
    HeldTurn,
    HeldTurns,
    Reply,
    break_cause,
    check_prompt,
    first_divergence,
    repaired_prompt,
)

END = 2
WEATHER = WEATHER_TOOL
SYSTEM = {"role": "system", "content": "You are a weather assistant."}
USER = {"role": "user", "content": "What is the weather in Paris?"}
# What the model wrote, and what vLLM's hermes parser returned for it.
MODEL_TEXT = (
    '<tool_call>\n{"name": "get_weather", "arguments": {\n    "city": "Paris"\n}}\n</tool_call>'
)
API_CALL = Call("get_weather", '{"city": "Paris"}')
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'}


def _assistant(content: str | None, *calls: Call) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{index + 1}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for index, call in enumerate(calls)
        ]
    return message


def _held(reply: Reply, output: tuple[int, ...] = (30, 31, 32, END)) -> HeldTurn:
    return HeldTurn(
        prompt_ids=(1, 10, 11, 12, 1, 20, 21),
        output_ids=output,
        messages=(SYSTEM, USER),
        tools=(WEATHER,),
        read_reply=lambda: reply,
    )


def test_the_first_divergence_is_where_the_prompt_leaves_what_was_held() -> None:
    assert first_divergence([1, 2, 3], [1, 2, 3, 4]) is None
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3, 4]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([], [5]) is None
    long = list(range(5000))
    for position in (0, 1, 2047, 4999):
        assert first_divergence(long, [*long[:position], -1, *long[position + 1 :]]) == position


@pytest.mark.parametrize(
    ("sent", "cause"),
    [
        (_assistant(None, API_CALL), BreakCause.ASSISTANT_RERENDERED),
        (
            _assistant(None, Call("get_weather", '{"city":"Paris"}')),
            BreakCause.TOOL_ARGUMENTS_RESERIALIZED,
        ),
        (_assistant(None, Call("get_weather", '{"city": "Rome"}')), BreakCause.REPLY_EDITED),
        (_assistant(None, Call("get_time", '{"city": "Paris"}')), BreakCause.REPLY_EDITED),
        (_assistant(None), BreakCause.REPLY_EDITED),
    ],
)
def test_a_reply_sent_back_is_told_apart_from_what_the_model_wrote(
    sent: dict[str, Any], cause: BreakCause
) -> None:
    held = _held(Reply(None, (API_CALL,)))
    messages = [SYSTEM, USER, sent, TOOL_RESULT]
    assert break_cause(held, messages, [WEATHER], divergence=8) is cause


@pytest.mark.parametrize(
    ("sent", "cause"),
    [
        ("Let me look.  ", BreakCause.ASSISTANT_RERENDERED),
        ("Let me look.", BreakCause.CONTENT_TRIMMED),
        ("", BreakCause.CONTENT_DROPPED),
        (None, BreakCause.CONTENT_DROPPED),
        ("I will check.", BreakCause.REPLY_EDITED),
    ],
)
def test_the_replys_text_trimmed_dropped_or_edited(sent: str | None, cause: BreakCause) -> None:
    held = _held(Reply("Let me look.  ", (API_CALL,)))
    messages = [SYSTEM, USER, _assistant(sent, API_CALL), TOOL_RESULT]
    assert break_cause(held, messages, [WEATHER], divergence=8) is cause


def test_changes_before_the_reply_are_named_by_what_changed() -> None:
    held = HeldTurn(
        prompt_ids=tuple(range(40)),
        output_ids=(50, END),
        messages=(
            SYSTEM,
            USER,
            _assistant("Sunny.", API_CALL),
            TOOL_RESULT,
            {"role": "user", "content": "And tomorrow?"},
        ),
        tools=(WEATHER,),
        read_reply=lambda: Reply("Let me see.", (API_CALL,)),
    )
    earlier = list(held.messages)
    reply = _assistant("Let me see.", API_CALL)

    def cause(messages: list[Any], tools: list[Any] | None = None) -> BreakCause:
        return break_cause(held, messages, [WEATHER] if tools is None else tools, divergence=5)

    other_system = {"role": "system", "content": "Today is Monday."}
    assert cause([other_system, *earlier[1:], reply]) is BreakCause.SYSTEM_PROMPT_CHANGED
    assert cause([*earlier, reply], tools=[]) is BreakCause.TOOLS_CHANGED
    assert cause([SYSTEM, *earlier[3:], reply]) is BreakCause.HISTORY_TRUNCATED
    swapped = [SYSTEM, earlier[2], USER, *earlier[3:], reply]
    assert cause(swapped) is BreakCause.HISTORY_REORDERED
    edited = [SYSTEM, {"role": "user", "content": "Weather in Rome?"}, *earlier[2:], reply]
    assert cause(edited) is BreakCause.HISTORY_EDITED
    assert cause([*earlier, reply]) is BreakCause.RENDERED_DIFFERENTLY
    no_reply = [*earlier, {"role": "user", "content": "Hello?"}]
    assert cause(no_reply) is BreakCause.RENDERED_DIFFERENTLY
    assert break_cause(held, no_reply, [WEATHER], 41) is BreakCause.REPLY_MISSING


def test_the_repair_splices_the_models_tokens_in_place_of_the_rendered_reply() -> None:
    held = _held(Reply(None, (API_CALL,)))
    rendered_reply = [30, 40, 41, END]
    prompt = [*held.prompt_ids, *rendered_reply, 7, 1, 60, 61, END, 7, 1, 20, 21]
    repaired = repaired_prompt(held, prompt, END)
    assert repaired == [*held.held_ids, 7, 1, 60, 61, END, 7, 1, 20, 21]
    # A reply cut at its call's closing gets the end of its turn from the template.
    cut = _held(Reply(None, (API_CALL,)), output=(30, 31, 32))
    assert repaired_prompt(cut, prompt, END) == [*cut.held_ids, END, *prompt[len(held.held_ids) :]]
    assert repaired_prompt(held, [1, 10, 99, *prompt[3:]], END) is None
    assert repaired_prompt(held, [*held.prompt_ids, 30, 40], END) is None


def test_only_an_equivalent_reply_is_repaired_and_only_within_the_length_limit() -> None:
    held = _held(Reply(None, (API_CALL,)))
    prompt = [*held.prompt_ids, 30, 40, END, 7]

    def verdict(sent: dict[str, Any], limit: int = 100, repair: bool = True) -> Any:
        messages = [SYSTEM, USER, sent, TOOL_RESULT]
        return check_prompt(
            held,
            prompt,
            messages,
            [WEATHER],
            end_of_turn_id=END,
            repair=repair,
            max_prompt_tokens=limit,
        )

    same = verdict(_assistant(None, API_CALL))
    assert same.check.repaired and same.prompt_ids == [*held.held_ids, 7]
    assert same.check.cause is BreakCause.ASSISTANT_RERENDERED
    assert same.check.divergence == 8 and same.check.tokens_recomputed == 0
    edited = verdict(_assistant(None, Call("get_weather", '{"city": "Rome"}')))
    assert not edited.check.repaired and edited.prompt_ids == prompt
    assert edited.check.tokens_recomputed == len(held.held_ids) - 8
    assert not verdict(_assistant(None, API_CALL), limit=len(prompt)).check.repaired
    assert not verdict(_assistant(None, API_CALL), repair=False).check.repaired

    whole = check_prompt(
        held,
        [*held.held_ids, 7],
        [],
        None,
        end_of_turn_id=END,
        repair=True,
        max_prompt_tokens=100,
    )
    assert whole is not None and not whole.check.broken and whole.check.cause is None
    nothing_held = check_prompt(
        None, prompt, [], None, end_of_turn_id=END, repair=True, max_prompt_tokens=9
    )
    assert nothing_held is None


def test_held_turns_are_bounded_by_the_tokens_they_hold() -> None:
    turns = HeldTurns(max_held_tokens=20)
    held = _held(Reply(None))  # 11 tokens
    turns.put("a", held)
    turns.put("b", held)
    assert turns.get("a") is None and turns.get("b") == held and turns.held_tokens == 11
    turns.put("b", held)
    assert len(turns) == 1 and turns.held_tokens == 11
    turns.forget("b")
    assert len(turns) == 0 and turns.held_tokens == 0
    turns.put("big", _held(Reply(None), output=tuple(range(30))))
    assert len(turns) == 0


def _prompt_ids(
    tokenizer: PreTrainedTokenizerBase, template: str, messages: list[Any]
) -> list[int]:
    """A conversation's prompt as the replica's front end renders and tokenizes it."""
    rendered = tokenizer.apply_chat_template(
        messages,
        tools=[WEATHER],
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def test_the_repaired_prompt_is_the_same_conversation_in_the_models_own_tokens(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    """The embedded model writes a call's arguments over several lines, the API
    returns them compact and the template renders them compact: the prefix breaks
    inside the reply; the repaired prompt starts with everything the engine held
    and decodes to the same conversation with the arguments as the model wrote them."""

    tokenizer = smollm2_tokenizer

    def ids(messages: list[Any]) -> list[int]:
        return _prompt_ids(tokenizer, tool_template, messages)

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = ids([SYSTEM, USER])
    output = [*tokenizer(MODEL_TEXT, add_special_tokens=False)["input_ids"], end]
    held = HeldTurn(
        tuple(first), tuple(output), (SYSTEM, USER), (WEATHER,), lambda: Reply(None, (API_CALL,))
    )
    returned = [SYSTEM, USER, _assistant(None, API_CALL), TOOL_RESULT]
    prompt = ids(returned)

    verdict = check_prompt(
        held, prompt, returned, [WEATHER], end_of_turn_id=end, repair=True, max_prompt_tokens=4096
    )
    assert verdict is not None
    assert verdict.check.cause is BreakCause.ASSISTANT_RERENDERED
    assert verdict.check.divergence is not None and verdict.check.divergence >= len(first)
    assert verdict.check.repaired
    assert verdict.prompt_ids[: len(held.held_ids)] == held.held_ids

    as_written = json.loads(MODEL_TEXT.split("\n", 1)[1].rsplit("\n", 1)[0])["arguments"]
    model_arguments = json.dumps(as_written, indent=4)
    assert json.loads(model_arguments) == json.loads(API_CALL.arguments)
    in_model_words = [
        SYSTEM,
        USER,
        _assistant(None, Call("get_weather", model_arguments)),
        TOOL_RESULT,
    ]
    assert tokenizer.decode(verdict.prompt_ids) == tokenizer.decode(ids(in_model_words))


def test_every_earlier_reply_stays_in_the_models_tokens_turn_after_turn(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    """Three turns, each reply sent back compact: each prompt is checked against
    the one the engine ran before (its replies already repaired), so each starts
    with all the engine held, and the last decodes to the conversation with every
    call as the model wrote it."""
    tokenizer = smollm2_tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def ids(messages: list[Any]) -> list[int]:
        return _prompt_ids(tokenizer, tool_template, messages)

    cities = ["Paris", "Rome", "Oslo"]
    sent: list[Any] = [SYSTEM, USER]
    in_model_words: list[Any] = [SYSTEM, USER]
    held: HeldTurn | None = None
    for turn, city in enumerate(cities):
        rendered = ids(sent)
        verdict = check_prompt(
            held, rendered, sent, [WEATHER], end_of_turn_id=end, repair=True, max_prompt_tokens=4096
        )
        ran = rendered if verdict is None else verdict.prompt_ids
        if held is not None:
            assert verdict is not None and verdict.check.repaired, (turn, verdict)
            assert ran[: len(held.held_ids)] == held.held_ids
        assert tokenizer.decode(ran) == tokenizer.decode(ids(in_model_words))
        written = json.dumps({"city": city}, indent=4)
        text = f'<tool_call>\n{{"name": "get_weather", "arguments": {written}}}\n</tool_call>'
        output = [*tokenizer(text, add_special_tokens=False)["input_ids"], end]
        returned = Call("get_weather", json.dumps({"city": city}))
        held = HeldTurn(
            ran,
            output,
            list(sent),
            [WEATHER],
            lambda returned=returned: Reply(None, (returned,)),
            None if ran == rendered else rendered,
        )
        result = {"role": "tool", "tool_call_id": "call_1", "content": f"18 C in {city}"}
        sent = [*sent, _assistant(None, returned), result]
        in_model_words = [
            *in_model_words,
            _assistant(None, Call("get_weather", written)),
            result,
        ]


def test_the_rounds_the_server_ran_go_back_where_a_library_left_them_out(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    """The server ran a hosted call and the model answered; the library keeps only
    the answer. The next prompt gets the server's call and result back before the
    answer (what the model read when it wrote it), in the model's own tokens, so
    it starts with everything the engine held; a client that edited the answer,
    or a held turn the client's messages wrote entirely, is not repaired."""
    tokenizer = smollm2_tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def ids(messages: list[Any]) -> list[int]:
        return _prompt_ids(tokenizer, tool_template, messages)

    answer = "It is 18 degrees in Paris."
    executed = [_assistant(None, API_CALL), TOOL_RESULT]
    last_round = [SYSTEM, USER, *executed]
    run = ids(last_round)
    output = [*tokenizer(answer, add_special_tokens=False)["input_ids"], end]
    held = HeldTurn(
        run, output, last_round, [WEATHER], lambda: Reply(answer), server_added=len(executed)
    )
    follow_up = {"role": "user", "content": "And tomorrow?"}
    kept_by_library = [SYSTEM, USER, _assistant(answer), follow_up]
    prompt = ids(kept_by_library)

    verdict = check_prompt(
        held, prompt, kept_by_library, [WEATHER], end_of_turn_id=end, repair=True,
        max_prompt_tokens=4096,
    )  # fmt: skip
    assert verdict is not None and verdict.check.repaired
    assert verdict.check.cause is BreakCause.SERVER_ROUNDS_LEFT_OUT
    assert verdict.prompt_ids[: len(held.held_ids)] == held.held_ids
    as_the_model_read_it = [*last_round, _assistant(answer), follow_up]
    assert tokenizer.decode(verdict.prompt_ids) == tokenizer.decode(ids(as_the_model_read_it))

    edited = [SYSTEM, USER, _assistant("It is warm."), follow_up]
    verdict = check_prompt(
        held, ids(edited), edited, [WEATHER], end_of_turn_id=end, repair=True,
        max_prompt_tokens=4096,
    )  # fmt: skip
    assert verdict is not None and not verdict.check.repaired
    assert verdict.check.cause is not BreakCause.SERVER_ROUNDS_LEFT_OUT

    written_by_client = HeldTurn(run, output, last_round, [WEATHER], lambda: Reply(answer))
    verdict = check_prompt(
        written_by_client, prompt, kept_by_library, [WEATHER], end_of_turn_id=end,
        repair=True, max_prompt_tokens=4096,
    )  # fmt: skip
    assert verdict is not None and not verdict.check.repaired
    assert verdict.check.cause is BreakCause.HISTORY_TRUNCATED


def test_the_rounds_the_server_ran_go_back_question_after_question(
    smollm2_tokenizer: PreTrainedTokenizerBase, tool_template: str
) -> None:
    """Three questions, each answered after a hosted call the server ran, the
    library keeping only the answers: each next prompt starts with everything the
    engine held (every earlier question's rounds back in place, in the model's
    own tokens) and decodes to the conversation as the model read it."""
    tokenizer = smollm2_tokenizer
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def ids(messages: list[Any]) -> list[int]:
        return _prompt_ids(tokenizer, tool_template, messages)

    kept_by_library: list[Any] = [SYSTEM]
    as_the_model_read_it: list[Any] = [SYSTEM]
    held: HeldTurn | None = None
    for index, city in enumerate(["Paris", "Rome", "Oslo"]):
        question = {"role": "user", "content": f"What is the weather in {city}?"}
        kept_by_library.append(question)
        as_the_model_read_it.append(question)
        rendered = ids(kept_by_library)
        verdict = check_prompt(
            held, rendered, kept_by_library, [WEATHER], end_of_turn_id=end, repair=True,
            max_prompt_tokens=8192,
        )  # fmt: skip
        first_round = rendered if verdict is None else verdict.prompt_ids
        if held is not None:
            assert verdict is not None and verdict.check.repaired, (index, verdict)
            assert verdict.check.cause is BreakCause.SERVER_ROUNDS_LEFT_OUT
            assert first_round[: len(held.held_ids)] == held.held_ids, index
        assert tokenizer.decode(first_round) == tokenizer.decode(ids(as_the_model_read_it))

        # The model writes the call over several lines; the server runs it and
        # continues: its second round's prompt is the first round's with the call
        # (in the model's own tokens) and the result.
        written = json.dumps({"city": city}, indent=4)
        text = f'<tool_call>\n{{"name": "get_weather", "arguments": {written}}}\n</tool_call>'
        call_output = [*tokenizer(text, add_special_tokens=False)["input_ids"], end]
        call = Call("get_weather", json.dumps({"city": city}))
        result = {"role": "tool", "tool_call_id": "call_1", "content": f"18 C in {city}"}
        executed = [_assistant(None, call), result]
        round_messages = [*kept_by_library, *executed]
        round_rendered = ids(round_messages)
        first_held = HeldTurn(
            first_round, call_output, kept_by_library, [WEATHER],
            lambda call=call: Reply(None, (call,)),
            None if first_round == rendered else rendered,
        )  # fmt: skip
        round_verdict = check_prompt(
            first_held, round_rendered, round_messages, [WEATHER], end_of_turn_id=end,
            repair=True, max_prompt_tokens=8192,
        )  # fmt: skip
        assert round_verdict is not None and round_verdict.check.repaired, index
        second_round = round_verdict.prompt_ids
        as_the_model_read_it += [_assistant(None, Call("get_weather", written)), result]
        assert tokenizer.decode(second_round) == tokenizer.decode(ids(as_the_model_read_it))

        answer = f"It is 18 degrees in {city}."
        output = [*tokenizer(answer, add_special_tokens=False)["input_ids"], end]
        held = HeldTurn(
            second_round, output, round_messages, [WEATHER],
            lambda answer=answer: Reply(answer),
            None if second_round == round_rendered else round_rendered,
            server_added=len(executed),
        )  # fmt: skip
        kept_by_library.append(_assistant(answer))
        as_the_model_read_it.append(_assistant(answer))
