"""Hosted tools for the speculation benchmark and its tests: a records service
whose latency is configured (option `latency_s`), so tool time can be set
against the model's generation time. Optional `ledger`: a file that gets one
line per run, to count runs."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from toolworkers.builtin_tools import string_parameter
from toolworkers.registry import hosted_tool


def record_text(key: str) -> str:
    """The record stored under `key` (deterministic, a few lines of text)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return (
        f"record {key}\n"
        f"owner: team-{digest[:4]}\n"
        f"status: {('open', 'closed', 'blocked')[int(digest[4], 16) % 3]}\n"
        f"updated: 2026-{int(digest[5:7], 16) % 12 + 1:02d}-{int(digest[7:9], 16) % 28 + 1:02d}"
    )


@hosted_tool(
    name="lookup_record",
    description="Look up a record of the records service by its key.",
    parameters=string_parameter("key", "The record's key, e.g. 'INC-2041'"),
    side_effect_free=True,
    timeout_s=30.0,
)
def lookup_record(key: str, *, latency_s: float = 1.0, ledger: str | None = None) -> str:
    time.sleep(latency_s)
    if ledger:
        with Path(ledger).open("a") as log:
            log.write(key + "\n")
    return record_text(key)
