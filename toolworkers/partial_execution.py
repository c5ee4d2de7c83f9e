"""The partial runs of one streamed round (Conveyor, arXiv 2406.00059): fed the
round's tool-call events as the engine streams the calls, it starts a run for each
call of a hosted partial-input tool as soon as the call names its tool, feeds
the run its pieces, and finishes it when the call's arguments close, so the tool
works while the model is still decoding. The continuation then takes each run's
outcome instead of running the call after the round."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from toolworkers.cache_keys import ArgumentsError, normalized_arguments
from toolworkers.call_stream import CallClosed, CallEvent, CallMalformed, CallStarted
from toolworkers.execution import PartialRun, ToolExecutor, ToolOutcome


class PartialExecution:
    """`hosted`: the request's tools the server may run."""

    def __init__(self, executor: ToolExecutor, hosted: set[str]):
        self._executor = executor
        self._hosted = hosted
        self._running: dict[int, PartialRun] = {}
        self._finishing: dict[
            int, tuple[dict[str, Any], PartialRun, asyncio.Task[ToolOutcome | None]]
        ] = {}
        self.started = 0

    async def handle(self, events: list[CallEvent]) -> None:
        """The round's next call events (`toolworkers.call_stream`), in order."""
        for event in events:
            if isinstance(event, CallStarted) and event.name in self._hosted:
                run = self._executor.start_partial(event.name, event.index)
                if run is not None:
                    self._running[event.index] = run
                    self.started += 1
                continue
            run = self._running.get(event.index)
            if run is None:
                continue
            if isinstance(event, CallClosed):
                del self._running[event.index]
                finishing = asyncio.create_task(self._executor.finish_partial(run, event.arguments))
                self._finishing[event.index] = (event.arguments, run, finishing)
            elif isinstance(event, CallMalformed):
                del self._running[event.index]
                await run.abandon(event.reason)
            else:
                await run.feed(event)

    async def outcome(self, index: int, arguments: str | None) -> ToolOutcome | None:
        """The outcome of the round's call `index` if a partial run made it with
        these arguments; None: run the call as usual."""
        entry = self._finishing.pop(index, None)
        if entry is None:
            return None
        ran_with, run, finishing = entry
        try:
            same = normalized_arguments(arguments) == normalized_arguments(ran_with)
        except ArgumentsError:
            same = False
        if not same:
            await self._stop(run, finishing, "the call's final arguments differ")
            return None
        return await finishing

    async def abandon(self) -> None:
        """Stops every run whose outcome nobody will take."""
        for run in self._running.values():
            await run.abandon("the round's calls are not answered by the server")
        self._running.clear()
        for _arguments, run, finishing in self._finishing.values():
            await self._stop(run, finishing, "the round's calls are not answered by the server")
        self._finishing.clear()

    @staticmethod
    async def _stop(
        run: PartialRun, finishing: asyncio.Task[ToolOutcome | None], reason: str
    ) -> None:
        # The statements fed so far run whether or not the finish was sent: the
        # worker's run itself is stopped, not only the wait for its outcome.
        finishing.cancel()
        await run.abandon(reason)
        with contextlib.suppress(asyncio.CancelledError):
            await finishing
