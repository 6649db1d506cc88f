"""The tool sandbox under attack: one test per class of attack, each through the public
`ToolExecutor` (default isolation, `rlshell.isolation`), beside a stand-in trainer.

The stand-in trainer is a process of this machine's user (root here) that holds what a
trainer holds: credentials in its environment, a listener on loopback TCP, a Unix socket by
path and an abstract one, a checkpoint file and the project's virtual environment. Each
attack must fail; after the module the stand-in must still run, none of its listeners may
have been reached, and every file it holds must be unchanged (`test_the_trainer_saw_nothing`).
The executor's own process (this one) holds the same credentials.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlshell.isolation import isolation_problems
from rlshell.rewards.pool import RewardPool
from rlshell.tools.parsing import ToolCall
from rlshell.tools.sandbox import ToolExecutor, ToolLimits, ToolResult

SECRET = "sk-test-0123456789abcdef"
PROBLEMS = isolation_problems()
pytestmark = pytest.mark.skipif(
    bool(PROBLEMS), reason=f"the sandbox cannot run on this host: {'; '.join(PROBLEMS)}"
)

TRAINER = textwrap.dedent(
    """
    import json, os, socket, sys, threading, time
    state = sys.argv[1]
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(os.path.join(state, "trainer.sock"))
    unix.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\\0rlstack-test-trainer-" + str(os.getpid()))
    abstract.listen()
    reached = open(os.path.join(state, "reached.log"), "a", buffering=1)

    def serve(server, name):
        while True:
            connection, _ = server.accept()
            reached.write(name + "\\n")
            connection.close()

    for server, name in ((tcp, "tcp"), (unix, "unix"), (abstract, "abstract")):
        threading.Thread(target=serve, args=(server, name), daemon=True).start()
    info = {"pid": os.getpid(), "port": tcp.getsockname()[1],
            "abstract": "rlstack-test-trainer-" + str(os.getpid())}
    with open(os.path.join(state, "info.json"), "w") as out:
        json.dump(info, out)
    while True:
        time.sleep(1)
    """
)


def _digest(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


class Trainer:
    """The stand-in trainer process and what it holds."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.checkpoint = state / "checkpoint" / "model.safetensors"
        self.checkpoint.parent.mkdir()
        self.checkpoint.write_bytes(os.urandom(4096))
        site = Path(next(p for p in sys.path if p.endswith("site-packages")))
        self.watched = [self.checkpoint, *sorted(site.glob("*.pth"))]
        self.before = _digest(self.watched)
        self.site = site
        env = {**os.environ, "WANDB_API_KEY": SECRET, "HF_TOKEN": SECRET}
        self.process = subprocess.Popen([sys.executable, "-c", TRAINER, str(state)], env=env)
        deadline = time.monotonic() + 30
        while not (state / "info.json").exists():
            assert time.monotonic() < deadline, "the stand-in trainer did not start"
            time.sleep(0.05)
        time.sleep(0.05)
        self.info = json.loads((state / "info.json").read_text())

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    def reached(self) -> list[str]:
        log = self.state / "reached.log"
        return log.read_text().split() if log.exists() else []


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trainer]:
    stand_in = Trainer(tmp_path_factory.mktemp("trainer"))
    yield stand_in
    stand_in.process.kill()
    stand_in.process.wait()


@pytest.fixture(scope="module")
def tools(trainer: Trainer) -> Iterator[ToolExecutor]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_API_KEY", SECRET)
        patch.setenv("HF_TOKEN", SECRET)
        limits = ToolLimits(timeout_s=10.0, memory_mb=64, max_processes=16, max_file_mb=1)
        with ToolExecutor(["python"], limits) as executor:
            yield executor


def attack(tools: ToolExecutor, code: str) -> ToolResult:
    (result,) = tools.run([ToolCall("python", textwrap.dedent(code), "")])
    return result


def test_secrets_in_the_environment_are_not_there(tools: ToolExecutor, trainer: Trainer) -> None:
    result = attack(
        tools,
        """
        import os
        print(sorted(os.environ))
        found = []
        for pid in os.listdir('/proc'):
            if pid.isdigit():
                try:
                    found.append(open(f'/proc/{pid}/environ', 'rb').read())
                except OSError:
                    pass
        print(any(b'sk-test' in blob for blob in found))
        """,
    )
    assert SECRET not in result.observation
    assert "WANDB_API_KEY" not in result.observation
    assert "HF_TOKEN" not in result.observation
    assert result.observation.splitlines()[-1] == "False"


def test_another_process_environment_cannot_be_read(tools: ToolExecutor, trainer: Trainer) -> None:
    result = attack(
        tools,
        f"""
        for pid in ({trainer.pid}, {os.getpid()}, 1):
            try:
                print(open(f'/proc/{{pid}}/environ', 'rb').read()[:20])
            except OSError as error:
                print(type(error).__name__)
        """,
    )
    assert "sk-test" not in result.observation
    assert all(
        line in ("FileNotFoundError", "PermissionError") for line in result.observation.splitlines()
    ), result.observation


def test_capabilities_are_gone_and_cannot_come_back(tools: ToolExecutor) -> None:
    result = attack(
        tools,
        """
        import ctypes, os
        for line in open('/proc/self/status'):
            name, _, value = line.partition(':')
            if name in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb'):
                print(name, int(value, 16))
        libc = ctypes.CDLL(None, use_errno=True)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)(0xFFFFFFFF, 0xFFFFFFFF, 0, 0xFF, 0xFF, 0)
        print('capset', libc.capset(ctypes.byref(header), ctypes.byref(data)))
        print('setuid', libc.setuid(0), os.getuid() != 0)
        """,
    )
    assert result.observation == (
        "CapInh 0\nCapPrm 0\nCapEff 0\nCapBnd 0\nCapAmb 0\ncapset -1\nsetuid -1 True\n"
    )


def test_no_other_namespace_can_be_entered_or_made(tools: ToolExecutor, trainer: Trainer) -> None:
    result = attack(
        tools,
        f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        for path in ('/proc/1/ns/net', '/proc/{trainer.pid}/ns/net', '/proc/self/ns/net'):
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as error:
                print('open', type(error).__name__)
                continue
            print('setns', libc.setns(fd, 0), ctypes.get_errno())
        print('unshare', libc.unshare(0x10000000), ctypes.get_errno())  # a user namespace
        print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())
        """,
    )
    lines = result.observation.splitlines()
    assert "setns -1 1" in lines  # its own namespace: opened, but setns is refused (EPERM)
    assert "unshare -1 1" in lines
    assert "mount -1 1" in lines
    assert not any(line.startswith("setns 0") for line in lines)


def test_no_process_outside_the_call_can_be_traced_or_signalled(
    tools: ToolExecutor, trainer: Trainer
) -> None:
    # The call is pid 1 of a PID namespace of its own: its parent (the sandbox's server) is
    # out of sight and no pid of the machine's names anything there.
    outside = (trainer.pid, os.getpid(), *tools.pids)
    result = attack(
        tools,
        f"""
        import ctypes, os, signal
        libc = ctypes.CDLL(None, use_errno=True)
        print('me', os.getpid(), 'parent', os.getppid())
        for pid in {outside}:
            print('ptrace', libc.ptrace(16, pid, 0, 0))
            try:
                os.kill(pid, signal.SIGKILL)
                print('killed', pid)
            except OSError as error:
                print('kill', type(error).__name__)
        try:
            os.kill(-1, signal.SIGKILL)  # every process it may signal: none but itself
        except OSError as error:
            print('kill -1', type(error).__name__)
        """,
    )
    lines = result.observation.splitlines()
    assert lines[0] == "me 1 parent 0", result.observation
    assert "killed" not in result.observation
    assert all(line == "ptrace -1" for line in lines if "ptrace" in line)
    assert lines.count("kill ProcessLookupError") == len(outside)
    assert trainer.process.poll() is None
    assert attack(tools, "print('still serving')").observation == "still serving\n"


NAMESPACES = ("pid", "net", "mnt", "ipc", "uts")


def test_each_call_has_namespaces_of_its_own(tools: ToolExecutor, trainer: Trainer) -> None:
    # A call could otherwise leave something behind for a later call (of another rollout)
    # to find: here a System V shared-memory segment, world-readable, under a known key.
    code = f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print('processes', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
        for name in {NAMESPACES}:
            print(name, os.readlink('/proc/self/ns/' + name))
        print('found', libc.shmget(0x5EC2E7, 0, 0) >= 0)
        print('left', libc.shmget(0x5EC2E7, 4096, 0o1000 | 0o666) >= 0)  # IPC_CREAT
        """
    first, second = (attack(tools, code).observation.splitlines() for _ in range(2))
    seen: dict[str, set[str]] = {name: set() for name in NAMESPACES}
    for lines in (first, second):
        assert lines[0] == "processes [1]", lines  # only itself
        assert lines[-2:] == ["found False", "left True"], lines
        for line in lines[1:-2]:
            name, namespace = line.split()
            seen[name].add(namespace)
    import psutil

    def pid_namespace(pid: int) -> str:
        try:
            return os.readlink(f"/proc/{pid}/ns/pid")
        except FileNotFoundError:  # a runner ending meanwhile (a zombie has no namespaces)
            return "gone"

    sandboxes = [psutil.Process(pid) for pid in tools.pids]
    # The servers: in the sandbox's PID namespace (that of bubblewrap's child, its pid 1).
    # Not a runner forked ahead for the next call: it is in a PID namespace of its own and,
    # while it sets up, may already hold a mount namespace under the number the first call's
    # had (freed and handed out again), so it is no outsider.
    inside = {pid_namespace(child.pid) for sandbox in sandboxes for child in sandbox.children()}
    servers = [
        child.pid
        for sandbox in sandboxes
        for child in sandbox.children(recursive=True)
        if pid_namespace(child.pid) in inside
    ]
    outsiders: dict[str, set[str]] = {name: set() for name in NAMESPACES}
    for pid in (trainer.pid, *tools.pids, *servers):
        for name in NAMESPACES:
            with contextlib.suppress(FileNotFoundError):  # a runner ending meanwhile
                outsiders[name].add(os.readlink(f"/proc/{pid}/ns/{name}"))
    # Neither the trainer's nor the sandbox's (its server's), which live on; two calls one
    # after the other may show the same number, the first's freed and handed out again, so
    # that the calls' own are told apart by what the first one left (above), not by number.
    for name in NAMESPACES:
        assert seen[name], name
        assert not seen[name] & outsiders[name], name


def test_loopback_tcp_and_unix_sockets_are_out_of_reach(
    tools: ToolExecutor, trainer: Trainer
) -> None:
    result = attack(
        tools,
        f"""
        import socket
        for family, address in (
            (socket.AF_INET, ('127.0.0.1', {trainer.info["port"]})),
            (socket.AF_UNIX, {str(trainer.state / "trainer.sock")!r}),
            (socket.AF_UNIX, '\\0' + {trainer.info["abstract"]!r}),
        ):
            try:
                socket.socket(family).connect(address)
                print('connected', address)
            except OSError as error:
                print(type(error).__name__)
        """,
    )
    assert "connected" not in result.observation
    assert len(result.observation.splitlines()) == 3
    time.sleep(0.2)
    assert trainer.reached() == []


def test_nothing_outside_the_scratch_directory_can_be_written(
    tools: ToolExecutor, trainer: Trainer
) -> None:
    targets = [
        trainer.checkpoint,
        trainer.site / "rlstack_attack.pth",
        Path(sys.prefix) / "bin" / "python",
        Path(__file__),
    ]
    result = attack(
        tools,
        f"""
        import os
        for path in {[str(t) for t in targets]!r}:
            try:
                with open(path, 'ab') as out:
                    out.write(b'import os; os.system("id")')
                print('wrote', path)
            except OSError as error:
                print(type(error).__name__, error.strerror)
        open('here.txt', 'w').write('fine')
        print(os.listdir('.'))
        """,
    )
    assert "wrote" not in result.observation
    assert result.observation.splitlines()[-1] == "['here.txt']"
    assert not (trainer.site / "rlstack_attack.pth").exists()


def test_forks_cannot_pass_the_memory_or_process_limit(tools: ToolExecutor) -> None:
    # Twelve children of 48 MB each (each under its own address-space limit of 64 MB):
    # 576 MB, more than the call's cgroup holds (64 MB beyond what its process started
    # with, which is well under 400 MB): the cgroup's limit takes them, not the machine.
    memory = attack(
        tools,
        """
        import os, time
        wanted = 12
        children = []
        for _ in range(wanted):
            pid = os.fork()
            if pid == 0:
                block = bytearray(48 * 2**20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(2)
                os._exit(0)
            children.append(pid)
        statuses = [os.waitpid(pid, 0)[1] for pid in children]
        held = sum(os.WIFEXITED(s) and os.WEXITSTATUS(s) == 0 for s in statuses)
        print('held', held, 'of', wanted)
        """,
    )
    lines = [line.split() for line in memory.observation.splitlines() if line.startswith("held")]
    assert memory.status == "memory" or (lines and lines[0][1] != lines[0][3]), memory
    forks = attack(
        tools,
        """
        import os, time
        made = 0
        try:
            for _ in range(200):
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                made += 1
        except OSError as error:
            print(type(error).__name__, made)
        """,
    )
    name, made = forks.observation.split()
    assert name == "BlockingIOError"
    assert int(made) < 16


def test_a_setsid_daemon_does_not_outlive_its_call(tools: ToolExecutor) -> None:
    result = attack(
        tools,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(60)
            os._exit(0)
        time.sleep(0.2)
        print(os.getuid())
        """,
    )
    uid = int(result.observation.split()[-1])
    time.sleep(0.5)
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
        if str(uid) in uids:
            left.append(pid)
    assert left == []


def test_the_disk_cannot_be_filled(tools: ToolExecutor) -> None:
    before = shutil.disk_usage("/tmp").free
    result = attack(
        tools,
        """
        import os
        written = 0
        try:
            for index in range(100_000):
                with open(f'fill{index}', 'wb') as out:
                    out.write(b'0' * 2**20)
                written += 1
        except OSError as error:
            print(type(error).__name__, error.strerror, written)
        """,
    )
    after = shutil.disk_usage("/tmp").free
    assert result.status in ("error", "ok", "memory", "crashed")
    assert abs(before - after) < 64 * 2**20  # whatever it wrote was its own, in memory


def test_a_forged_result_reaches_the_caller_as_a_plain_result(
    tools: ToolExecutor, trainer: Trainer
) -> None:
    # The call writes a result header claiming an endless payload of an unknown kind, then
    # tries to take its server's connection to the caller.
    result = attack(
        tools,
        """
        import ctypes, os, struct
        libc = ctypes.CDLL(None, use_errno=True)
        os.write(4, struct.pack('>cQ', b'x', 2**62) + b'["answer", "ok", "pwned", 0]')
        pidfd = libc.syscall(434, os.getppid(), 0)  # pidfd_open
        print('pidfd_getfd', libc.syscall(438, pidfd, 3, 0) if pidfd >= 0 else 'no pidfd')
        for fd in range(3, 12):
            try:
                os.open(f'/proc/{os.getppid()}/fd/{fd}', os.O_WRONLY)
                print('opened', fd)
            except OSError:
                pass
        """,
    )
    assert isinstance(result, ToolResult)
    assert "opened" not in result.observation
    assert "pwned" not in result.observation or result.status != "ok"
    assert attack(tools, "print(6 * 7)").observation == "42\n"


def test_the_trainer_saw_nothing(tools: ToolExecutor, trainer: Trainer) -> None:
    """Run last in this module: the stand-in trainer still runs, no listener of it was
    reached, and its files are as they were."""
    assert trainer.process.poll() is None
    assert trainer.reached() == []
    assert _digest(trainer.watched) == trainer.before
    assert not (trainer.site / "rlstack_attack.pth").exists()


# ------------------------------------------------ reward functions that run the model's code

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def rewards(trainer: Trainer) -> Iterator[RewardPool]:
    """A reward pool (default isolation) whose reward runs each response as Python. (With
    ``isolation='weak'`` the first attack below that works, ptrace, stops this process.)"""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_API_KEY", SECRET)
        patch.setenv("HF_TOKEN", SECRET)
        patch.setenv("RLSHELL_EXT_MODULE", "reward_exec_ext")
        patch.syspath_prepend(str(HERE))
        with RewardPool("run_code", timeout_s=10.0, num_processes=1, failure_score=-1.0) as pool:
            yield pool


def reward_attacks(trainer: Trainer) -> dict[str, str]:
    """Each attack's code: ``score = 1.0`` where it succeeded."""
    port, abstract = trainer.info["port"], trainer.info["abstract"]
    sock = trainer.state / "trainer.sock"
    return {
        "secrets": "import os\nscore = float(any('sk-test' in v for v in os.environ.values()))",
        "environ": textwrap.dedent(
            f"""
            for pid in ({trainer.pid}, {os.getpid()}, 1):
                try:
                    if b'sk-test' in open(f'/proc/{{pid}}/environ', 'rb').read():
                        score = 1.0
                except OSError:
                    pass
            """
        ),
        "capabilities": textwrap.dedent(
            """
            words = [line.split()[1] for line in open('/proc/self/status')
                     if line.split(':')[0] in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')]
            score = float(any(int(word, 16) for word in words))
            """
        ),
        "namespaces": textwrap.dedent(
            """
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open('/proc/self/ns/net', os.O_RDONLY)
            score = float(libc.setns(fd, 0) == 0 or libc.unshare(0x10000000) == 0)
            """
        ),
        "ptrace and signals": textwrap.dedent(
            f"""
            import ctypes, os, signal
            libc = ctypes.CDLL(None, use_errno=True)
            for pid in ({trainer.pid}, {os.getpid()}, os.getppid(), 1):
                if libc.ptrace(16, pid, 0, 0) == 0:
                    score = 1.0
                try:
                    os.kill(pid, 0)
                    score = 1.0 if pid in ({trainer.pid}, {os.getpid()}) else score
                except OSError:
                    pass
            """
        ),
        "sockets": textwrap.dedent(
            f"""
            import socket
            for family, address in ((socket.AF_INET, ('127.0.0.1', {port})),
                                    (socket.AF_UNIX, {str(sock)!r}),
                                    (socket.AF_UNIX, '\\0' + {abstract!r})):
                try:
                    socket.socket(family).connect(address)
                    score = 1.0
                except OSError:
                    pass
            """
        ),
        "writes": textwrap.dedent(
            f"""
            targets = ({str(trainer.checkpoint)!r}, {str(trainer.site / "rlstack_attack.pth")!r})
            for path in targets:
                try:
                    open(path, 'ab').write(b'x')
                    score = 1.0
                except OSError:
                    pass
            """
        ),
        "fork bomb": textwrap.dedent(
            """
            import os, time
            made = 0
            try:
                for _ in range(300):
                    if os.fork() == 0:
                        time.sleep(3)
                        os._exit(0)
                    made += 1
            except OSError:
                pass
            score = float(made >= 300)
            """
        ),
    }


def test_reward_code_cannot_break_out_either(rewards: RewardPool, trainer: Trainer) -> None:
    attacks = reward_attacks(trainer)
    result = rewards.score_each(list(attacks.values()), [""] * len(attacks))["run_code"]
    outcome = dict(zip(attacks, result.scores, strict=True))
    assert outcome == dict.fromkeys(attacks, 0.0), result.error_examples
    assert trainer.process.poll() is None
    assert trainer.reached() == []
    assert _digest(trainer.watched) == trainer.before
