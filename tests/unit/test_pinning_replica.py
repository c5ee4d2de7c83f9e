import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deployments.replica import pinning
from deployments.replica.pinning import (
    profile_cache_path,
    profile_lengths,
    tool_called,
)


def test_tool_called_reads_the_first_call_of_a_reply() -> None:
    reply = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "ls", "arguments": "{}"},
                        },
                        {
                            "id": "c2",
                            "type": "function",
                            "function": {"name": "cat", "arguments": "{}"},
                        },
                    ],
                }
            }
        ]
    }
    assert tool_called(reply) == "ls"
    assert tool_called({"choices": [{"message": {"role": "assistant", "content": "done"}}]}) is None
    assert tool_called({}) is None


def test_profile_cache_path_depends_on_every_setting(tmp_path: Path) -> None:
    base = {"model": "m", "dtype": "float32", "block_size": 64}
    same = profile_cache_path(tmp_path, dict(reversed(list(base.items()))))
    assert profile_cache_path(tmp_path, base) == same
    assert profile_cache_path(tmp_path, base | {"block_size": 32}) != same
    assert same.parent == tmp_path / "prefill-profiles"


def test_profile_lengths_fit_the_engine() -> None:
    configured = [256, 1024, 2048, 4096]
    assert profile_lengths(configured, 8192) == configured
    assert profile_lengths(configured, 4096) == [256, 1024, 2048]
    assert profile_lengths(configured, 2048) == [256, 512, 1024, 1984]


class _ColdStartEngine:
    """Answers each prompt after a delay linear in its length, on a fake clock;
    the first prompt after start-up takes two seconds more (a cold engine)."""

    def __init__(self, clock: list[float]) -> None:
        self._clock = clock
        self.prompt_lengths: list[int] = []

    async def generate(self, prompt: dict[str, Any], *_: Any, **__: Any) -> AsyncIterator[None]:
        length = len(prompt["prompt_token_ids"])
        cold = 2.0 if not self.prompt_lengths else 0.0
        self.prompt_lengths.append(length)
        self._clock[0] += cold + 0.001 * length
        yield None


def test_the_prefill_profile_is_timed_on_a_warm_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(pinning.time, "perf_counter", lambda: clock[0])
    engine = _ColdStartEngine(clock)
    lengths = [256, 1024, 2048]
    replica_pinning = pinning.EnginePinning(
        engine,  # type: ignore[arg-type]
        configured_lengths=lengths,
        max_model_len=8192,
        replica_id="r0",
        redis_url=None,
    )
    profile = asyncio.run(replica_pinning._measure_prefill_profile())
    assert profile is not None
    assert engine.prompt_lengths == [256, *lengths], "one untimed prefill first"
    assert profile.seconds(1024) == pytest.approx(1.024, abs=1e-6)
    assert profile.c == pytest.approx(0.0, abs=1e-6)


def test_a_profile_cached_by_an_earlier_method_is_measured_again(tmp_path: Path) -> None:
    fingerprint = {"model": "m", "lengths": [256, 1024, 2048]}
    earlier = profile_cache_path(tmp_path, fingerprint)
    assert profile_cache_path(tmp_path, fingerprint | {"method": pinning.PROFILE_METHOD}) != earlier
