"""CPU seconds a system's process tree spent during a workload, read from the
kernel's per-process counters (the same method for every system)."""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import psutil

SAMPLE_INTERVAL_S = 1.0
# vLLM titles its engine processes: the engine core and, on CPU, the worker
# that runs the model (`VLLM::EngineCore`, `VLLM::Worker`).
ENGINE_TITLES = ("VLLM::EngineCore", "VLLM::Worker")
# vLLM starts them with multiprocessing's spawn, and they take their titles only
# once running (one recorded arm never showed them): in every system's tree the
# engine's are the only processes started that way.
ENGINE_SPAWN_MARK = "from multiprocessing.spawn import spawn_main"


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds (user + system) within the measured window: all processes of
    the tree, and vLLM's engine processes among them (the model's own work)."""

    total_s: float
    engine_s: float
    by_process_name: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, float]:
        return {"cpu_total_s": self.total_s, "cpu_engine_s": self.engine_s}


def identify_process(process: psutil.Process) -> tuple[str, bool]:
    """The process's title (vLLM and Ray name theirs), else its program's name;
    and whether it is one of vLLM's engine processes."""
    try:
        command: list[str] = process.cmdline()
        name: str = process.name()
    except psutil.Error:
        return "?", False
    if command and not command[0].startswith("/") and " " not in command[0]:
        name = command[0]
    elif len(command) > 2 and command[1] == "-m":
        name = f"{name} -m {command[2]}"
    engine = name.startswith(ENGINE_TITLES) or ENGINE_SPAWN_MARK in " ".join(command)
    return name, engine


class ProcessTreeCpu:
    """Samples the CPU times of a root process and all its descendants every
    `interval_s` from `start()` to `stop()`. A process that ends between two
    samples loses at most one interval of its time."""

    def __init__(
        self,
        root_pid: int,
        interval_s: float = SAMPLE_INTERVAL_S,
        other_network_namespaces: bool = False,
    ):
        """`other_network_namespaces`: also every process in a network namespace
        other than this one's (the nodes of `toolserve nodes`, whose daemons no
        launcher's tree holds)."""
        self._root_pid = root_pid
        self._other_network_namespaces = other_network_namespaces
        self._interval_s = interval_s
        self._baseline: dict[int, float] = {}
        self._latest: dict[int, float] = {}
        self._engine_pids: set[int] = set()
        self._names: dict[int, str] = {}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> dict[int, float]:
        try:
            root = psutil.Process(self._root_pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return {}
        if self._other_network_namespaces:
            in_tree = {process.pid for process in processes}
            processes += [
                process
                for process in psutil.process_iter()
                if process.pid not in in_tree and _in_another_network_namespace(process.pid)
            ]
        times: dict[int, float] = {}
        for process in processes:
            try:
                cpu = process.cpu_times()
            except psutil.Error:
                continue
            times[process.pid] = cpu.user + cpu.system
            # A process titles itself a while after it starts: read it every time.
            self._names[process.pid], engine = identify_process(process)
            if engine:
                self._engine_pids.add(process.pid)
        return times

    def start(self) -> None:
        self._baseline = self._sample()
        self._latest = dict(self._baseline)
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._latest |= self._sample()

    def stop(self) -> CpuUse:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        self._latest |= self._sample()
        spent = {
            pid: seconds - self._baseline.get(pid, 0.0) for pid, seconds in self._latest.items()
        }
        by_name: dict[str, float] = defaultdict(float)
        for pid, seconds in spent.items():
            by_name[self._names.get(pid, "?")] += seconds
        return CpuUse(
            total_s=sum(spent.values()),
            engine_s=sum(spent[pid] for pid in spent if pid in self._engine_pids),
            by_process_name=dict(sorted(by_name.items(), key=lambda item: -item[1])),
        )


def _in_another_network_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
    except OSError:
        return False
