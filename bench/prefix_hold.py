"""How much of what a program's last request left in the engine its next request
found in the cache: per returning request, the cached prompt tokens the server
reported against the previous request's prompt and reply (the context the engine
held for the program), and the prompt tokens computed again. Pure: figures from
the run's request records."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from bench.records import RequestRecord

HELD_TARGET = 0.95
"""A returning request meets the target when this share of the previous
request's prompt and reply was served from the cache."""


@dataclass(frozen=True)
class ReturningRequest:
    """A request after the first of its program, with the one before it."""

    request: RequestRecord
    previous: RequestRecord

    @property
    def held_context(self) -> int | None:
        """Tokens the engine held after the previous request: its prompt and its
        reply but the last token (sampled, never computed). None when the server
        ran calls within it: its usage sums several rounds."""
        if self.previous.server_ran_calls:
            return None
        return self.previous.prompt_tokens + max(self.previous.completion_tokens - 1, 0)

    def held_share(self) -> float | None:
        """Share of the held context served from the cache."""
        held = self.held_context
        if not held or self.request.cached_tokens is None:
            return None
        return min(1.0, self.request.cached_tokens / held)

    def held_share_of_blocks(self, block_size: int) -> float | None:
        """The same, of the held context's full blocks (all a block cache can keep)."""
        held = self.held_context
        if held is None or self.request.cached_tokens is None:
            return None
        full_blocks = held // block_size * block_size
        return min(1.0, self.request.cached_tokens / full_blocks) if full_blocks else None

    @property
    def recomputed_tokens(self) -> int:
        return self.request.prompt_tokens - (self.request.cached_tokens or 0)


def returning_requests(requests: Iterable[RequestRecord]) -> list[ReturningRequest]:
    """Each answered request whose program's previous request was answered too."""
    by_turn = {
        (record.repeat, record.program_id, record.turn_index): record
        for record in requests
        if record.error is None
    }
    pairs = []
    for (repeat, program, turn), record in sorted(by_turn.items()):
        previous = by_turn.get((repeat, program, turn - 1))
        if turn > 0 and previous is not None:
            pairs.append(ReturningRequest(record, previous))
    return pairs


def prefix_outcome(header: str | None) -> str | None:
    """`held`, `repaired: CAUSE` or `broken: CAUSE` from `X-Toolserve-Prefix`."""
    if not header:
        return None
    result, *fields = (part.strip() for part in header.split(";"))
    cause = next((f.partition("=")[2] for f in fields if f.startswith("cause=")), None)
    return f"{result}: {cause}" if cause else result


def _figures(pairs: Sequence[ReturningRequest], block_size: int) -> dict[str, Any]:
    shares = [share for pair in pairs if (share := pair.held_share()) is not None]
    block_shares = [
        share for pair in pairs if (share := pair.held_share_of_blocks(block_size)) is not None
    ]
    outcomes = Counter(
        outcome for pair in pairs if (outcome := prefix_outcome(pair.request.prefix))
    )
    return {
        "returning_requests": len(pairs),
        "measured_requests": len(shares),
        "held_share_mean": fmean(shares) if shares else None,
        "held_share_min": min(shares) if shares else None,
        "at_target_share": (
            sum(share >= HELD_TARGET for share in shares) / len(shares) if shares else None
        ),
        "held_share_of_blocks_mean": fmean(block_shares) if block_shares else None,
        "recomputed_tokens_mean": (
            fmean(pair.recomputed_tokens for pair in pairs) if pairs else None
        ),
        "prefix_checks": dict(sorted(outcomes.items())),
    }


def prefix_hold(requests: Iterable[RequestRecord], block_size: int) -> dict[str, Any]:
    """Figures of every returning request, and by agent kind."""
    pairs = returning_requests(requests)
    by_kind: dict[str, list[ReturningRequest]] = defaultdict(list)
    for pair in pairs:
        by_kind[pair.request.agent_type].append(pair)
    return {
        "all": _figures(pairs, block_size),
        "by_agent_type": {kind: _figures(by_kind[kind], block_size) for kind in sorted(by_kind)},
    }
