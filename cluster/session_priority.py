"""The CPU share of this process's login session beside the machine's other sessions."""

from __future__ import annotations

from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")
"""Linux's per-session scheduling group of this process: the kernel first shares
the CPU between sessions, then among each session's processes."""


def set_session_nice(nice: int, autogroup: Path = AUTOGROUP) -> bool:
    """Give this process's session (and every process it starts) the niceness
    `nice` against the machine's other sessions; False where the kernel keeps no
    such groups or refuses (a negative niceness needs privilege)."""
    try:
        autogroup.write_text(str(nice))
    except OSError:
        return False
    return True


def session_nice(autogroup: Path = AUTOGROUP) -> int | None:
    """This process's session niceness (`/autogroup-5 nice 3` -> 3); None where the
    kernel keeps no such groups."""
    try:
        return int(autogroup.read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


class SessionNiceness:
    """This process's session niceness, set while something runs and put back as
    it was afterwards (a terminal's session outlives the cluster it started)."""

    def __init__(self, autogroup: Path = AUTOGROUP):
        self._autogroup = autogroup
        self._before: int | None = None

    def set(self, nice: int) -> bool:
        """False where the kernel keeps no such groups or refuses."""
        before = session_nice(self._autogroup)
        if before is None or not set_session_nice(nice, self._autogroup):
            return False
        if self._before is None:
            self._before = before
        return True

    def restore(self) -> None:
        if self._before is not None:
            set_session_nice(self._before, self._autogroup)
            self._before = None
