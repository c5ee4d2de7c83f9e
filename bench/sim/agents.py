"""Simulated programs: drawn from the benchmark's own workload generators, or
taken turn by turn from a recorded run's records (the exact prompt and output
tokens and the pauses the agents saw)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from bench.records import ProgramRecord, RequestRecord, open_records
from bench.sim.simulation import SimProgram, SimTurn
from bench.workloads.program import AgentProgram
from bench.workloads.replay import ReplayProgram

MESSAGE_MARKUP_TOKENS = 5
"""A chat message's own tokens in SmolLM2's template (`<|im_start|>role\\n`,
`<|im_end|>\\n`)."""
CALL_MARKUP_TOKENS = 24
"""A hermes call's tokens beyond its lead text: the markers, the name, the
argument's key and value."""
TOOL_SCHEMA_TOKENS = 60
"""A replayed tool's schema in the system prompt."""


def replay_programs(programs: Sequence[AgentProgram]) -> list[SimProgram]:
    """The programs a replay workload's plan built, by their drawn token counts
    plus the template's markup (estimated, see above)."""
    simulated = []
    for program in programs:
        if not isinstance(program, ReplayProgram):
            raise ValueError(f"{program.program_id}: only replayed programs can be simulated")
        turns = tuple(
            SimTurn(
                appended_tokens=shape.appended_tokens + MESSAGE_MARKUP_TOKENS,
                output_tokens=shape.output_tokens
                + (CALL_MARKUP_TOKENS if shape.tool is not None else 0),
                pause_s=shape.pause_s,
                tool=shape.tool,
            )
            for shape in program.shapes
        )
        first_prompt = (
            program.first_prompt_tokens
            + 2 * MESSAGE_MARKUP_TOKENS
            + TOOL_SCHEMA_TOKENS * len(program.tools)
        )
        simulated.append(
            SimProgram(
                program.program_id, program.agent_type, program.arrival_s, first_prompt, turns
            )
        )
    return simulated


def recorded_programs(run_dir: Path, system: str, repeat: int) -> list[SimProgram]:
    """One arm's round of a recorded run, as its agents sent it: each turn's
    prompt and output tokens as the server counted them, each pause as the agent
    was away between a reply and its next request. The records do not name the
    tools called: every turn counts as calling none."""
    requests: defaultdict[str, list[RequestRecord]] = defaultdict(list)
    programs: dict[str, ProgramRecord] = {}
    with open_records(run_dir) as lines:
        for line in lines:
            record = json.loads(line)
            kind = record.pop("kind")
            if record.get("system") != system or record.get("repeat") != repeat:
                continue
            if kind == "request":
                request = RequestRecord(**record)
                requests[request.program_id].append(request)
            elif kind == "program":
                program = ProgramRecord(**record)
                programs[program.program_id] = program
    simulated = []
    for program_id, program in sorted(programs.items(), key=lambda item: item[1].arrival_s):
        turns_sent = sorted(requests[program_id], key=lambda request: request.turn_index)
        turns = []
        for index, request in enumerate(turns_sent):
            before = turns_sent[index - 1] if index else None
            appended = (
                0
                if before is None
                else request.prompt_tokens - before.prompt_tokens - before.completion_tokens
            )
            following = turns_sent[index + 1] if index + 1 < len(turns_sent) else None
            pause = (
                0.0 if following is None else following.sent_s - request.sent_s - request.latency_s
            )
            turns.append(
                SimTurn(
                    appended_tokens=max(0, appended),
                    output_tokens=max(1, request.completion_tokens),
                    pause_s=max(0.0, pause),
                )
            )
        if turns_sent:
            simulated.append(
                SimProgram(
                    program_id,
                    program.agent_type,
                    program.arrival_s,
                    turns_sent[0].prompt_tokens,
                    tuple(turns),
                )
            )
    return simulated
