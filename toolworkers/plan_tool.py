"""A plan executor that runs a multi-stage plan stage by stage as the model writes
it: each stage runs as soon as its JSON object is complete, while the next one
is still being decoded (Conveyor, arXiv 2406.00059, §4: the Planning workload).

A stage names one of the plan's step tools and gives it one text input; the
stages are independent, and a stage that fails is reported and the plan goes
on. The step tools are side-effect free: the calculator and the search over
the Python reference (`toolworkers.search_tool`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolworkers.builtin_tools import ToolError, calculate
from toolworkers.partial_input import PartialInput, PieceKind, run_whole
from toolworkers.registry import CostClass, hosted_tool
from toolworkers.search_tool import ReferenceSearch, format_hits

_STAGES = "stages"
_TOOL = "tool"
_INPUT = "input"
_MAX_STAGES = 16
_SEARCH_HITS = 2
STEP_TOOLS = ("calculator", "search")

PLAN_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        _STAGES: {
            "type": "array",
            "description": "The plan's stages, run in order",
            "maxItems": _MAX_STAGES,
            "items": {
                "type": "object",
                "properties": {
                    _TOOL: {"type": "string", "enum": list(STEP_TOOLS)},
                    _INPUT: {
                        "type": "string",
                        "description": "The calculator's expression or the search's query",
                    },
                },
                "required": [_TOOL, _INPUT],
            },
        }
    },
    "required": [_STAGES],
}


class PlanSession:
    """A plan in progress: each fed stage runs at once; `finish` reports every
    stage's outcome in order."""

    def __init__(self) -> None:
        self._search: ReferenceSearch | None = None
        self._stages_run: list[Any] = []
        self._outcomes: list[str] = []

    def feed(self, stage: Any) -> None:
        number = len(self._outcomes) + 1
        if number > _MAX_STAGES:
            return  # `finish` refuses the plan
        self._stages_run.append(stage)
        try:
            tool, text = _stage_parts(stage)
            outcome = self._step(tool)(text)
        except ToolError as error:
            outcome = f"error: {error}"
        self._outcomes.append(f"Stage {number} ({_describe(stage)}):\n{outcome}")

    def finish(self, arguments: dict[str, Any]) -> str:
        stages = arguments.get(_STAGES)
        if not isinstance(stages, list):
            raise ToolError(f"`{_STAGES}` must be a list of stages")
        if not stages:
            raise ToolError("the plan has no stages")
        if len(stages) > _MAX_STAGES:
            raise ToolError(f"a plan has at most {_MAX_STAGES} stages")
        if stages != self._stages_run:  # a repeated key: the last one is the plan
            self._stages_run, self._outcomes = [], []
            for stage in stages:
                self.feed(stage)
        return "\n\n".join(self._outcomes)

    def _step(self, tool: str) -> Callable[[str], str]:
        if tool == "calculator":
            return calculate
        if self._search is None:
            self._search = ReferenceSearch()
        search = self._search
        return lambda query: format_hits(query, search.hits(query, _SEARCH_HITS))


def _stage_parts(stage: Any) -> tuple[str, str]:
    if not isinstance(stage, dict):
        raise ToolError(f"a stage must be an object with `{_TOOL}` and `{_INPUT}`")
    tool, text = stage.get(_TOOL), stage.get(_INPUT)
    if tool not in STEP_TOOLS:
        raise ToolError(f"unknown step tool {tool!r} (known: {', '.join(STEP_TOOLS)})")
    if not isinstance(text, str):
        raise ToolError(f"`{_INPUT}` must be a string")
    return tool, text


def _describe(stage: Any) -> str:
    if isinstance(stage, dict) and isinstance(stage.get(_TOOL), str):
        return f"{stage[_TOOL]} {stage.get(_INPUT)!r}"
    return "malformed"


PLAN_INPUT = PartialInput(argument=_STAGES, pieces=PieceKind.LIST_ITEMS, session=PlanSession)


@hosted_tool(
    name="run_plan",
    description="Run a plan of stages in order, each a calculator expression or a "
    "search of the Python reference, and return every stage's result.",
    parameters=PLAN_PARAMETERS,
    side_effect_free=True,
    program_scoped=False,
    cost_class=CostClass.MODERATE,
    timeout_s=10.0,
    partial_input=PLAN_INPUT,
)
def run_plan(stages: list[Any]) -> str:
    return run_whole(PLAN_INPUT, {_STAGES: stages}, {})
