"""A call whose confinement cannot be built is refused as such: the error comes
back to the code that asked for the confinement, in the process that would have
run the call, and that process's exit is what the caller's own process shows."""

from __future__ import annotations

import os
from pathlib import Path

from toolworkers.confinement import ConfinementError, ConfinementPlan, enter

REFUSED, RAN, OTHER_ERROR = 42, 43, 44


def _exit_code_of_a_call_confined_by(plan: ConfinementPlan) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            enter(plan)
        except ConfinementError:
            os._exit(REFUSED)
        except BaseException:
            os._exit(OTHER_ERROR)
        os._exit(RAN)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _plan(workdir: Path) -> ConfinementPlan:
    return ConfinementPlan(
        workdir=str(workdir),
        read_only=(),
        writable=(),
        network=False,
        starts_programs=False,
        uid=65534,
        gid=65534,
        scratch_bytes=1 << 20,
        max_processes=16,
        max_open_files=64,
    )


def test_a_root_that_cannot_be_built_is_a_confinement_error_not_a_crash(tmp_path: Path) -> None:
    assert _exit_code_of_a_call_confined_by(_plan(tmp_path / "gone")) == REFUSED


def test_a_root_that_can_be_built_runs_the_call(tmp_path: Path) -> None:
    assert _exit_code_of_a_call_confined_by(_plan(tmp_path)) == RAN
