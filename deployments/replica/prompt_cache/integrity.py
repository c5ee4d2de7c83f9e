"""Prefix integrity: does a program's new prompt start with what the engine holds
for it (its last prompt and the tokens the model wrote), and if not, where and
why not (pure).

Clients send the whole conversation again each turn. Every token from the first
one that differs from what the engine computed last turn is computed again, and
the KV kept for the program while its tool ran is of no use past that point. The
commonest cause is the server's own: the chat template renders the assistant's
reply from the message the API returned (its calls' arguments re-serialized by
the tool parser), not from the tokens the model wrote. Where the message the
client sends back means what the model wrote, `repaired_prompt` puts the model's
own tokens in its place, so the prefix holds and the model sees the same
conversation.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cluster.openai_protocol import message_tool_calls
from toolworkers.cache_keys import ArgumentsError, canonical_arguments


class BreakCause(StrEnum):
    """Why a new prompt leaves what the engine holds for its program."""

    ASSISTANT_RERENDERED = "assistant_rerendered"
    """The client sent the reply back as the API gave it; the chat template
    renders it differently from the tokens the model wrote."""
    TOOL_ARGUMENTS_RESERIALIZED = "tool_arguments_reserialized"
    """The same calls, their arguments written differently (key order, spacing)."""
    CONTENT_TRIMMED = "content_trimmed"
    """The reply's text with whitespace trimmed from its ends."""
    CONTENT_DROPPED = "content_dropped"
    """The reply's text left out (its calls kept)."""
    REPLY_EDITED = "reply_edited"
    """The reply sent back says something else than the model wrote."""
    REPLY_MISSING = "reply_missing"
    """The earlier conversation is there, the reply that followed it is not."""
    SYSTEM_PROMPT_CHANGED = "system_prompt_changed"
    TOOLS_CHANGED = "tools_changed"
    HISTORY_TRUNCATED = "history_truncated"
    """Earlier messages left out."""
    HISTORY_REORDERED = "history_reordered"
    HISTORY_EDITED = "history_edited"
    """An earlier message (not the system prompt) changed."""
    RENDERED_DIFFERENTLY = "rendered_differently"
    """The same messages and tools, rendered into other tokens (a template that
    puts the date or a random id in the prompt)."""
    SERVER_ROUNDS_LEFT_OUT = "server_rounds_left_out"
    """The calls the server ran and their results (`toolserve.executed_messages`)
    left out before the reply, as client libraries that keep only the reply do."""


REPLY_EQUIVALENT_CAUSES = frozenset(
    {
        BreakCause.ASSISTANT_RERENDERED,
        BreakCause.TOOL_ARGUMENTS_RESERIALIZED,
        BreakCause.CONTENT_TRIMMED,
    }
)
"""How a reply sent back may differ from what the model wrote and still mean it."""
REPAIRABLE_CAUSES = REPLY_EQUIVALENT_CAUSES | {BreakCause.SERVER_ROUNDS_LEFT_OUT}
"""Causes the server repairs: the model's own tokens stand for a reply that means
what it wrote; the rounds the server ran itself go back before it."""


@dataclass(frozen=True)
class Call:
    """A tool call as the API returned it: its name and arguments text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Reply:
    """What the model wrote in a turn, as the API returned it."""

    content: str | None
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True)
class HeldTurn:
    """A program's last turn on this engine: the prompt it computed (token ids),
    the tokens the model wrote, and the request's messages and tools as the client
    sent them. `read_reply` gives the model's tokens as the API returned them; it
    is called only when a prompt has to be told apart from the reply."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]] | None
    read_reply: Callable[[], Reply]
    rendered_prompt_ids: Sequence[int] | None = None
    """The prompt as the front end rendered it, where the engine ran another (its
    earlier replies in the model's own tokens); None: the same."""
    server_added: int = 0
    """How many of `messages`, at their end, the server added itself (the calls it
    ran and their results, in a continued request's later rounds)."""

    @property
    def client_messages(self) -> Sequence[Mapping[str, Any]]:
        """`messages` as the client sent them, without those the server added."""
        return self.messages[: len(self.messages) - self.server_added]

    @property
    def held_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]


@dataclass(frozen=True)
class PrefixCheck:
    """A prompt against what the engine held for its program. `divergence` is the
    first position where they differ (None: the prompt starts with all of it);
    `tokens_recomputed` is how many held tokens the prompt run does not reuse
    (none once repaired: the repaired prompt starts with all of them)."""

    held_tokens: int
    divergence: int | None
    cause: BreakCause | None
    repaired: bool = False

    @property
    def broken(self) -> bool:
        return self.divergence is not None

    @property
    def tokens_recomputed(self) -> int:
        if self.divergence is None or self.repaired:
            return 0
        return self.held_tokens - self.divergence

    def as_json(self) -> dict[str, Any]:
        return {
            "held_tokens": self.held_tokens,
            "first_divergent_position": self.divergence,
            "cause": None if self.cause is None else str(self.cause),
            "tokens_recomputed": self.tokens_recomputed,
            "repaired": self.repaired,
        }


def first_divergence(held: Sequence[int], prompt: Sequence[int]) -> int | None:
    """The first position of `held` that `prompt` does not repeat; None when the
    prompt starts with all of `held`."""
    held_ids, prompt_ids = array("i", held), array("i", prompt[: len(held)])
    if held_ids == prompt_ids:
        return None
    # Bisect on whole-slice comparisons, which run in C: the common prefix is
    # the longest one the two agree on.
    low, high = 0, min(len(held_ids), len(prompt_ids))
    while low < high:
        middle = (low + high + 1) // 2
        if held_ids[:middle] == prompt_ids[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _role(message: Mapping[str, Any]) -> str:
    return str(message.get("role", ""))


def _text(message: Mapping[str, Any]) -> str | None:
    """A message's text: its content string, or its text parts joined."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return str(content)


def _calls(message: Mapping[str, Any]) -> tuple[Call, ...]:
    return tuple(Call(call.name, call.arguments) for call in message_tool_calls(dict(message)))


def _same_calls(a: Sequence[Call], b: Sequence[Call]) -> bool:
    """The same functions with the same arguments once parsed and normalized."""
    if [call.name for call in a] != [call.name for call in b]:
        return False
    try:
        return all(
            canonical_arguments(x.arguments) == canonical_arguments(y.arguments)
            for x, y in zip(a, b, strict=True)
        )
    except ArgumentsError:
        return False


def reply_cause(sent: Mapping[str, Any], reply: Reply) -> BreakCause:
    """How the assistant message a client sent back differs from the model's reply."""
    sent_calls = _calls(sent)
    if not _same_calls(sent_calls, reply.calls):
        return BreakCause.REPLY_EDITED
    sent_text, model_text = _text(sent) or "", reply.content or ""
    if sent_text != model_text:
        if sent_text.strip() == model_text.strip():
            return BreakCause.CONTENT_TRIMMED
        if not sent_text.strip() and reply.calls:
            return BreakCause.CONTENT_DROPPED
        return BreakCause.REPLY_EDITED
    if sent_calls != reply.calls:
        return BreakCause.TOOL_ARGUMENTS_RESERIALIZED
    return BreakCause.ASSISTANT_RERENDERED


def _history_cause(
    earlier: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
) -> BreakCause | None:
    """How `messages` fails to start with the earlier turn's messages (None: it does)."""
    before = [_canonical(message) for message in earlier]
    now = [_canonical(message) for message in messages]
    if now[: len(before)] == before:
        return None
    if (
        before
        and now
        and _role(earlier[0]) in {"system", "developer"}
        and before[0] != now[0]
        and before[1:] == now[1 : len(before)]
    ):
        return BreakCause.SYSTEM_PROMPT_CHANGED
    if sorted(now[: len(before)]) == sorted(before):
        return BreakCause.HISTORY_REORDERED
    earlier_ones = set(before)
    last_kept = max((i for i, message in enumerate(now) if message in earlier_ones), default=-1)
    kept = now[: last_kept + 1]
    in_order = iter(before)
    # Up to the last earlier message still sent, nothing new and nothing out of
    # order: some were left out.
    if all(message in earlier_ones for message in kept) and all(
        message in in_order for message in kept
    ):
        return BreakCause.HISTORY_TRUNCATED
    return BreakCause.HISTORY_EDITED


def break_cause(
    held: HeldTurn,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    divergence: int,
) -> BreakCause:
    """Why a prompt leaves `held` at `divergence`, from the messages and tools the
    client sent then and now."""
    if _canonical(list(tools or ())) != _canonical(list(held.tools or ())):
        return BreakCause.TOOLS_CHANGED
    if held.server_added and _history_cause(held.client_messages, messages) is None:
        following = messages[len(held.client_messages) : len(held.client_messages) + 1]
        if (
            following
            and _role(following[0]) == "assistant"
            and reply_cause(following[0], held.read_reply()) in REPLY_EQUIVALENT_CAUSES
        ):
            return BreakCause.SERVER_ROUNDS_LEFT_OUT
    history = _history_cause(held.messages, messages)
    if history is not None:
        return history
    if divergence < len(held.prompt_ids):
        return BreakCause.RENDERED_DIFFERENTLY
    following = messages[len(held.messages) : len(held.messages) + 1]
    if not following or _role(following[0]) != "assistant":
        return BreakCause.REPLY_MISSING
    return reply_cause(following[0], held.read_reply())


def repaired_prompt(
    held: HeldTurn, prompt_ids: Sequence[int], end_of_turn_id: int, reply_from: int | None = None
) -> list[int] | None:
    """The prompt with the model's own tokens in place of the rendering of the
    reply that follows `held`'s prompt: `held`'s prompt, the model's tokens closed
    by `end_of_turn_id`, then the prompt from the end of that reply's turn. None
    where the prompt does not start with `held`'s prompt or has no end to the
    reply's turn. The caller decides the reply means what the model wrote.

    `reply_from`: where in the prompt the reply's turn is, where the prompt has
    it before the end of `held`'s prompt (the client left out the rounds the
    server ran, which `held`'s prompt ends with): the prompt must repeat `held`'s
    up to there, where every turn of the client's messages before the reply has
    ended, and the reply's turn ends at the first end of turn from there."""
    start = len(held.prompt_ids) if reply_from is None else reply_from
    if list(prompt_ids[:start]) != list(held.prompt_ids[:start]) or not held.output_ids:
        return None
    # The reply's turn must be the one after every turn before the server's rounds.
    turns_before_rounds = list(held.prompt_ids).count(end_of_turn_id) - held.server_added
    if (
        reply_from is not None
        and list(prompt_ids[:start]).count(end_of_turn_id) != turns_before_rounds
    ):
        return None
    output = list(held.output_ids)
    if end_of_turn_id in output[:-1]:
        return None
    try:
        end = list(prompt_ids).index(end_of_turn_id, start)
    except ValueError:
        return None
    if output[-1] != end_of_turn_id:
        output.append(end_of_turn_id)
    return [*held.prompt_ids, *output, *prompt_ids[end + 1 :]]


@dataclass(frozen=True)
class Verdict:
    """A prompt checked: what was found, and the prompt to run; `rewritten` when
    that is not the prompt as it came (a repair, or earlier ones carried on)."""

    check: PrefixCheck
    prompt_ids: list[int]
    rewritten: bool = False


def carried_repairs(
    held: HeldTurn, prompt_ids: Sequence[int], end_of_turn_id: int | None = None
) -> list[int] | None:
    """The prompt with the earlier turns' repairs carried on: where it starts with
    the last prompt as the front end rendered it, that part as the engine ran it.
    Where the last prompt ends with rounds the server added and the client left
    them out, the prompt follows the rendered one up to those rounds only, and
    from there is the client's: the part before the rounds as the engine ran it
    (found by its turns' ends, `end_of_turn_id`, where the rounds themselves were
    repaired too), then the prompt from where it leaves the rounds. None where
    there is nothing to carry (no repair, or another start)."""
    rendered = held.rendered_prompt_ids
    if rendered is None:
        return None
    shared = first_divergence(rendered, prompt_ids)
    if shared is None:
        return [*held.prompt_ids, *prompt_ids[len(rendered) :]]
    if not held.server_added:
        return None
    unchanged_tail = _common_suffix(rendered, held.prompt_ids)
    if shared >= len(rendered) - unchanged_tail:
        shift = len(held.prompt_ids) - len(rendered)
        return [*held.prompt_ids[: shared + shift], *prompt_ids[shared:]]
    if end_of_turn_id is None:
        return None
    rounds_rendered = _rounds_start(rendered, held.server_added, end_of_turn_id)
    rounds_run = _rounds_start(held.prompt_ids, held.server_added, end_of_turn_id)
    if rounds_rendered is None or rounds_run is None or shared < rounds_rendered:
        return None
    into_rounds = shared - rounds_rendered
    if list(held.prompt_ids[rounds_run : rounds_run + into_rounds]) != list(
        rendered[rounds_rendered:shared]
    ):
        return None
    return [*held.prompt_ids[: rounds_run + into_rounds], *prompt_ids[shared:]]


def _rounds_start(ids: Sequence[int], rounds: int, end_of_turn_id: int) -> int | None:
    """Where the last `rounds` turns begin: just past the end of the turn before
    them (the prompt ends with an open turn, the generation's, which has no end)."""
    ends = [position for position, token in enumerate(ids) if token == end_of_turn_id]
    if len(ends) < rounds:
        return None
    return 0 if len(ends) == rounds else ends[len(ends) - rounds - 1] + 1


def _common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens `a` and `b` end with alike."""
    length = min(len(a), len(b))
    differs = first_divergence(a[len(a) - length :][::-1], b[len(b) - length :][::-1])
    return length if differs is None else differs


class HeldTurns:
    """Each program's last turn on this engine, least recently used out first,
    bounded by the tokens held (keep their ids as `array("i")`: 4 bytes each).
    Thread-safe."""

    def __init__(self, max_held_tokens: int):
        self._max_held_tokens = max_held_tokens
        self._turns: OrderedDict[str, HeldTurn] = OrderedDict()
        self._held_tokens = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._turns)

    @property
    def held_tokens(self) -> int:
        return self._held_tokens

    def get(self, program_id: str) -> HeldTurn | None:
        with self._lock:
            return self._turns.get(program_id)

    def put(self, program_id: str, turn: HeldTurn) -> None:
        size = _held_size(turn)
        with self._lock:
            self._drop(program_id)
            if size > self._max_held_tokens:
                return
            self._turns[program_id] = turn
            self._held_tokens += size
            while self._held_tokens > self._max_held_tokens:
                self._drop(next(iter(self._turns)))

    def forget(self, program_id: str) -> None:
        with self._lock:
            self._drop(program_id)

    def _drop(self, program_id: str) -> None:
        turn = self._turns.pop(program_id, None)
        if turn is not None:
            self._held_tokens -= _held_size(turn)


def _held_size(turn: HeldTurn) -> int:
    return len(turn.prompt_ids) + len(turn.output_ids) + len(turn.rendered_prompt_ids or ())


def check_prompt(
    held: HeldTurn | None,
    prompt_ids: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    end_of_turn_id: int | None,
    repair: bool,
    max_prompt_tokens: int,
) -> Verdict | None:
    """A prompt against its program's held turn (None: nothing held to check
    against). Repaired where `repair` is on, the cause is one the model's own
    tokens may stand for, and the repaired prompt is no longer than
    `max_prompt_tokens`."""
    if held is None:
        return None
    as_sent = list(prompt_ids)
    carried = carried_repairs(held, as_sent, end_of_turn_id) if repair else None
    if carried is not None and len(carried) > max_prompt_tokens:
        carried = None
    prompt = as_sent if carried is None else carried
    held_ids = held.held_ids
    divergence = first_divergence(held_ids, prompt)
    if divergence is None:
        return Verdict(PrefixCheck(len(held_ids), None, None), prompt, carried is not None)
    cause = break_cause(held, messages, tools, divergence)
    found = Verdict(PrefixCheck(len(held_ids), divergence, cause), prompt, carried is not None)
    if not repair or cause not in REPAIRABLE_CAUSES or end_of_turn_id is None:
        return found
    reply_from = divergence if cause is BreakCause.SERVER_ROUNDS_LEFT_OUT else None
    repaired = repaired_prompt(held, prompt, end_of_turn_id, reply_from)
    if repaired is None or len(repaired) > max_prompt_tokens:
        return found
    return Verdict(PrefixCheck(len(held_ids), divergence, cause, repaired=True), repaired, True)
