"""Operating-system confinement of one tool call, entered by the call's process
(forked by `toolworkers.sandbox_zygote`) before the tool is imported.

The call gets namespaces of its own (mount, PID, IPC, UTS, cgroup, and network
unless tools may use it; a user namespace too when the worker is not root); a
root file system that holds only the Python installation and the tools'
packages, read-only, four devices and its own /proc; a size-limited scratch
directory as its working directory, HOME and TMPDIR; an unprivileged uid without
capabilities; and a seccomp filter that refuses the system calls a tool never
needs (`DENIED_SYSCALLS`, new namespaces, raw sockets, and `execve` unless the
tool declares it starts programs).

`enter` forks twice and returns only in the grandchild, which runs the tool.
The call's process stays in the worker's PID namespace and ends as the tool
ended (the worker reads the exit status from it); its child is the new PID
namespace's init, which reaps, and whose end ends every process of the call.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import resource
import signal
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import pyseccomp

_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_NEW_NAMESPACE_FLAGS = (
    _CLONE_NEWNS,
    _CLONE_NEWCGROUP,
    _CLONE_NEWUTS,
    _CLONE_NEWIPC,
    _CLONE_NEWUSER,
    _CLONE_NEWPID,
    _CLONE_NEWNET,
)

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_NOATIME = 1024
_MS_NODIRATIME = 2048
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MS_RELATIME = 1 << 21
_MNT_DETACH = 2
# statvfs flags a read-only bind must keep: a user namespace may not clear them.
_LOCKED_MOUNT_FLAGS = (
    (os.ST_NOSUID, _MS_NOSUID),
    (os.ST_NODEV, _MS_NODEV),
    (os.ST_NOEXEC, _MS_NOEXEC),
    (os.ST_NOATIME, _MS_NOATIME),
    (os.ST_NODIRATIME, _MS_NODIRATIME),
    (os.ST_RELATIME, _MS_RELATIME),
)

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_LAST_CAPABILITY = 63
_CAPABILITY_VERSION_3 = 0x20080522

_DEVICES = ("null", "zero", "random", "urandom")
_HOSTNAME = b"toolserve-tool"

DENIED_SYSCALLS = (
    # other processes' memory
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    # the file system's shape and the namespaces
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "open_by_handle_at",
    "name_to_handle_at",
    # the kernel itself
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "vhangup",
)
_PROGRAM_SYSCALLS = ("execve", "execveat")
_SOCK_TYPE_MASK = 0xF


class ConfinementError(RuntimeError):
    """The kernel refused a step of the confinement; the tool does not run."""


@dataclass(frozen=True)
class ConfinementPlan:
    """What one call's process may see and do."""

    workdir: str
    """The call's directory: its scratch space, working directory, HOME and TMPDIR."""
    read_only: tuple[str, ...]
    """Paths bound read-only at the same place: the Python installation, the packages."""
    writable: tuple[str, ...]
    """Paths bound writable at the same place (the tool's configured paths)."""
    network: bool
    starts_programs: bool
    uid: int
    """The tool's uid and gid when the worker is root (else the worker's own)."""
    gid: int
    scratch_bytes: int
    max_processes: int
    max_open_files: int


_libc = ctypes.CDLL(None, use_errno=True)


def _checked(result: int, doing: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise ConfinementError(f"{doing}: {os.strerror(code)} (errno {code})")


def _text(value: str | None) -> bytes | None:
    return None if value is None else os.fsencode(value)


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    result = _libc.mount(
        _text(source), _text(target), _text(fstype), ctypes.c_ulong(flags), _text(data)
    )
    _checked(result, f"mount {target}")


def _prctl(option: int, value: int) -> None:
    _checked(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as file:
        file.write(text)


def _own_user_namespace() -> None:
    """An unprivileged worker: a user namespace where it is root, mapped to itself."""
    uid, gid = os.geteuid(), os.getegid()
    _checked(_libc.unshare(_CLONE_NEWUSER), "a user namespace")
    try:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    except OSError as error:
        raise ConfinementError(f"mapping the user namespace: {error}") from error


def _mountpoint(target: str, is_directory: bool) -> None:
    if is_directory:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))


def _link_to_bound(path: str, root: str) -> None:
    """A symbolic link `path` made under `root` too, pointing where it points."""
    if os.path.islink(path) and not os.path.lexists(root + path):
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        os.symlink(os.readlink(path), root + path)


def _bind(real: str, root: str, read_only: bool) -> None:
    """Binds the real path `real` at its own place under `root`."""
    if not os.path.exists(real):
        return
    target = root + real
    _mountpoint(target, os.path.isdir(real))
    _mount(real, target, None, _MS_BIND | _MS_REC, None)
    flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV
    locked = os.statvfs(real).f_flag
    flags |= sum(mount_flag for stat_flag, mount_flag in _LOCKED_MOUNT_FLAGS if locked & stat_flag)
    if read_only:
        flags |= _MS_RDONLY
    _mount(None, target, None, flags, None)


def _build_root(plan: ConfinementPlan, uid: int, gid: int) -> None:
    """A root holding only the plan's paths, the scratch, devices and /proc; pivoted into."""
    root = plan.workdir
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    for path in plan.read_only:
        _link_to_bound(path, root)
    for real in _outermost(os.path.realpath(path) for path in plan.read_only):
        _bind(real, root, read_only=True)
    scratch = root + plan.workdir
    os.makedirs(scratch, exist_ok=True)
    _mount(
        "tmpfs",
        scratch,
        "tmpfs",
        _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
        f"mode=0700,size={plan.scratch_bytes},uid={uid},gid={gid}",
    )
    for path in plan.writable:
        _link_to_bound(path, root)
        _bind(os.path.realpath(path), root, read_only=False)
    for device in _DEVICES:
        _bind(f"/dev/{device}", root, read_only=False)
    os.makedirs(root + "/proc", exist_ok=True)
    # A user namespace inside a container whose /proc has masked paths may not
    # mount another: the tool goes without /proc.
    with contextlib.suppress(ConfinementError):
        _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    os.chdir(root)
    _checked(_libc.pivot_root(b".", b"."), "pivot_root")
    _checked(_libc.umount2(b".", _MNT_DETACH), "detaching the worker's root")
    _mount(None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    os.chdir(plan.workdir)


def _outermost(paths: Iterable[str]) -> list[str]:
    """The paths without those inside another (bound with it already)."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == outer or path.startswith(outer.rstrip("/") + "/") for outer in kept):
            kept.append(path)
    return kept


def _drop_privileges(uid: int, gid: int, as_root: bool) -> None:
    for capability in range(_LAST_CAPABILITY + 1):
        if _libc.prctl(_PR_CAPBSET_DROP, ctypes.c_ulong(capability), 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:
                break  # past the kernel's last capability
            _checked(-1, "dropping capabilities")
    if as_root:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    no_capabilities = (ctypes.c_uint32 * 6)()
    _checked(_libc.capset(header, no_capabilities), "clearing capabilities")


def _limit_resources(plan: ConfinementPlan) -> None:
    resource.setrlimit(resource.RLIMIT_NPROC, (plan.max_processes, plan.max_processes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (plan.max_open_files, plan.max_open_files))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@functools.cache
def _seccomp_filter(starts_programs: bool) -> pyseccomp.SyscallFilter:
    """Built once per process (the zygote) and kind, loaded by every call's process."""
    refused = pyseccomp.ERRNO(errno.EPERM)
    rules = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    denied = DENIED_SYSCALLS if starts_programs else DENIED_SYSCALLS + _PROGRAM_SYSCALLS
    for name in denied:
        with contextlib.suppress(OSError, ValueError):  # not one on this architecture
            rules.add_rule(refused, name)
    for flag in _NEW_NAMESPACE_FLAGS:
        rules.add_rule(refused, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    # clone3's flags are behind a pointer the filter cannot read; the C library
    # falls back to clone when told the call does not exist.
    rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    rules.add_rule(refused, "socket", pyseccomp.Arg(0, pyseccomp.EQ, socket.AF_PACKET))
    rules.add_rule(
        refused,
        "socket",
        pyseccomp.Arg(1, pyseccomp.MASKED_EQ, _SOCK_TYPE_MASK, socket.SOCK_RAW),
    )
    return rules


def prepare() -> None:
    """Builds what every call's process would otherwise build again (the
    seccomp filters), in the process calls are forked from."""
    for starts_programs in (False, True):
        _seccomp_filter(starts_programs)


def _mirror(status: int) -> None:
    """Ends this process the way `status` says another ended."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _wait_for(pid: int) -> int:
    while True:
        try:
            waited, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        if waited == pid:
            return status


def _reap_until(tool_pid: int) -> int:
    """The namespace's init: waits for every process that ends, until the tool does."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except InterruptedError:
            continue
        if pid == tool_pid:
            return status


def _close_standard_streams() -> None:
    for descriptor in (0, 1, 2):
        os.close(descriptor)


def enter(plan: ConfinementPlan) -> None:
    """Confines the calling process's work; returns in a new process that runs it.
    Raises ConfinementError when the kernel refuses a namespace (in the calling
    process) or the call's root cannot be built (in the process that would have
    run the call, whose exit the calling process then mirrors): either way the
    caller reports the refusal as it would the call's result."""
    seccomp_rules = _seccomp_filter(plan.starts_programs)
    as_root = os.geteuid() == 0
    uid, gid = (plan.uid, plan.gid) if as_root else (0, 0)
    if not as_root:
        _own_user_namespace()
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWCGROUP
    if not plan.network:
        flags |= _CLONE_NEWNET
    _checked(_libc.unshare(flags), "new namespaces")
    status_read, status_write = os.pipe()
    init_pid = os.fork()
    if init_pid:
        os.close(status_write)
        _close_standard_streams()
        init_status = _wait_for(init_pid)
        reported = os.read(status_read, 32)
        _mirror(int(reported) if reported else init_status)
    os.close(status_read)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(_PR_SET_DUMPABLE, 0)
    try:
        _build_root(plan, uid, gid)
        _checked(_libc.sethostname(_HOSTNAME, len(_HOSTNAME)), "hostname")
    except OSError as error:
        raise ConfinementError(f"building the call's root: {error}") from error
    tool_pid = os.fork()
    if tool_pid:
        _close_standard_streams()
        os.write(status_write, str(_reap_until(tool_pid)).encode())
        os._exit(0)
    os.close(status_write)
    _drop_privileges(uid, gid, as_root)
    _limit_resources(plan)
    seccomp_rules.load()
