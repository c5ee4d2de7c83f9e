"""A replica reading its engine scheduler's counts every few seconds (through
the plugin's utility calls) and recording them as metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

logger = logging.getLogger("toolserve.engine_stats")

STATS_PERIOD_S = 5.0
_Stats = TypeVar("_Stats")


async def poll_engine_stats(
    what: str,
    read: Callable[[], Awaitable[_Stats]],
    record: Callable[[_Stats], None],
    period_s: float = STATS_PERIOD_S,
) -> None:
    while True:
        await asyncio.sleep(period_s)
        try:
            stats = await read()
        except Exception as error:  # the engine may be restarting
            logger.warning("%s stats unavailable: %s", what, error)
            continue
        record(stats)
