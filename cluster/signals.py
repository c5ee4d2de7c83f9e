"""Turning stop signals into exceptions, so cleanup code in `finally` blocks runs."""

from __future__ import annotations

import signal
import threading


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGINT into KeyboardInterrupt in the main thread.

    NOTE: in a Ray driver this must run after ray.init, which installs a SIGTERM
    handler that kills the driver outright and orphans Ray's agents; SIGINT is
    included because a background launch starts with it ignored.
    """
    if threading.current_thread() is threading.main_thread():
        for stop_signal in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop_signal, _interrupt)
