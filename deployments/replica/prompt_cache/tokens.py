"""Tokenize only what a turn adds: an agent's next prompt is its last prompt plus
the reply and the tool results, so the token ids of the part already seen are
kept and only the new suffix is tokenized.

The join is exact because the cache only ever splits a prompt where one of the
tokenizer's special tokens starts (a chat template's turn marker, such as
`<|im_start|>`): a tokenizer cuts its input at special tokens before anything
else, so the ids of the text before a special token do not depend on the text
after it. Which tokens qualify is the adapter's call (`frontend.py`
beside it), and `JoinAudit` checks joins against a full tokenization.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptSplit:
    """A prompt cut at a special token: the ids of the part before it, known, and
    the text from it on, to tokenize."""

    prefix_ids: Sequence[int]
    suffix: str


class PrefixTokenCache:
    """Token ids of prompt prefixes that end right before a boundary token,
    least recently used first out, bounded by the ids it holds. Thread-safe (the
    front end tokenizes on a thread pool)."""

    def __init__(self, boundary_tokens: Mapping[str, int], max_cached_tokens: int):
        if not boundary_tokens:
            raise ValueError("a prefix token cache needs at least one boundary token")
        self._boundary_ids = frozenset(boundary_tokens.values())
        self._id_of = dict(boundary_tokens)
        # Longest first: where two boundary tokens start alike, the tokenizer
        # matches the longer one.
        self._boundary = re.compile(
            "|".join(re.escape(token) for token in sorted(boundary_tokens, key=len, reverse=True))
        )
        self._max_cached_tokens = max_cached_tokens
        self._entries: OrderedDict[str, array[int]] = OrderedDict()
        self._entries_by_length: dict[int, int] = {}
        self._cached_tokens = 0
        self._lock = threading.Lock()

    @property
    def cached_tokens(self) -> int:
        return self._cached_tokens

    def __len__(self) -> int:
        return len(self._entries)

    def split(self, prompt: str) -> PromptSplit | None:
        """The longest cached prefix of `prompt` that ends where a boundary token
        of `prompt` starts, or None."""
        with self._lock:
            if not self._entries:
                return None
            starts = [
                match.start()
                for match in self._boundary.finditer(prompt)
                if match.start() in self._entries_by_length
            ]
            for start in reversed(starts):
                prefix = prompt[:start]
                ids = self._entries.get(prefix)
                if ids is not None:
                    self._entries.move_to_end(prefix)
                    return PromptSplit(prefix_ids=ids, suffix=prompt[start:])
        return None

    def remember(self, prompt: str, token_ids: Sequence[int]) -> None:
        """Keep the ids of `prompt` up to its last boundary token (the next turn
        starts its additions there: the reply opens a new turn of the template)."""
        last = max(self._boundary.finditer(prompt), key=lambda match: match.start(), default=None)
        if last is None or last.start() == 0:
            return
        boundary_index = _last_index_of(token_ids, self._boundary_ids)
        if boundary_index is None or token_ids[boundary_index] != self._id_of[last.group()]:
            return
        prefix = prompt[: last.start()]
        ids = array("i", token_ids[:boundary_index])
        if len(ids) > self._max_cached_tokens:
            return
        with self._lock:
            if prefix in self._entries:
                self._entries.move_to_end(prefix)
                return
            self._entries[prefix] = ids
            self._entries_by_length[len(prefix)] = self._entries_by_length.get(len(prefix), 0) + 1
            self._cached_tokens += len(ids)
            while self._cached_tokens > self._max_cached_tokens:
                self._evict_oldest()

    def _evict_oldest(self) -> None:
        prefix, ids = self._entries.popitem(last=False)
        self._cached_tokens -= len(ids)
        remaining = self._entries_by_length[len(prefix)] - 1
        if remaining:
            self._entries_by_length[len(prefix)] = remaining
        else:
            del self._entries_by_length[len(prefix)]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._entries_by_length.clear()
            self._cached_tokens = 0


def _last_index_of(token_ids: Sequence[int], wanted: frozenset[int]) -> int | None:
    for index in range(len(token_ids) - 1, -1, -1):
        if token_ids[index] in wanted:
            return index
    return None


class JoinAudit:
    """Which joined tokenizations to check against a full one: the first
    `first`, then one in `every` (0: no more). One mismatch turns the cache off
    for good: the tokenizer does not split at these tokens as assumed."""

    def __init__(self, first: int, every: int):
        self._first = first
        self._every = every
        self._joins = 0
        self._lock = threading.Lock()
        self.failed = False

    def should_check(self) -> bool:
        with self._lock:
            self._joins += 1
            joins = self._joins
        if joins <= self._first:
            return True
        return self._every > 0 and (joins - self._first) % self._every == 0

    def record(self, matched: bool) -> None:
        if not matched:
            self.failed = True
