"""Pure: drafts for a request writing a tool call, taken from the calls the
turn's speculation predicted (the speculative tool calls paper's engine side).
Each predicted call is held as the token ids of its whole text, markers
included; while the request writes a call, the n-gram that ends its output is
looked up in the predicted calls, and the tokens that follow the match are
proposed, so a correctly predicted call is verified several tokens a step
instead of decoded one by one. The lookup re-synchronises after any difference
(a space, another key order), as prompt lookup does in the prompt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PredictedCallTokens:
    tool: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class PredictedDraft:
    tool: str
    tokens: list[int]


def predicted_call_text(opening: str, closing: str, call_json: str) -> str:
    """A call as a hermes model writes it: the call's JSON object between the
    markers, each on its own line."""
    return f"{opening}\n{call_json}\n{closing}"


class PredictedCallDrafter:
    def __init__(self, min_match: int, max_match: int):
        if not 1 <= min_match <= max_match:
            raise ValueError("need 1 <= min_match <= max_match")
        self.min_match = min_match
        self.max_match = max_match

    def propose(
        self, predictions: Sequence[PredictedCallTokens], output: Sequence[int], window: int
    ) -> PredictedDraft | None:
        """The continuation, at most `window` tokens, of the longest n-gram ending
        `output` found in a predicted call (the first such call, its first
        occurrence); None where no n-gram of `min_match` or more matches or the
        match ends its call."""
        if window <= 0:
            return None
        longest = min(self.max_match, len(output))
        for size in range(longest, self.min_match - 1, -1):
            tail = tuple(output[len(output) - size :])
            for prediction in predictions:
                start = _find(prediction.tokens, tail)
                if start is None:
                    continue
                follows = prediction.tokens[start + size : start + size + window]
                if follows:
                    return PredictedDraft(prediction.tool, list(follows))
        return None


def _find(tokens: tuple[int, ...], needle: tuple[int, ...]) -> int | None:
    last = len(tokens) - len(needle)
    first = needle[0]
    for start in range(last + 1):
        if tokens[start] == first and tokens[start : start + len(needle)] == needle:
            return start
    return None
