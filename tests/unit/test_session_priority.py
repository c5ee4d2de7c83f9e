"""A session's niceness against the machine's other sessions, on the kernel's
autogroup file or a stand-in for it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from bench.systems import ServerProcess
from cluster.session_priority import AUTOGROUP, SessionNiceness, session_nice, set_session_nice


def test_the_niceness_is_written_where_the_kernel_reads_it(tmp_path: Path) -> None:
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-7 nice 0\n")
    assert set_session_nice(5, autogroup)
    assert autogroup.read_text() == "5"


def test_a_kernel_without_autogroups_is_told_apart(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "autogroup"
    assert not set_session_nice(5, missing)
    assert session_nice(missing) is None


def test_the_kernels_line_reads_as_its_niceness(tmp_path: Path) -> None:
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-114 nice 3\n")
    assert session_nice(autogroup) == 3


def test_a_session_gets_its_niceness_back_once_the_cluster_stops(tmp_path: Path) -> None:
    autogroup = tmp_path / "autogroup"
    autogroup.write_text("/autogroup-7 nice 2\n")
    session = SessionNiceness(autogroup)
    assert session.set(5)
    assert session.set(6)
    assert session_nice(autogroup) == 6
    session.restore()
    assert session_nice(autogroup) == 2
    autogroup.write_text("/autogroup-7 nice 3\n")
    session.restore()
    assert session_nice(autogroup) == 3


def test_nothing_is_put_back_where_nothing_was_set(tmp_path: Path) -> None:
    session = SessionNiceness(tmp_path / "no-such-dir" / "autogroup")
    assert not session.set(5)
    session.restore()
    assert not (tmp_path / "no-such-dir").exists()


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="the kernel keeps no autogroups")
def test_a_benchmarked_system_runs_in_a_session_of_its_own_at_its_niceness(
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "system.log"
    report = "import os; print(os.getsid(0), open('/proc/self/autogroup').read(), flush=True)"
    system = ServerProcess([sys.executable, "-c", report], {}, log_path, session_nice=4)
    system.start()
    try:
        deadline = time.monotonic() + 30
        while "nice" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        session, *_, nice = log_path.read_text().split()
    finally:
        system.stop()
    assert int(session) != os.getsid(0)
    assert int(nice) == 4
