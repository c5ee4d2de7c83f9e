"""The speculation policy users see and the ledger of what speculation cost: which
tools may run on a guess (a tool with side effects never does), and every
speculative run accounted used or discarded with its tool CPU and the draft's
tokens, per tenant, with the waste per 100 turns."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from cluster.config import HostedToolConfig, SpeculationConfig, ToolsConfig
from deployments.api.speculator import Speculator
from deployments.turn import ReplyHead
from toolworkers.execution import ResultSource, ToolOutcome
from toolworkers.predictor import ObservedCall, PredictedCall
from toolworkers.registry import ToolRegistry
from toolworkers.sandbox import ToolResult
from toolworkers.speculation import (
    DraftWorth,
    Settlement,
    SpeculationPolicy,
    ledger_view,
    run_cost_entry,
    turn_entry,
)

LOOKUP = "bench.tools:lookup_record"
REGISTRY = ToolRegistry.from_config(
    ToolsConfig(
        hosted=[
            HostedToolConfig(function="toolworkers.hosted_tools:calculator"),
            HostedToolConfig(function=LOOKUP),
            HostedToolConfig(function=LOOKUP, name="close_record", side_effect_free=False),
        ]
    )
)


class _Executor:
    """Runs nothing: answers every call at once with the CPU it is given."""

    registry = REGISTRY

    def __init__(
        self,
        cpu_s: float = 0.25,
        source: ResultSource = ResultSource.RAN,
        duration_s: float = 0.3,
    ):
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self._cpu_s = cpu_s
        self._source = source
        self._duration_s = duration_s

    async def call(self, name: str, arguments: dict[str, Any], **options: Any) -> ToolOutcome:
        self.calls.append((name, arguments, options["tenant"]))
        result = ToolResult(True, "ok", None, self._duration_s, cpu_s=self._cpu_s)
        return ToolOutcome(result, self._source)


class _Draft:
    """A draft model that counts what it is asked and, after `answer_s`, answers
    with no call."""

    def __init__(self, answer_s: float) -> None:
        self.asked: list[str] = []
        self._answer_s = answer_s

    def chat(self, request: Any, turn: Any, program_id: str) -> Any:
        self.asked.append(program_id)
        return _DraftStream(self._answer_s)


class _DraftStream:
    def __init__(self, answer_s: float) -> None:
        self._answer_s = answer_s
        self._sent = False

    def __aiter__(self) -> _DraftStream:
        return self

    async def __anext__(self) -> ReplyHead:
        if self._sent:
            raise StopAsyncIteration
        self._sent = True
        await asyncio.sleep(self._answer_s)
        body = {"choices": [{"message": {"role": "assistant", "content": "no call"}}]}
        return ReplyHead("draft-replica", streaming=False, body=body)

    def cancel(self) -> None:
        pass


class _Ledger:
    def __init__(self) -> None:
        self.by_tenant: dict[str, Counter[str]] = {}

    async def add(self, tenant: str, increments: dict[str, int]) -> None:
        self.by_tenant.setdefault(tenant, Counter()).update(increments)

    async def read(self, tenant: str) -> dict[str, int]:
        return dict(self.by_tenant.get(tenant, Counter()))


def _body(tool: str) -> dict[str, Any]:
    schemas = [s for s in REGISTRY.openai_schemas() if s["function"]["name"] == tool]
    return {
        "model": "main",
        "messages": [{"role": "user", "content": "Close the record INC-7."}],
        "tools": schemas,
    }


def _speculator(executor: _Executor, ledger: _Ledger) -> Speculator:
    config = SpeculationConfig(draft_predictions=0, learned_min_support=1)
    return Speculator(config, executor, None, None, None, ledger)  # type: ignore[arg-type]


def _teach_and_start(speculator: Speculator, tool: str, tenant: str = "a") -> list[str]:
    """Three turns that made the same call, then a fourth: its speculated calls."""
    made = [ObservedCall(tool, {"key": "INC-7"})]
    for _ in range(3):
        taught = speculator.start(_body(tool), "p", tenant, launch=False)
        assert taught is not None
        speculator.settle(taught, made)
    turn = speculator.start(_body(tool), "p", tenant, launch=True)
    assert turn is not None
    return turn.issued_call_texts()


def test_the_draft_is_asked_only_for_tools_that_run_longer_than_it_answers() -> None:
    """Once a tool's guessed runs show it runs shorter than the draft takes to
    answer, a turn with nothing learned no longer asks the draft for it: the run
    it could start early saves less than the draft's answer costs. A slow tool
    keeps it asked."""

    async def drafts_asked(run_s: float, answer_s: float) -> list[str]:
        draft = _Draft(answer_s)
        config = SpeculationConfig(learned_min_support=1, draft_min_run_ratio=1.0)
        executor = _Executor(duration_s=run_s)
        speculator = Speculator(config, executor, draft, "draft", None, _Ledger())  # type: ignore[arg-type]
        # A new agent's turn: the draft is asked, and its answer timed.
        first = speculator.start(_body("calculator"), "p0", "a", launch=True)
        assert first is not None and first.task is not None
        await first.task
        assert draft.asked == ["p0"]
        _teach_and_start(speculator, "calculator")
        for _ in range(3):
            await asyncio.sleep(0)
        assert executor.calls, "the learned guess ran"
        draft.asked.clear()
        # Another tenant: nothing learned, so only the draft could predict its call.
        turn = speculator.start(_body("calculator"), "q", "b", launch=True)
        assert turn is not None and turn.task is not None
        await turn.task
        policy = speculator.policies()["calculator"]
        assert policy["typical_run_s"] == run_s
        assert policy["typical_draft_answer_s"] >= answer_s
        return draft.asked

    assert asyncio.run(drafts_asked(run_s=0.015, answer_s=0.1)) == []
    assert asyncio.run(drafts_asked(run_s=0.3, answer_s=0.1)) == ["q"]


def test_a_tool_with_side_effects_never_runs_on_a_guess() -> None:
    """The same learned pattern starts the read-only lookup early and never the
    tool that closes a record: it runs only once the model writes its call."""

    async def scenario(tool: str) -> tuple[list[str], list[tuple[str, dict[str, Any], str]]]:
        executor = _Executor()
        issued = _teach_and_start(_speculator(executor, _Ledger()), tool)
        await asyncio.sleep(0)
        return issued, executor.calls

    issued, calls = asyncio.run(scenario("lookup_record"))
    assert issued and calls == [("lookup_record", {"key": "INC-7"}, "a")]
    issued, calls = asyncio.run(scenario("close_record"))
    assert issued == [] and calls == []


def test_the_policy_says_which_tools_run_on_a_guess_and_why() -> None:
    policy = SpeculationPolicy(SpeculationConfig(), REGISTRY)
    worth = DraftWorth(min_run_ratio=1.0)
    lookup = policy.describe("lookup_record", worth)
    closing = policy.describe("close_record", worth)
    assert lookup is not None and closing is not None
    assert lookup["runs_on_a_guess"] and lookup["predicted_from"] == ["learned", "draft"]
    assert lookup["min_confidence"] == 0.0 and lookup["predictions_learned_per"] == "tenant"
    assert not closing["runs_on_a_guess"] and "side effects" in closing["why"]
    assert closing["min_confidence"] is None and closing["predicted_from"] == []
    off = SpeculationPolicy(SpeculationConfig(enabled=False), REGISTRY).describe(
        "lookup_record", worth
    )
    assert off is not None and not off["runs_on_a_guess"]
    assert lookup["typical_run_s"] is None, "not run yet"
    assert policy.describe("not_hosted", worth) is None


def test_each_speculative_run_is_accounted_used_or_discarded_with_its_cost() -> None:
    """A learned guess the model then makes is used; one it does not make is
    discarded, with the tool CPU its run took, in the caller's tenant's ledger."""
    ledger = _Ledger()

    async def scenario() -> dict[str, Any] | None:
        speculator = _speculator(_Executor(cpu_s=0.25), ledger)
        assert _teach_and_start(speculator, "lookup_record")
        # The teaching turns settled with nothing issued; now one that was.
        turn = speculator.start(_body("lookup_record"), "p", "a", launch=True)
        assert turn is not None and turn.issued
        speculator.settle(turn, [ObservedCall("lookup_record", {"key": "INC-8"})])
        for _ in range(5):
            await asyncio.sleep(0)
        return await speculator.ledger("a")

    view = asyncio.run(scenario())
    assert view is not None
    # Only turns speculated on count (the teaching ones only taught); of those,
    # the one settled (the first started was never settled).
    assert view["turns"] == 1
    assert view["tools"]["lookup_record"] == {
        "issued": 1,
        "used": 0,
        "discarded": 1,
        "tool_cpu_s_used": 0.0,
        "tool_cpu_s_discarded": 0.25,
    }
    assert view["waste_per_100_turns"]["discarded_runs"] == 100.0
    assert view["waste_per_100_turns"]["tool_cpu_s"] == 25.0
    assert set(ledger.by_tenant) == {"a"}


def test_a_run_found_cached_costs_nothing_again() -> None:
    ledger = _Ledger()

    async def scenario() -> None:
        speculator = _speculator(_Executor(source=ResultSource.CACHED), ledger)
        assert _teach_and_start(speculator, "lookup_record")
        turn = speculator.start(_body("lookup_record"), "p", "a", launch=True)
        assert turn is not None
        speculator.settle(turn, [ObservedCall("lookup_record", {"key": "INC-7"})])
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert ledger.by_tenant["a"]["lookup_record|used"] == 1
    assert "lookup_record|cpu_ms_used" not in ledger.by_tenant["a"]


def test_the_draft_tokens_of_a_turn_are_used_only_when_a_draft_guess_was() -> None:
    drafted = PredictedCall("lookup_record", {"key": "INC-7"}, 1.0, "draft")
    learned = PredictedCall("lookup_record", {"key": "INC-9"}, 1.0, "learned")
    used_draft = turn_entry(Settlement(used=[drafted], wasted=[learned]), draft_tokens=120)
    assert used_draft.increments == {
        "turns": 1,
        "lookup_record|issued": 2,
        "lookup_record|used": 1,
        "lookup_record|discarded": 1,
        "draft_tokens|used": 120,
    }
    wasted_draft = turn_entry(Settlement(used=[learned], wasted=[drafted]), draft_tokens=80)
    assert wasted_draft.increments["draft_tokens|discarded"] == 80
    assert turn_entry(Settlement([], []), 0).increments == {"turns": 1}
    assert run_cost_entry("calculator", False, 0.0123).increments == {
        "calculator|cpu_ms_discarded": 12
    }
    fields = dict(Counter(used_draft.increments) + Counter(wasted_draft.increments))
    view = ledger_view(fields, ["lookup_record"])
    assert view["turns"] == 2 and view["draft_tokens_discarded"] == 80
    assert view["waste_per_100_turns"]["draft_tokens"] == 4000.0
    assert ledger_view({}, ["calculator"])["waste_per_100_turns"]["discarded_runs"] is None
