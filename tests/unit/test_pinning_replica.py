from pathlib import Path

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
