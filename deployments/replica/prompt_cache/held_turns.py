"""The replica's side of prefix integrity: each program's last turn kept from the
engine's own outputs, each new prompt of the program checked (and repaired) on
its way into the engine, and what was found counted and handed to the turn.

vLLM's chat front end renders and tokenizes a request, then calls its engine
client's `generate` with the token ids and the request's `session_id` (the
program). toolserve wraps that one method of the replica's engine; the request's
messages reach it through `TURN_PROMPT`, which the model server sets around each
request it sends through the front end.
"""

from __future__ import annotations

import copy
import logging
from array import array
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from cluster.config import PrefixIntegrityConfig
from deployments.replica.prompt_cache.integrity import (
    Call,
    HeldTurn,
    HeldTurns,
    PrefixCheck,
    Reply,
    check_prompt,
)
from deployments.turn import is_last_step

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.outputs import RequestOutput
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger("toolserve.prefix_integrity")


@dataclass
class TurnPrompt:
    """A request on its way through the front end, with its messages and tools as
    the client sent them (the front end rewrites calls' arguments in place while
    it renders); `check` is what its prompt was found to be against its program's
    last turn (None: nothing to check against)."""

    request: ChatCompletionRequest
    messages: list[Mapping[str, Any]]
    tools: list[Mapping[str, Any]] | None
    server_added: int = 0
    """Messages at the end of `messages` the server added (a continued request's
    calls and their results)."""
    check: PrefixCheck | None = None

    @property
    def prefix(self) -> dict[str, Any] | None:
        return None if self.check is None else self.check.as_json()


TURN_PROMPT: ContextVar[TurnPrompt | None] = ContextVar("toolserve_turn_prompt", default=None)


@contextmanager
def turn_prompt(request: ChatCompletionRequest, server_added: int = 0) -> Iterator[TurnPrompt]:
    """Marks the request the front end is preparing, for the engine's `generate`."""
    turn = TurnPrompt(request, _json_messages(request), _json_tools(request), server_added)
    token = TURN_PROMPT.set(turn)
    try:
        yield turn
    finally:
        TURN_PROMPT.reset(token)


def watched_prompt(
    prefixes: PrefixIntegrity | None, request: ChatCompletionRequest, server_added: int = 0
) -> AbstractContextManager[TurnPrompt | None]:
    """`turn_prompt` for a program's request on a replica that checks prefixes;
    nothing (and no copy of the conversation) for any other."""
    if prefixes is None or not request.session_id:
        return nullcontext(None)
    return turn_prompt(request, server_added)


class PrefixMetrics:
    def __init__(self) -> None:
        from ray.serve.metrics import Counter

        self._checks = Counter(
            "toolserve_prefix_checks",
            description="Prompts of returning programs by what they did with the engine's "
            "last turn of the program (held: started with all of it; repaired: parted "
            "from it, and the model's own tokens were put back; broken).",
            tag_keys=("result",),
        )
        self._breaks = Counter(
            "toolserve_prefix_breaks",
            description="Prompts that parted from their program's last turn, by cause and "
            "whether the replica repaired them.",
            tag_keys=("cause", "repaired"),
        )
        self._recomputed = Counter(
            "toolserve_prefix_tokens_recomputed",
            description="Tokens of programs' last turns that their next prompts computed "
            "again, because the prompt parted from them.",
        )

    def checked(self, check: PrefixCheck) -> None:
        if not check.broken:
            self._checks.inc(1, tags={"result": "held"})
            return
        self._checks.inc(1, tags={"result": "repaired" if check.repaired else "broken"})
        self._breaks.inc(
            1, tags={"cause": str(check.cause), "repaired": "true" if check.repaired else "false"}
        )
        if check.tokens_recomputed:
            self._recomputed.inc(check.tokens_recomputed)


@dataclass(frozen=True)
class HeldTurnParts:
    """What a program's request leaves to keep once the engine has answered it."""

    program_id: str
    prompt_ids: list[int]
    rendered_prompt_ids: list[int] | None
    messages: list[Mapping[str, Any]]
    tools: list[Mapping[str, Any]] | None
    request: ChatCompletionRequest
    server_added: int


def _json_messages(request: ChatCompletionRequest) -> list[Mapping[str, Any]]:
    return copy.deepcopy([dict(message) for message in request.messages])


def _json_tools(request: ChatCompletionRequest) -> list[Mapping[str, Any]] | None:
    if request.tools is None:
        return None
    return [tool.model_dump(mode="json", exclude_none=True) for tool in request.tools]


def _tokens_asked(request: ChatCompletionRequest, sampling_params: SamplingParams) -> int:
    """Room a repaired prompt leaves for the reply: the tokens the client asked
    for; without a limit of its own, one (the front end's default fills the
    context left by the prompt as sent, and the engine ends the reply where the
    context ends)."""
    if request.max_completion_tokens is None and request.max_tokens is None:
        return 1
    return sampling_params.max_tokens or 1


def _forces_a_call(request: ChatCompletionRequest) -> bool:
    return request.tool_choice == "required" or isinstance(request.tool_choice, BaseModel)


class PrefixIntegrity:
    """Wraps one engine's `generate`: a program's prompt is checked against its
    last turn here and repaired where `config` allows; a turn that ends is kept."""

    def __init__(
        self,
        engine: AsyncLLM,
        config: PrefixIntegrityConfig,
        tool_call_parser: str,
        max_model_len: int,
    ):
        self._engine = engine
        self._config = config
        self._max_model_len = max_model_len
        self._held = HeldTurns(config.max_held_tokens)
        self._metrics = PrefixMetrics()
        self._generate: Callable[..., AsyncIterator[RequestOutput]] = engine.generate
        tokenizer = engine.renderer.get_tokenizer()
        self._tokenizer = tokenizer
        self._end_of_turn_id: int | None = getattr(tokenizer, "eos_token_id", None)
        from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

        self._parser_class = ToolParserManager.get_tool_parser(tool_call_parser)
        # vLLM forces a call through the parser's own format where the parser has
        # structural tags, else as bare JSON arguments.
        self._forced_calls_are_bare = bool(self._parser_class.supports_required_and_named)

    def install(self) -> None:
        self._engine.generate = self.generate

    def forget(self, program_id: str) -> None:
        self._held.forget(program_id)

    def generate(
        self,
        prompt: Any,
        sampling_params: SamplingParams,
        request_id: str,
        *args: Any,
        **kwargs: Any,
    ) -> AsyncIterator[RequestOutput]:
        program_id = kwargs.get("session_id")
        turn = TURN_PROMPT.get()
        if (
            turn is None
            or not program_id
            or not isinstance(prompt, dict)
            or prompt.get("type") != "token"
            or getattr(sampling_params, "n", 1) != 1
        ):
            return self._generate(prompt, sampling_params, request_id, *args, **kwargs)
        messages, tools = turn.messages, turn.tools
        prompt_ids = prompt["prompt_token_ids"]
        rendered_ids: list[int] | None = None
        try:
            verdict = check_prompt(
                self._held.get(program_id),
                prompt_ids,
                messages,
                tools,
                end_of_turn_id=self._end_of_turn_id,
                # A reply that echoes the prompt or scores its tokens shows them:
                # it gets the prompt as the client's messages render it.
                repair=self._config.repair
                and not (turn.request.echo or turn.request.prompt_logprobs),
                max_prompt_tokens=self._max_model_len
                - _tokens_asked(turn.request, sampling_params),
            )
        except Exception:  # a check that fails leaves the turn as the client sent it
            logger.exception("prefix check of %s failed", program_id)
            verdict = None
        if verdict is not None:
            turn.check = verdict.check
            self._metrics.checked(verdict.check)
            if verdict.rewritten:
                prompt = {
                    key: value for key, value in prompt.items() if key != "prompt_token_offsets"
                } | {"prompt_token_ids": verdict.prompt_ids}
                rendered_ids, prompt_ids = prompt_ids, verdict.prompt_ids
        outputs = self._generate(prompt, sampling_params, request_id, *args, **kwargs)
        if is_last_step(turn.request) or (
            self._forced_calls_are_bare and _forces_a_call(turn.request)
        ):
            # No next turn to check; or the model writes a forced call's bare
            # arguments, not the template's call format (a parser without
            # structural tags): its tokens cannot stand for the rendered reply,
            # and its calls are not the parser's to read, so the next prompt goes
            # unchecked rather than misnamed.
            self._held.forget(program_id)
            return outputs
        kept = HeldTurnParts(
            program_id, prompt_ids, rendered_ids, messages, tools, turn.request, turn.server_added
        )
        return self._kept(outputs, kept, sampling_params)

    async def _kept(
        self,
        outputs: AsyncIterator[RequestOutput],
        turn: HeldTurnParts,
        sampling_params: SamplingParams,
    ) -> AsyncIterator[RequestOutput]:
        """The engine's outputs, passed on; once the request finishes, the program's
        turn is kept (a request abandoned midway leaves no turn to check against)."""
        from vllm.sampling_params import RequestOutputKind

        deltas = sampling_params.output_kind == RequestOutputKind.DELTA
        output_ids = array("i")
        finished = False
        try:
            async for output in outputs:
                if output.outputs:
                    written = output.outputs[0].token_ids
                    if deltas:
                        output_ids.extend(written)
                    else:
                        output_ids = array("i", written)
                finished = output.finished
                yield output
        finally:
            if finished and output_ids:
                self._held.put(
                    turn.program_id,
                    HeldTurn(
                        array("i", turn.prompt_ids),
                        output_ids,
                        turn.messages,
                        turn.tools,
                        lambda: self._reply(output_ids, turn.request),
                        None
                        if turn.rendered_prompt_ids is None
                        else array("i", turn.rendered_prompt_ids),
                        turn.server_added,
                    ),
                )
            else:
                self._held.forget(turn.program_id)

    def _reply(self, output_ids: array[int], request: ChatCompletionRequest) -> Reply:
        """The model's tokens as the API returned them: its text and calls as the
        front end's tool parser reads them."""
        text = self._tokenizer.decode(list(output_ids), skip_special_tokens=True)
        if not request.tools:
            return Reply(text)
        try:
            parser = self._parser_class(self._tokenizer, request.tools)
            found = parser.extract_tool_calls(text, request)
        except Exception:  # a parser that cannot read it: the reply is its text
            logger.debug("tool parser could not read a kept reply", exc_info=True)
            return Reply(text)
        calls = tuple(
            Call(call.function.name, call.function.arguments) for call in found.tool_calls
        )
        return Reply(found.content, calls)
