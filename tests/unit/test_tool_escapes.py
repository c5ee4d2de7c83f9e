"""Escape attempts against the hosted `python` tool, in real sandboxed processes,
written from what attackers do: read secrets, write outside the scratch, start
programs by every route Python has, load native code, reach the network, signal
or trace other processes, exhaust processes, memory, disk and descriptors, and
outlast the call.

The Python audit hooks are off here (`audit_hooks: false`): what is tested is the
operating system's confinement alone. Each attempt prints ESCAPED when the
action it tries succeeds and `refused` with the error when the kernel stops it;
after each one the zygote is the same process, a plain call on it works, and no
process of the tools' user is left."""

from __future__ import annotations

import asyncio
import errno
import os
import platform
import socket
import subprocess
import sysconfig
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.config import SandboxLimits
from toolworkers import sandbox
from toolworkers.sandbox import SandboxCall, ToolResult, run_sandboxed

PYTHON_TOOL = "toolworkers.python_tool:python"
LIMITS = SandboxLimits(memory_mb=512, cpu_s=20, audit_hooks=False)
LOADER = "/lib64/ld-linux-x86-64.so.2"
TOOL_UID = LIMITS.run_as[0]
PROFILE = Path(__file__).parents[2] / "configs" / "embedded-cpu.yaml"

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or not os.path.exists(LOADER),
    reason="system call numbers and the loader's path are x86-64 Linux's",
)


@dataclass(frozen=True)
class Attempt:
    name: str
    body: str
    """Statements that complete when the attack works and raise when it is refused."""
    timeout_s: float = 10.0
    target: str | None = None
    """A host path the attempt is after: unless the worker can read it, the attempt
    proves nothing and is skipped."""


@dataclass(frozen=True)
class Host:
    """What the attempts aim at outside the sandbox."""

    secret: str
    secret_file: Path
    tcp_port: int
    udp_port: int
    abstract_socket: str
    sentinel_pid: int
    worker_pid: int
    sentinel: subprocess.Popen[bytes] | None = None
    udp: socket.socket | None = None


LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def syscall_refused(number: int, *arguments: int | str) -> str:
    """A raw system call, refused when it fails with EPERM before the kernel acts on
    its arguments (any other answer means the kernel ran it)."""
    listed = ", ".join(str(argument) for argument in arguments)
    return LIBC + (
        f"result = libc.syscall({number}{', ' if listed else ''}{listed})\n"
        "if result == -1 and ctypes.get_errno() == errno.EPERM:\n"
        "    raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))\n"
        "print('the kernel answered', result, ctypes.get_errno())\n"
    )


def in_child(statements: str) -> str:
    """`statements` in a forked child, which exits 3 when they raise: the child's
    own end stays inside the attempt."""
    return (
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n" + textwrap.indent(statements, " " * 8) + "\n        os._exit(0)\n"
        "    except BaseException:\n"
        "        os._exit(3)\n"
        "status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        "if status != 0:\n"
        "    raise PermissionError(f'the child failed with status {status}')\n"
    )


def attempts(host: Host) -> list[Attempt]:
    secret = host.secret
    crafted = f"import posix\nposix.execv({LOADER!r}, [{LOADER!r}, '--version'])"
    return [
        # Secrets
        Attempt("shadow-passwords", "print(open('/etc/shadow').read())", target="/etc/shadow"),
        Attempt("user-database", "print(open('/etc/passwd').read())", target="/etc/passwd"),
        Attempt(
            "worker-environment",
            "hits = []\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            f"        if {secret!r} in open(f'/proc/{{pid}}/environ', errors='replace').read():\n"
            "            hits.append(pid)\n"
            "    except OSError:\n"
            "        pass\n"
            f"if not hits and {secret!r} not in str(os.environ):\n"
            "    raise LookupError('no environment it can read holds the secret')",
        ),
        Attempt(
            "other-processes",
            "pids = [pid for pid in os.listdir('/proc') if pid.isdigit()]\n"
            "if len(pids) <= 3:\n"
            "    raise LookupError(f'only the call itself: {pids}')",
        ),
        Attempt(
            "worker-file",
            f"print(open({str(host.secret_file)!r}).read())",
            target=str(host.secret_file),
        ),
        Attempt(
            "worker-configuration",
            f"print(open({str(PROFILE)!r}).read())",
            target=str(PROFILE),
        ),
        Attempt("ray-session", "print(os.listdir('/tmp/ray'))", target="/tmp/ray"),
        Attempt("redis-files", "print(os.listdir('/var/lib/redis'))", target="/var/lib/redis"),
        Attempt(
            "symbolic-link-out",
            "os.symlink('/etc/passwd', 'passwd')\nprint(open('passwd').read())",
            target="/etc/passwd",
        ),
        Attempt("sysfs", "print(os.listdir('/sys/class/net'))", target="/sys/class/net"),
        Attempt("block-device", "print(open('/dev/vda', 'rb').read(512))", target="/dev/vda"),
        Attempt("worker-memory", f"open('/proc/{host.worker_pid}/mem', 'rb')"),
        Attempt("kernel-memory", "print(open('/proc/kcore', 'rb').read(64))", target="/proc/kcore"),
        Attempt("kernel-settings", "open('/proc/sys/vm/drop_caches', 'w').write('1')"),
        # Writing outside the scratch directory
        Attempt("write-etc", "open('/etc/toolserve-escape', 'w').write('x')"),
        Attempt(
            "write-site-packages",
            "import sysconfig\n"
            "open(os.path.join(sysconfig.get_paths()['purelib'], 'escape.pth'), 'w').write('x')",
        ),
        Attempt(
            "write-standard-library",
            "open(os.path.join(os.path.dirname(os.__file__), 'escape.py'), 'w').write('x')",
        ),
        Attempt(
            "write-tool-package",
            "import toolworkers\n"
            "open(os.path.join(toolworkers.__path__[0], 'escape.py'), 'w').write('x')",
        ),
        Attempt("write-tmp", "open('/tmp/toolserve-escape', 'w').write('x')"),
        Attempt("write-root", "open('/toolserve-escape', 'w').write('x')"),
        Attempt("chmod-installation", "os.chmod(os.__file__, os.stat(os.__file__).st_mode)"),
        Attempt(
            "remount-writable",
            LIBC + "if libc.mount(None, b'/', None, 32 | 4096, None) != 0:\n"
            "    raise OSError(ctypes.get_errno(), 'mount')",
        ),
        Attempt(
            "unmount-proc",
            LIBC + "if libc.umount2(b'/proc', 2) != 0:\n"
            "    raise OSError(ctypes.get_errno(), 'umount')",
        ),
        # Starting programs
        Attempt("subprocess", f"subprocess.run([{LOADER!r}, '--version'], check=True)"),
        Attempt(
            "shell",
            "status = os.system('true')\nif status != 0:\n    raise OSError(f'status {status}')",
        ),
        Attempt("exec", in_child(f"os.execv({LOADER!r}, [{LOADER!r}, '--version'])")),
        Attempt(
            "posix-spawn",
            f"pid = os.posix_spawn({LOADER!r}, [{LOADER!r}, '--version'], {{}})\n"
            "status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
            "if status != 0:\n    raise OSError(f'status {status}')",
        ),
        Attempt(
            "internal-fork-exec",
            "import _posixsubprocess\n"
            "read_end, write_end = os.pipe()\n"
            "pid = _posixsubprocess.fork_exec(\n"
            f"    [b'ld', b'--version'], [{LOADER!r}.encode()], True, (write_end,), None, None,\n"
            "    -1, -1, -1, -1, -1, -1, read_end, write_end, False, False,\n"
            "    -1, None, None, None, -1, None, False)\n"
            "os.close(write_end)\n"
            "failure = os.read(read_end, 200)\n"
            "os.waitpid(pid, 0)\n"
            "if failure:\n    raise OSError(failure.decode(errors='replace'))",
        ),
        Attempt(
            "foreign-execve",
            in_child(
                LIBC + f"path = {LOADER!r}.encode()\n"
                "argv = (ctypes.c_char_p * 3)(path, b'--version', None)\n"
                "libc.execve(path, argv, None)\n"
                "raise OSError(ctypes.get_errno(), 'execve')"
            ),
        ),
        Attempt(
            "crafted-code-object",
            in_child(
                f"code = compile({crafted!r}, 'crafted', 'exec')\n"
                "exec(code.replace(co_name='innocent'))"
            ),
        ),
        Attempt(
            "multiprocessing-spawn",
            "import multiprocessing\n"
            "process = multiprocessing.get_context('spawn').Process(target=print)\n"
            "process.start()\nprocess.join(5)\n"
            "if process.exitcode != 0:\n    raise OSError(f'exit {process.exitcode}')",
        ),
        Attempt(
            "pseudo-terminal",
            "import pty\n"
            f"status = pty.spawn([{LOADER!r}, '--version'])\n"
            "if os.waitstatus_to_exitcode(status) != 0:\n    raise OSError(f'status {status}')",
        ),
        # The kernel's interfaces and native code
        Attempt(
            "ptrace",
            "child = os.fork()\n"
            "if child == 0:\n    time.sleep(10)\n    os._exit(0)\n"
            "try:\n" + textwrap.indent(syscall_refused(101, 16, "child", 0, 0), "    ") + "\n"
            "finally:\n    os.kill(child, signal.SIGKILL)\n    os.waitpid(child, 0)",
        ),
        Attempt("new-user-namespace", syscall_refused(272, 0x10000000)),
        Attempt("clone-new-namespace", syscall_refused(56, 0x00020000 | 17, 0, 0, 0, 0)),
        Attempt(
            "join-namespace",
            LIBC + f"descriptor = os.open('/proc/{host.worker_pid}/ns/mnt', os.O_RDONLY)\n"
            "if libc.setns(descriptor, 0) != 0:\n    raise OSError(ctypes.get_errno(), 'setns')",
        ),
        Attempt("bpf", syscall_refused(321, 0, 0, 0)),
        Attempt("keyring", syscall_refused(250, 0, 0, 0, 0, 0)),
        Attempt("kernel-module", syscall_refused(175, 0, 0, 0)),
        Attempt("perf-events", syscall_refused(298, 0, 0, -1, -1, 0)),
        Attempt("userfaultfd", syscall_refused(323, 0)),
        Attempt("io-uring", syscall_refused(425, 8, 0)),
        Attempt("process-memory", syscall_refused(310, 1, 0, 0, 0, 0, 0)),
        Attempt("chroot", "os.chroot('/')"),
        Attempt(
            "library-from-scratch",
            "import shutil, ctypes\n"
            "shutil.copy('/usr/lib/x86_64-linux-gnu/libm.so.6', 'libm.so.6')\n"
            "ctypes.CDLL(os.path.abspath('libm.so.6'))",
            target="/usr/lib/x86_64-linux-gnu/libm.so.6",
        ),
        # Network
        Attempt("redis", "socket.create_connection(('127.0.0.1', 6379), timeout=2)"),
        Attempt(
            "host-port", f"socket.create_connection(('127.0.0.1', {host.tcp_port}), timeout=2)"
        ),
        Attempt(
            "udp-to-host",
            "probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"probe.sendto(b'escaped', ('127.0.0.1', {host.udp_port}))",
        ),
        Attempt(
            "abstract-socket",
            f"socket.socket(socket.AF_UNIX).connect('\\0{host.abstract_socket}')",
        ),
        Attempt(
            "raw-socket", "socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"
        ),
        Attempt("packet-socket", "socket.socket(socket.AF_PACKET, socket.SOCK_RAW)"),
        Attempt("dns", "print(socket.getaddrinfo('pypi.org', 443))"),
        # Signals and other processes
        Attempt("signal-worker", f"os.kill({host.worker_pid}, 0)"),
        Attempt("signal-same-user", f"os.kill({host.sentinel_pid}, signal.SIGKILL)"),
        Attempt(
            "signal-everyone",
            "os.kill(-1, signal.SIGKILL)\n"
            "raise ProcessLookupError('the call outlived its signal to every process')",
        ),
        Attempt(
            "signal-init",
            "os.kill(1, signal.SIGKILL)\ntime.sleep(0.5)\n"
            "raise ProcessLookupError('the call outlived its signal to init')",
        ),
        Attempt(
            "setns-own",
            LIBC + "descriptor = os.open('/proc/self/ns/net', os.O_RDONLY)\n"
            "if libc.setns(descriptor, 0) != 0:\n    raise OSError(ctypes.get_errno(), 'setns')",
        ),
        Attempt("hostname", "socket.sethostname('owned')"),
        # Exhaustion
        Attempt(
            "fork-bomb",
            "children = 0\n"
            "try:\n"
            "    while children < 10000:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(60)\n"
            "            os._exit(0)\n"
            "        children += 1\n"
            "except OSError as error:\n"
            "    raise OSError(f'after {children} children: {error}')",
        ),
        Attempt(
            "thread-bomb",
            "import threading\n"
            "for _ in range(10000):\n"
            "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()",
        ),
        Attempt("memory-bomb", "hoard = bytearray(4 << 30)"),
        Attempt(
            "fill-the-disk",
            "with open('fill', 'wb') as fill:\n"
            "    for _ in range(512):\n"
            "        fill.write(b'x' * (1 << 20))",
        ),
        Attempt(
            "hoard-descriptors",
            "hoard = []\n"
            "try:\n"
            "    while len(hoard) < 100000:\n"
            "        hoard.append(open('/dev/null'))\n"
            "except OSError:\n"
            f"    if len(hoard) <= {LIMITS.max_open_files}:\n"
            "        raise\n"
            "print('held', len(hoard))",
        ),
        Attempt(
            "outlive-the-call",
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "    signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            "    time.sleep(120)\n"
            "    os._exit(0)\n"
            "raise ChildProcessError('a daemon was left behind; it must not outlive the call')",
        ),
        Attempt(
            "outlast-the-timeout",
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
            timeout_s=2.0,
        ),
    ]


NO_HOST = Host("", Path("/"), 0, 0, "", 0, 0)
ATTEMPT_NAMES = [attempt.name for attempt in attempts(NO_HOST)]


def program(attempt: Attempt) -> str:
    return (
        "import errno, os, signal, socket, subprocess, sys, time\n"
        "try:\n" + textwrap.indent(attempt.body, "    ") + "\n    print('ESCAPED')\n"
        "except BaseException as error:\n"
        "    print('refused', type(error).__name__, error)\n"
    )


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    pending = asyncio.all_tasks(event_loop)  # the zygote's reader
    for task in pending:
        task.cancel()
    event_loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    event_loop.close()


def run(
    loop: asyncio.AbstractEventLoop,
    code: str,
    timeout_s: float = 10.0,
    starts_programs: bool = False,
) -> ToolResult:
    sandbox_call = SandboxCall(
        PYTHON_TOOL, {"code": code}, {}, timeout_s, starts_programs=starts_programs
    )
    return loop.run_until_complete(run_sandboxed(sandbox_call, LIMITS))


def processes_of(uid: int) -> set[int]:
    owned = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        uids = next(line for line in status.splitlines() if line.startswith("Uid:"))
        if int(uids.split()[1]) == uid:
            owned.add(int(entry))
    return owned


def readable(path: str) -> bool:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as file:
                file.read(1)
    except OSError:
        return False
    return True


def wait_for_none_beyond(uid: int, allowed: set[int]) -> set[int]:
    """Processes of `uid` beyond `allowed` still there after a few seconds."""
    deadline = time.monotonic() + 5
    while (left := processes_of(uid) - allowed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    secret = f"toolserve-secret-{uuid.uuid4().hex}"
    os.environ["TOOLSERVE_ESCAPE_SECRET"] = secret
    secret_file = tmp_path_factory.mktemp("worker") / "credentials"
    secret_file.write_text(secret)
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    abstract_name = f"toolserve-escape-{uuid.uuid4().hex[:8]}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    # A process of the tools' own user, outside the sandbox.
    sentinel = subprocess.Popen(
        ["sleep", "3600"],
        user=TOOL_UID if os.geteuid() == 0 else None,
    )
    try:
        yield Host(
            secret,
            secret_file,
            tcp.getsockname()[1],
            udp.getsockname()[1],
            abstract_name,
            sentinel.pid,
            os.getpid(),
            sentinel,
            udp,
        )
    finally:
        sentinel.kill()
        sentinel.wait()
        for listener in (tcp, udp, abstract):
            listener.close()
        del os.environ["TOOLSERVE_ESCAPE_SECRET"]


@pytest.mark.parametrize("name", ATTEMPT_NAMES)
def test_the_attempt_is_refused_and_the_worker_stays_healthy(
    name: str, host: Host, loop: asyncio.AbstractEventLoop
) -> None:
    attempt = next(attempt for attempt in attempts(host) if attempt.name == name)
    if attempt.target is not None and not readable(attempt.target):
        pytest.skip(f"the worker cannot read {attempt.target} here: nothing to reach")
    run(loop, "print('warm')")
    zygote = sandbox.zygote_pid()
    others_of_tool_user = processes_of(TOOL_UID)

    result = run(loop, program(attempt), attempt.timeout_s)

    assert "ESCAPED" not in result.output, result.output
    assert "refused" in result.output or result.error_kind == "timeout", result
    assert host.secret not in result.output
    assert not wait_for_none_beyond(TOOL_UID, others_of_tool_user), "a process outlived the call"
    assert host.sentinel is not None and host.sentinel.poll() is None, "the sentinel was killed"
    assert host.udp is not None
    with pytest.raises(BlockingIOError):
        host.udp.recv(64)
    assert sandbox.zygote_pid() == zygote
    after = run(loop, "import os\nprint(os.listdir('.'), os.getuid() != 0)")
    assert after == ToolResult(True, "[] True\n", None, after.duration_s, cpu_s=after.cpu_s)


def test_a_refused_system_call_fails_with_eperm(loop: asyncio.AbstractEventLoop) -> None:
    """The filter answers EPERM (it does not kill): tools get an error to report."""
    result = run(loop, program(Attempt("bpf", syscall_refused(321, 0, 0, 0))))
    assert f"refused PermissionError [Errno {errno.EPERM}]" in result.output, result.output


def test_the_tool_runs_unprivileged_without_capabilities_under_the_filter(
    loop: asyncio.AbstractEventLoop,
) -> None:
    fields = ("Uid", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")
    result = run(
        loop,
        "for line in open('/proc/self/status'):\n"
        f"    if line.split(':')[0] in {fields!r}:\n"
        "        print(' '.join(line.split()))",
    )
    status = dict(line.split(" ", 1) for line in result.output.splitlines())
    expected_uid = TOOL_UID if os.geteuid() == 0 else 0
    assert status["Uid:"].split() == [str(expected_uid)] * 4, result.output
    assert status["CapEff:"] == status["CapPrm:"] == status["CapBnd:"] == "0000000000000000"
    assert status["NoNewPrivs:"] == "1"
    assert status["Seccomp:"] == "2"


def test_nothing_written_in_the_sandbox_reaches_the_host(
    loop: asyncio.AbstractEventLoop,
) -> None:
    by_name = {attempt.name: attempt for attempt in attempts(NO_HOST)}
    for name in ("write-tmp", "write-site-packages", "write-etc", "write-root"):
        run(loop, program(by_name[name]))
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert not Path("/tmp/toolserve-escape").exists()
    assert not (purelib / "escape.pth").exists()
    assert not Path("/etc/toolserve-escape").exists()
    assert not Path("/toolserve-escape").exists()


def test_a_tool_that_starts_programs_runs_them_inside_the_confinement(
    loop: asyncio.AbstractEventLoop,
) -> None:
    starts = run(
        loop,
        program(Attempt("exec", f"subprocess.run([{LOADER!r}, '--version'], check=True)")),
        starts_programs=True,
    )
    assert "ESCAPED" in starts.output, starts.output
    # The program it starts is as confined as the tool: no /etc/passwd, no /bin/cat.
    reads_passwords = run(
        loop,
        "import subprocess\n"
        f"ran = subprocess.run([{LOADER!r}, '/bin/cat', '/etc/passwd'], capture_output=True)\n"
        "print(ran.returncode, ran.stdout, ran.stderr)",
        starts_programs=True,
    )
    assert reads_passwords.output.startswith("127 b''"), reads_passwords.output
    assert "/bin/cat" in reads_passwords.output
