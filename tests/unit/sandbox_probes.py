"""Tool functions that misbehave on purpose, imported by the sandbox's child process."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from toolworkers.builtin_tools import ToolError


def echo(text: str) -> str:
    return text


def structured(count: int) -> dict[str, list[int]]:
    return {"numbers": list(range(count))}


def hang(seconds: float) -> str:
    time.sleep(seconds)
    return "woke up"


def spin() -> str:
    while True:
        pass


def eat_memory(megabytes: int) -> str:
    hoard = []
    for _ in range(megabytes):
        hoard.append(bytearray(1024 * 1024))
    return f"held {len(hoard)} MiB"


def connect(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=2):
        return "connected"


def crash() -> str:
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


def exit_quietly() -> str:
    os._exit(3)


def flood(megabytes: int) -> str:
    return "x" * (megabytes * 1024 * 1024)


def chatty() -> str:
    for _ in range(2000):
        print("noise " * 50)
    return "quiet result"


def refuse(reason: str) -> str:
    raise ToolError(reason)


def fail() -> str:
    raise KeyError("no such record")


def where_am_i() -> str:
    Path("scratch.txt").write_text("mine")
    return f"{os.getcwd()}|{os.environ.get('SECRET_TOKEN', '')}"


def with_root(path: str, *, root: str) -> str:
    return f"{root}/{path}"


def read_file(path: str) -> str:
    return Path(path).read_text()[:100]


def write_file(path: str) -> str:
    Path(path).write_text("escaped")
    return "written"


def list_directory(path: str) -> str:
    return ",".join(sorted(os.listdir(path))[:5])


def read_through_symlink(target: str) -> str:
    Path("link").symlink_to(target)
    return Path("link").read_text()[:100]


def fork_bomb() -> str:
    while True:
        os.fork()


def spawn_shell() -> str:
    import subprocess

    return subprocess.run(["sh", "-c", "id"], capture_output=True, text=True).stdout


def shell_out() -> str:
    return str(os.system("id"))


def ptrace_parent() -> str:
    import ctypes

    libc = ctypes.CDLL(None)
    return str(libc.ptrace(16, os.getppid(), 0, 0))  # PTRACE_ATTACH


def kill_parent() -> str:
    os.kill(os.getppid(), signal.SIGKILL)
    return "killed"


def environment() -> str:
    return ",".join(sorted(os.environ))


def read_under(path: str, *, root: str) -> str:
    return (Path(root) / path).read_text()
