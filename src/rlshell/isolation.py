"""Confinement for code the trainer does not trust: bubblewrap, seccomp and the kernel's cgroups.

A `SandboxedProcess` is a pooled process (`rlshell.process_pool`) started
through bubblewrap (``bwrap``, Debian's package, fetched into
``<venv>/share/rlstack/bubblewrap`` by ``make install``) instead of as a
plain child:

- namespaces of its own: PID, mount, IPC, UTS, network (unless asked for
  the network) and cgroup; it dies with the process that started it;
- a file system of its own: a read-only view of the interpreter, its
  packages and the directories on the caller's ``sys.path``, a private
  ``/proc`` and ``/dev``, and size-bounded in-memory ``/tmp`` and
  ``/scratch``; nothing of the caller's is writable;
- an environment of its own: emptied, then the few variables `allowed_env`
  lets through (extension modules, thread counts), never the caller's
  credentials;
- ``no_new_privs`` and a seccomp filter (`DENIED_SYSCALLS`: ptrace,
  process_vm_*, pidfd_getfd, kexec, mounting, setns, unshare and namespace
  flags to clone, keyrings, bpf, ...) that it and everything it starts keep
  (a server's lets through `SERVER_ALLOWED_SYSCALLS`, to make its calls'
  namespaces; each call loads the whole filter, `SeccompProgram`);
- the capabilities `SERVER_CAPABILITIES` only (to hand each call an identity
  and namespaces of its own, put it in a cgroup and clean up after it), every
  other one gone from every set, the bounding set included;
- a cgroup of its own (`CgroupTree`), under which it makes one per call
  (`CallCgroup`: memory, process count and CPU limits; killed as a whole).

Inside, a server forks each call as pid 1 of a PID namespace of its own
(`fork_into_call_pid_namespace`), and the call, before it runs anything, joins
its cgroup, makes `CALL_NAMESPACES` of its own with its own ``/proc``
(`enter_call_namespaces`), drops every capability from every set and switches
to a fresh unprivileged uid and gid no other process has (`call_uid`,
`become_call_identity`), not dumpable, and loads the whole seccomp filter.
`isolation_problems` says, part by part, what this host withholds and how to
allow it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal

from attrs import frozen

from rlshell.debian_packages import BOOKWORM, InstallError, fetch_packages, share_dir

__all__ = [
    "BWRAP_ENV_VAR",
    "CALL_NAMESPACES",
    "DENIED_SYSCALLS",
    "SERVER_ALLOWED_SYSCALLS",
    "SERVER_CAPABILITIES",
    "CallCgroup",
    "CgroupTree",
    "Confinement",
    "IsolationError",
    "SandboxContext",
    "SandboxedProcess",
    "SeccompProgram",
    "become_call_identity",
    "bwrap_path",
    "call_uid",
    "cgroup_layout",
    "enter_call_namespaces",
    "fork_into_call_pid_namespace",
    "install_bubblewrap",
    "isolation_problems",
    "sandbox_main",
    "write_seccomp_filter",
]

BWRAP_ENV_VAR = "RLSHELL_BWRAP"
"""A bwrap binary to use instead of the installed one."""

DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kexec_load",
    "kexec_file_load",
    "mount",
    "umount2",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "personality",
)
"""Refused (EPERM) to a sandboxed process and everything it starts."""

# clone's namespace flags (refused, as unshare is); clone3 answers ENOSYS, so that the C
# library falls back to clone, whose flags the filter can read.
_CLONE_NAMESPACES = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

SERVER_CAPABILITIES = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
    "CAP_SETPCAP": 8,
    "CAP_SYS_ADMIN": 21,
}
"""What the server in a sandbox keeps (its calls keep none): to give each call a uid, a
scratch directory, a cgroup and namespaces of its own (``CAP_SYS_ADMIN``: unshare, and
mount the call's ``/proc``), and to kill and clean up after it."""

SERVER_ALLOWED_SYSCALLS = ("unshare", "setns", "mount")
"""Of `DENIED_SYSCALLS`, what the server's own filter lets through, to make each call's
namespaces (`enter_call_namespaces`); never a user namespace or a cgroup namespace. Each
call loads the whole filter (`SeccompProgram`) before it runs anything."""

CALL_NAMESPACES = ("mnt", "pid", "net", "ipc", "uts")
"""The namespaces each call of a server has of its own (beside the sandbox's, which the
server and its calls are all in)."""

# Fresh identities: uids no user of a system has (above systemd's dynamic and container ranges).
_UID_BASE = 1_800_000_000
_UIDS_PER_SERVER = 1 << 16

_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CAP_SETUID, _CAP_SETGID = 7, 6
_CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")

_V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
_V2_CONTROLLERS = ("memory", "pids", "cpu")


class IsolationError(RuntimeError):
    """A part of the sandbox this host withholds or that failed; the message names the part
    and how to allow it."""


# ---------------------------------------------------------------------------- bubblewrap


def bubblewrap_dir() -> Path:
    return share_dir() / "bubblewrap"


def bwrap_path() -> Path | None:
    """``$RLSHELL_BWRAP``, else the bwrap ``make install`` fetched, else one on ``PATH``."""
    chosen = os.environ.get(BWRAP_ENV_VAR)
    if chosen:
        return Path(chosen)
    installed = bubblewrap_dir() / "bwrap"
    if installed.is_file():
        return installed
    found = shutil.which("bwrap")
    return Path(found) if found else None


def install_bubblewrap(target: Path | None = None) -> Path:
    """Fetch Debian's bubblewrap into ``target`` (default ``<venv>/share/rlstack/bubblewrap``)
    with `rlshell.debian_packages.fetch_packages`; the path of its ``bwrap``."""
    target = target or bubblewrap_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bubblewrap-", dir=target.parent) as scratch:
        work = Path(scratch)
        root = fetch_packages(("bubblewrap",), BOOKWORM, work)
        binary = root / "usr/bin/bwrap"
        if not binary.is_file():
            raise InstallError("the bubblewrap package held no usr/bin/bwrap")
        staged = work / "staged"
        staged.mkdir()
        shutil.copy2(binary, staged / "bwrap")
        (staged / "bwrap").chmod(0o755)  # never setuid: it runs as the caller
        old = work / "old"
        if target.exists():
            target.rename(old)
        staged.rename(target)
    return target / "bwrap"


# ---------------------------------------------------------------------------- seccomp


def _seccomp_rules(server: bool) -> Any:
    """`DENIED_SYSCALLS` refused (EPERM) as a libseccomp filter (``pyseccomp``); for a
    ``server``, all but `SERVER_ALLOWED_SYSCALLS`, and namespaces only of the calls' kinds."""
    import pyseccomp as seccomp

    refused = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        if not (server and name in SERVER_ALLOWED_SYSCALLS):
            rules.add_rule(refused, name)
    never = ("CLONE_NEWUSER", "CLONE_NEWCGROUP")
    for name, flag in _CLONE_NAMESPACES.items():
        if not server or name in never:
            rules.add_rule(refused, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        if server and name in never:
            rules.add_rule(refused, "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return rules


def write_seccomp_filter(path: Path, server: bool = False) -> None:
    """The BPF program of `DENIED_SYSCALLS` (the server's, with ``server``) at ``path``."""
    with path.open("wb") as out:
        _seccomp_rules(server).export_bpf(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class SeccompProgram:
    """The whole filter as a BPF program, built once by a server (libseccomp); each call
    `load`s it last, after `enter_call_namespaces` and `become_call_identity` (a system
    call: nothing is compiled in the call)."""

    def __init__(self) -> None:
        with tempfile.TemporaryFile() as out:
            _seccomp_rules(server=False).export_bpf(out)
            out.seek(0)
            program = out.read()
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._program = _SockFprog(len(program) // 8, ctypes.addressof(self._buffer))

    def load(self) -> None:
        """Into this process, for good, with ``no_new_privs``."""
        libc = _libc()
        _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
        _check(
            libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(self._program), 0, 0),
            "loading the seccomp filter",
        )


# ---------------------------------------------------------------------------- cgroups


@frozen
class CgroupLayout:
    """Where this host's cgroups are: ``v1`` (one hierarchy per controller) or ``v2`` (one
    unified hierarchy), and the directory of this process's own cgroup in each."""

    version: Literal["v1", "v2"]
    own: Mapping[str, Path]  # controller ("unified" for v2) → this process's cgroup directory


def _mounts() -> list[tuple[str, str, set[str]]]:
    out = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, where, kind, options, *_ = line.split()
            out.append((where, kind, set(options.split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and ``""`` for the unified one."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as groups:
        for line in groups:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                out[controller] = path
    return out


def cgroup_layout() -> CgroupLayout | str:
    """This host's cgroups, or why none can be used (a sentence saying how to allow it)."""
    mounts, own = _mounts(), _own_paths()
    v1 = {
        controller: where
        for where, kind, options in mounts
        if kind == "cgroup"
        for controller in _V1_CONTROLLERS
        if controller in options
    }
    if set(v1) == set(_V1_CONTROLLERS):
        dirs = {c: Path(v1[c]) / own.get(c, "/").lstrip("/") for c in _V1_CONTROLLERS}
        unwritable = [str(d) for d in dirs.values() if not os.access(d, os.W_OK)]
        if unwritable:
            return (
                f"the cgroup directories {', '.join(unwritable)} are not writable by uid "
                f"{os.getuid()}; run the trainer as root or delegate them to its user"
            )
        return CgroupLayout("v1", dirs)
    unified = next((Path(w) for w, kind, _ in mounts if kind == "cgroup2"), None)
    if unified is not None:
        mine = unified / own.get("", "/").lstrip("/")
        available = set((mine / "cgroup.controllers").read_text().split())
        missing = [c for c in _V2_CONTROLLERS if c not in available]
        if missing:
            return (
                f"the cgroup v2 hierarchy at {mine} offers no {', '.join(missing)} controller "
                "(and the v1 hierarchies lack "
                f"{', '.join(c for c in _V1_CONTROLLERS if c not in v1)}); enable them for the "
                "trainer's cgroup (systemd: Delegate=yes)"
            )
        if not os.access(mine, os.W_OK):
            return f"the cgroup {mine} is not writable by uid {os.getuid()}; delegate it"
        return CgroupLayout("v2", {"unified": mine})
    return "no cgroup hierarchy is mounted (/sys/fs/cgroup); mount cgroup v1 or v2"


class CgroupTree:
    """The cgroup of one sandboxed process, made outside it (one directory per v1
    controller, or one v2 directory with the controllers enabled below it) and bound into
    its sandbox at ``/sys/fs/cgroup/<controller>`` (v1) or ``/sys/fs/cgroup`` (v2).

    On v2 a cgroup that hands controllers to its children holds no process itself (the
    kernel's "no internal processes" rule): the sandboxed process lives in a leaf of the
    tree (`V2_LEAF`), its calls' cgroups beside it."""

    V2_LEAF = "server"

    def __init__(self, layout: CgroupLayout, name: str) -> None:
        self.layout = layout
        self.dirs: dict[str, Path] = {}
        try:
            for controller, parent in layout.own.items():
                path = parent / name
                path.mkdir()
                self.dirs[controller] = path
            if layout.version == "v2":
                path = self.dirs["unified"]
                enable = " ".join(f"+{c}" for c in _V2_CONTROLLERS)
                (path / "cgroup.subtree_control").write_text(enable)
                (path / self.V2_LEAF).mkdir()
        except OSError as error:
            self.remove()
            raise IsolationError(
                f"cannot make the sandbox's cgroup {name} under "
                f"{', '.join(str(p) for p in layout.own.values())}: {error}"
            ) from error

    def limit_processes(self, count: int) -> None:
        """At most ``count`` processes in the whole tree."""
        controller = "pids" if self.layout.version == "v1" else "unified"
        (self.dirs[controller] / "pids.max").write_text(str(count))

    @property
    def procs_files(self) -> list[str]:
        """Where the sandboxed process joins its tree (v2: the tree's leaf)."""
        if self.layout.version == "v2":
            return [str(self.dirs["unified"] / self.V2_LEAF / "cgroup.procs")]
        return [str(path / "cgroup.procs") for path in self.dirs.values()]

    def binds(self) -> list[str]:
        """bwrap arguments that bind the tree, writable, where `CallCgroup` looks."""
        if self.layout.version == "v2":
            return ["--bind", str(self.dirs["unified"]), "/sys/fs/cgroup"]
        out: list[str] = []
        for controller, path in self.dirs.items():
            out += ["--bind", str(path), f"/sys/fs/cgroup/{controller}"]
        return out

    def kill_and_remove(self) -> None:
        """Kill every process left in the tree (the sandbox's own kill failed or raced) and
        remove its directories, deepest first."""
        for path in self.dirs.values():
            for child in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
                if child.is_dir():
                    _kill_cgroup_dir(child, self.layout.version)
            _kill_cgroup_dir(path, self.layout.version)
        self.remove()

    def remove(self) -> None:
        """Remove the directories, deepest first; processes just killed take a moment to
        leave, so each removal is retried for up to two seconds."""
        deadline = time.monotonic() + 2.0
        for path in self.dirs.values():
            for child in [*sorted(path.rglob("*"), key=lambda p: -len(p.parts)), path]:
                while child.is_dir():
                    try:
                        child.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.01)
        self.dirs = {}


def _kill_cgroup_dir(path: Path, version: str) -> None:
    if version == "v2":
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1")
        return
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


class CallCgroup:
    """One call's cgroup, made by the server inside its sandbox under its own tree: a memory
    limit (no swap), a process limit and a CPU quota; `kill` ends every process in it,
    forked or ``setsid`` or not."""

    def __init__(
        self, name: str, memory_bytes: int, max_processes: int, cpus: float, root: str = ""
    ) -> None:
        base = Path(root or "/sys/fs/cgroup")
        self.version: Literal["v1", "v2"] = "v1" if (base / "memory").is_dir() else "v2"
        controllers = _V1_CONTROLLERS if self.version == "v1" else ("",)
        self.dirs = [base / c / name if c else base / name for c in controllers]
        for path in self.dirs:
            path.mkdir()
        self.killed = False
        self._hits_before = 0
        period = 100_000
        quota = max(int(cpus * period), 1_000)
        if self.version == "v1":
            memory, pids, cpu, _ = self.dirs
            (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # swap accounting may be off
                (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (pids / "pids.max").write_text(str(max_processes))
            (cpu / "cpu.cfs_period_us").write_text(str(period))
            (cpu / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (path,) = self.dirs
            (path / "memory.max").write_text(str(memory_bytes))
            with contextlib.suppress(FileNotFoundError):
                (path / "memory.swap.max").write_text("0")
            (path / "pids.max").write_text(str(max_processes))
            (path / "cpu.max").write_text(f"{quota} {period}")

    def join(self) -> None:
        """Move the calling process into the cgroup (before it drops its capabilities)."""
        for path in self.dirs:
            (path / "cgroup.procs").write_text("0")

    def pids(self) -> list[int]:
        return [int(p) for p in (self.dirs[0] / "cgroup.procs").read_text().split()]

    def kill(self, wait: bool = True) -> None:
        """SIGKILL every process in the cgroup, frozen first (v1) so that none forks past it;
        returns once the cgroup is empty (or after a second), at once without ``wait``."""
        self.killed = True
        if self.version == "v2":
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
        else:
            freezer = self.dirs[3]
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
            with contextlib.suppress(OSError):
                for pid in self.pids():
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")
        if not wait:
            return
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if not self.pids():
                    return
            time.sleep(0.002)

    def _limit_hits(self) -> int:
        """How often the memory limit was reached (v1 ``failcnt``, v2 ``memory.events``)."""
        try:
            if self.version == "v1":
                return int((self.dirs[0] / "memory.failcnt").read_text())
            events = (self.dirs[0] / "memory.events").read_text().split()
            return int(dict(zip(events[::2], events[1::2], strict=True)).get("max", "0"))
        except (OSError, ValueError):
            return 0

    def memory_hit(self) -> bool:
        """Whether the memory limit was reached since the cgroup was made or `reuse`d."""
        return self._limit_hits() > self._hits_before

    def reuse(self) -> bool:
        """Ready for another call, once empty (its limits stay): whether it is."""
        with contextlib.suppress(OSError):
            if not self.pids():
                self._hits_before = self._limit_hits()
                self.killed = False
                return True
        return False

    def remove(self) -> None:
        """Kill what is left (unless `kill` emptied it) and remove the directories."""
        with contextlib.suppress(OSError):
            if not self.killed or self.pids():
                self.kill()
        for path in self.dirs:
            with contextlib.suppress(OSError):
                path.rmdir()


# ---------------------------------------------------------------------------- identities


def call_uid(server_slot: int, call: int) -> int:
    """A uid (and gid) of its own for call ``call`` of the server in ``server_slot``."""
    return _UID_BASE + (server_slot % 4096) * _UIDS_PER_SERVER + call % _UIDS_PER_SERVER


def _capability_words() -> dict[str, int]:
    status = Path("/proc/self/status").read_text()
    return {
        line.split(":")[0]: int(line.split()[1], 16)
        for line in status.splitlines()
        if line.split(":")[0] in _CAP_FIELDS
    }


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise IsolationError(f"{what} failed: {os.strerror(code)}")


def _capset(effective: int, permitted: int, inheritable: int) -> None:
    libc = _libc()
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)(
        effective & 0xFFFFFFFF,
        permitted & 0xFFFFFFFF,
        inheritable & 0xFFFFFFFF,
        effective >> 32,
        permitted >> 32,
        inheritable >> 32,
    )
    _check(libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _drop_bounding(keep: int) -> None:
    libc = _libc()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if not keep & (1 << cap):
            _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"PR_CAPBSET_DROP {cap}")


def confine_server() -> None:
    """In the sandbox's server, first thing: keep `SERVER_CAPABILITIES` only, in the
    effective and permitted sets; nothing inheritable or ambient; not dumpable (no process
    may read its memory or take its descriptors)."""
    libc = _libc()
    keep = sum(1 << bit for bit in SERVER_CAPABILITIES.values())
    _check(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient clear")
    _drop_bounding(keep)
    _capset(keep, keep, 0)


def become_call_identity(uid: int) -> None:
    """In a forked call, before it runs anything: every capability gone from every set, the
    bounding set included, then uid and gid ``uid`` with no supplementary groups, not
    dumpable. Verified from ``/proc/self/status``; an `IsolationError` if anything is left."""
    libc = _libc()
    _check(libc.prctl(_PR_SET_KEEPCAPS, 0, 0, 0, 0), "PR_SET_KEEPCAPS")
    _check(libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient clear")
    _drop_bounding(0)
    setids = (1 << _CAP_SETUID) | (1 << _CAP_SETGID)
    _capset(setids, setids, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # clears the permitted and effective sets
    _check(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    left = {name: word for name, word in _capability_words().items() if word}
    if left or os.getuid() != uid or os.getgroups():
        raise IsolationError(f"the call kept capabilities or groups: {left or os.getgroups()}")


_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_NAMESPACE_FLAGS = {
    "mnt": _CLONE_NAMESPACES["CLONE_NEWNS"],
    "pid": _CLONE_NAMESPACES["CLONE_NEWPID"],
    "net": _CLONE_NAMESPACES["CLONE_NEWNET"],
    "ipc": _CLONE_NAMESPACES["CLONE_NEWIPC"],
    "uts": _CLONE_NAMESPACES["CLONE_NEWUTS"],
}


_own_pid_namespace: int | None = None  # a descriptor of the server's PID namespace


def fork_into_call_pid_namespace() -> int:
    """In a server: `os.fork` with the child as pid 1 of a PID namespace of its own (the
    server then takes its own namespace back for the children it makes next)."""
    global _own_pid_namespace
    libc = _libc()
    if _own_pid_namespace is None:
        _own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    _check(libc.unshare(_NAMESPACE_FLAGS["pid"]), "unshare of the call's PID namespace")
    child = -1
    try:
        child = os.fork()
    finally:
        if child != 0:  # the server (also when the fork failed)
            _check(libc.setns(_own_pid_namespace, _NAMESPACE_FLAGS["pid"]), "setns (own PID)")
    return child


def enter_call_namespaces(network: bool = False) -> None:
    """In a call forked by `fork_into_call_pid_namespace`, after it joined its cgroup and
    before it drops its capabilities: the rest of `CALL_NAMESPACES` of its own, and a
    ``/proc`` that shows its own processes only. Its network namespace has nothing but a
    loopback that is down (with ``network``, it keeps the sandbox's, which is the host's).
    When the call's pid 1 ends, the kernel kills every process left in its namespace."""
    libc = _libc()
    flags = 0
    for name in CALL_NAMESPACES:
        if name != "pid" and not (network and name == "net"):
            flags |= _NAMESPACE_FLAGS[name]
    _check(libc.unshare(flags), f"unshare of the call's namespaces ({', '.join(CALL_NAMESPACES)})")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount (making / private)")
    _check(
        libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None),
        "mount of the call's /proc",
    )


# ---------------------------------------------------------------------------- the sandbox


@frozen
class Confinement:
    """How a sandboxed process is confined: ``network`` (share the host's), the size of its
    in-memory ``/scratch`` and ``/tmp`` (``scratch_mb``), and the environment variables
    let through (`allowed_env`).

    ``single_identity``: the process runs untrusted code itself (a reward process), so it
    becomes one fresh unprivileged identity before its target runs (`become_call_identity`),
    keeping no capability, and its whole cgroup holds at most ``max_processes`` processes.
    Otherwise it is a server that gives each call an identity and a cgroup of its own
    (`confine_server`, `CallCgroup`).
    """

    network: bool = False
    scratch_mb: int = 256
    env: tuple[str, ...] = ()
    single_identity: bool = False
    max_processes: int = 64


_ALWAYS_ALLOWED_ENV = (
    "RLSHELL_EXT_MODULE",
    "RLSHELL_EXT_OBJECTS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "LANG",
    "LC_ALL",
    "TZ",
)


def allowed_env(extra: Sequence[str] = ()) -> dict[str, str]:
    """The caller's variables a sandboxed process gets: extension modules, thread counts,
    locale (and ``extra``); ``PATH``, ``HOME`` and ``TMPDIR`` of its own."""
    env = {name: os.environ[name] for name in (*_ALWAYS_ALLOWED_ENV, *extra) if name in os.environ}
    env.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME="/tmp", TMPDIR="/tmp")
    return env


def _read_only_paths() -> list[str]:
    """The interpreter, its packages and the caller's import path, plus the system's
    libraries: each an existing directory (or file) outside the ones bound anyway."""
    wanted = [
        "/usr",
        "/lib",
        "/lib64",
        "/bin",
        "/sbin",
        "/etc/ld.so.cache",
        "/etc/alternatives",
        "/etc/localtime",
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        str(Path(sys.executable).resolve().parent.parent),
        *sys.path,
    ]
    out: list[str] = []
    for raw in wanted:
        if not raw or (os.path.islink(raw) and raw.count("/") == 1):
            continue  # /lib and friends as links (`_bwrap_arguments`)
        path = os.path.realpath(raw)
        if not os.path.exists(path) or path in out or path in ("/", "/tmp", "/proc", "/dev"):
            continue
        if any(path.startswith(other + "/") for other in out):
            continue
        out = [other for other in out if not other.startswith(path + "/")]
        out.append(path)
    return out


def _bwrap_arguments(
    confinement: Confinement, cgroups: CgroupTree | None, seccomp_fd: int
) -> list[str]:
    args = [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
        "--cap-drop",
        "ALL",
    ]
    if not confinement.network:
        args.append("--unshare-net")
    if cgroups is None or cgroups.layout.version == "v1":
        # Not on v2: a cgroup namespace would be rooted at the tree's leaf, and a process
        # inside may move processes only below its namespace's root, not into the leaf's
        # siblings where the calls' cgroups are (its /sys/fs/cgroup is the tree anyway).
        args.append("--unshare-cgroup-try")
    for name in SERVER_CAPABILITIES:
        args += ["--cap-add", name]
    for link in ("/lib", "/lib64", "/bin", "/sbin"):  # merged /usr: links into it
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
    # The in-memory /tmp first: binds made after it stay visible (a venv under /tmp).
    size = str(confinement.scratch_mb * 2**20)
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/scratch"]
    if confinement.single_identity:  # its one unprivileged identity writes here
        args += ["--chmod", "1777", "/tmp", "--chmod", "1777", "/scratch"]
    made: set[str] = {"/tmp"}
    for path in _read_only_paths():
        parts = Path(path).parts[1:-1]
        for depth in range(1, len(parts) + 1):
            parent = "/" + "/".join(parts[:depth])
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", path, path]

    if cgroups is not None:
        args += cgroups.binds()
    for name, value in allowed_env(confinement.env).items():
        args += ["--setenv", name, value]
    args += ["--chdir", "/scratch", "--seccomp", str(seccomp_fd)]
    return args


def sandbox_main() -> None:
    """The entry point of a sandboxed process: ``python -I -c 'from rlshell.isolation import
    sandbox_main; sandbox_main()' FD SPEC``. ``SPEC`` is JSON: the import path, the target
    ``module:function`` and its arguments; the target is called as ``target(conn, *args)``
    with the connection on descriptor ``FD``, after `confine_server`."""
    fd, spec = int(sys.argv[1]), json.loads(sys.argv[2])
    sys.path[:] = spec["path"]
    if spec["single_identity"]:
        become_call_identity(call_uid(secrets.randbelow(4096), 0))
    else:
        confine_server()
    module_name, function_name = spec["target"].split(":")
    module = __import__(module_name, fromlist=[function_name])
    target = getattr(module, function_name)
    conn = Connection(fd)
    target(conn, *spec["args"])


class SandboxedProcess:
    """A process started inside bubblewrap, shaped as `multiprocessing.Process` is for
    `rlshell.process_pool.PooledProcess`: ``start``, ``pid``, ``exitcode``, ``kill``,
    ``join``. ``target`` is ``"module:function"``; ``args`` are JSON values."""

    def __init__(
        self,
        target: str,
        args: tuple[Any, ...],
        name: str,
        confinement: Confinement,
        conn: Connection,
        daemon: bool = True,
    ) -> None:
        self.target, self.args, self.name = target, args, name
        self.confinement = confinement
        self._conn = conn
        self.daemon = daemon
        self._popen: subprocess.Popen[bytes] | None = None
        self._cgroups: CgroupTree | None = None
        self.pid: int | None = None

    def start(self) -> None:
        bwrap = bwrap_path()
        if bwrap is None:
            raise IsolationError(_NO_BWRAP)
        layout = cgroup_layout()
        if isinstance(layout, str):
            raise IsolationError(f"cgroups: {layout}")
        self._cgroups = CgroupTree(layout, f"rlstack-sandbox-{secrets.token_hex(6)}")
        if self.confinement.single_identity:
            self._cgroups.limit_processes(self.confinement.max_processes)
        with tempfile.TemporaryDirectory(prefix="rlshell-seccomp-") as scratch:
            filter_path = Path(scratch) / "filter.bpf"
            write_seccomp_filter(filter_path, server=not self.confinement.single_identity)
            seccomp_fd = os.open(filter_path, os.O_RDONLY)
        try:
            spec = {
                "path": [p for p in sys.path if p],
                "target": self.target,
                "args": self.args,
                "single_identity": self.confinement.single_identity,
            }
            command = [
                str(bwrap),
                *_bwrap_arguments(self.confinement, self._cgroups, seccomp_fd),
                "--",
                sys.executable,
                "-I",
                "-c",
                "from rlshell.isolation import sandbox_main; sandbox_main()",
                str(self._conn.fileno()),
                json.dumps(spec),
            ]
            # A shell moves itself into the cgroup, then becomes bwrap: everything bwrap
            # starts is in the cgroup from its first instruction.
            join = 'for f in $RLSHELL_CGROUP_PROCS; do echo $$ > "$f" || exit 111; done; exec "$@"'
            self._popen = subprocess.Popen(
                ["/bin/sh", "-c", join, "sh", *command],
                pass_fds=(self._conn.fileno(), seccomp_fd),
                env={
                    "RLSHELL_CGROUP_PROCS": " ".join(self._cgroups.procs_files),
                    "PATH": "/usr/bin:/bin",
                },
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            self._cgroups.remove()
            raise
        finally:
            os.close(seccomp_fd)
        self.pid = self._popen.pid

    @property
    def exitcode(self) -> int | None:
        if self._popen is None:
            return None
        code = self._popen.poll()
        if code is not None:
            self._cleanup()
        return code

    def kill(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._popen.pid, signal.SIGKILL)
        if self._cgroups is not None:
            self._cgroups.kill_and_remove()

    def join(self, timeout: float | None = None) -> None:
        if self._popen is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)
        if self._popen.poll() is not None:
            self._cleanup()

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def _cleanup(self) -> None:
        if self._cgroups is not None:
            self._cgroups.kill_and_remove()
            self._cgroups = None


_NO_BWRAP = (
    "bubblewrap: no bwrap binary (run `make install`, or `python -m rlshell.isolation "
    f"install`, or set {BWRAP_ENV_VAR} to one)"
)


class SandboxContext:
    """A `multiprocessing` context for `rlshell.process_pool.Starter` whose processes are
    `SandboxedProcess`es: ``target`` must be a module-level function (it is imported by
    name inside the sandbox), its arguments JSON values."""

    def __init__(self, confinement: Confinement) -> None:
        self.confinement = confinement

    def Pipe(self, duplex: bool = True) -> tuple[Connection, Connection]:
        import multiprocessing

        return multiprocessing.Pipe(duplex)

    def Process(
        self, target: Any, args: tuple[Any, ...], name: str, daemon: bool = True
    ) -> SandboxedProcess:
        conn, *rest = args
        spec = f"{target.__module__}:{target.__qualname__}"
        return SandboxedProcess(spec, tuple(rest), name, self.confinement, conn, daemon)


# ---------------------------------------------------------------------------- the host


def isolation_problems(network: bool = False) -> list[str]:
    """What this host withholds of the sandbox, one sentence per part, saying how to allow
    it; empty where every part works (a probe sandbox is started and checked)."""
    problems = []
    bwrap = bwrap_path()
    if bwrap is None:
        problems.append(_NO_BWRAP)
    layout = cgroup_layout()
    if isinstance(layout, str):
        problems.append(f"cgroups: {layout}")
    try:
        import pyseccomp  # noqa: F401

        with tempfile.TemporaryDirectory() as scratch:
            write_seccomp_filter(Path(scratch) / "probe.bpf")
    except (ImportError, OSError, RuntimeError) as error:
        problems.append(
            f"seccomp: libseccomp could not build the filter ({type(error).__name__}: {error}); "
            "install libseccomp2 (Debian) and the pyseccomp package"
        )
    if os.geteuid() != 0:
        problems.append(
            f"privileges: the sandbox's server needs root to hand each call a uid of its own "
            f"(this process runs as uid {os.geteuid()}); run the trainer as root in its "
            "container, or opt out with isolation='weak'"
        )
    if problems or bwrap is None:
        return problems
    probe = _probe_bwrap(bwrap, network)
    if probe:
        problems.append(probe)
    return problems


# Run inside the probe sandbox: what a server does for each call (`fork_into_call_pid_namespace`,
# `enter_call_namespaces`), the child's exit status telling whether the host allows it.
_CALL_PROBE = """
import os, sys
sys.path[:0] = {path!r}
from rlshell.isolation import enter_call_namespaces, fork_into_call_pid_namespace
child = fork_into_call_pid_namespace()
if child == 0:
    try:
        enter_call_namespaces({network!r})
    except BaseException as error:
        print(f"{{type(error).__name__}}: {{error}}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(child, 0)
sys.exit(0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 3)
"""


def _probe_bwrap(bwrap: Path, network: bool) -> str:
    with tempfile.TemporaryDirectory(prefix="rlshell-seccomp-") as scratch:
        filter_path = Path(scratch) / "filter.bpf"
        write_seccomp_filter(filter_path, server=True)
        fd = os.open(filter_path, os.O_RDONLY)
    try:
        done = subprocess.run(
            [
                str(bwrap),
                *_bwrap_arguments(Confinement(network=network), None, fd),
                "--",
                sys.executable,
                "-I",
                "-c",
                _CALL_PROBE.format(path=[p for p in sys.path if p], network=network),
            ],
            pass_fds=(fd,),
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
        )
    finally:
        os.close(fd)
    if done.returncode == 3:
        why = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return (
            f"call namespaces: the sandbox started, but could not give a call PID, mount, "
            f"network, IPC and UTS namespaces of its own and its own /proc ({why[0]}); the "
            "host must let a process with CAP_SYS_ADMIN in the sandbox unshare them and "
            "mount procfs (a container whose /proc is partly masked refuses the mount: run "
            "it with --privileged or an unmasked /proc), or opt out with isolation='weak'"
        )
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return (
            f"namespaces: bubblewrap could not start a sandbox here ({why[0]}); the host must "
            "allow new PID, mount, IPC, UTS and network namespaces (a container needs "
            "CAP_SYS_ADMIN, or run it with --privileged or a seccomp profile that allows "
            "unshare)"
        )
    return ""


def main(argv: list[str] | None = None) -> int:
    """``python -m rlshell.isolation install|status``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rlshell.isolation")
    parser.add_argument("command", choices=("install", "status"))
    args = parser.parse_args(argv)
    if args.command == "install":
        if bwrap_path() is not None and not os.environ.get(BWRAP_ENV_VAR):
            print(f"bubblewrap: {bwrap_path()}")
            return 0
        try:
            path = install_bubblewrap()
        except InstallError as error:
            print(f"bubblewrap: not installed: {error}", file=sys.stderr)
            return 1
        print(f"bubblewrap: installed {path}")
        return 0
    problems = isolation_problems()
    for problem in problems:
        print(problem)
    if not problems:
        print(f"sandbox: every part works here (bwrap {bwrap_path()})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
