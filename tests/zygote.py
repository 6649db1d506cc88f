"""The warm interpreter of `tests/launcher.py`: imports the drivers' modules once, then forks.

    python tests/zygote.py FD

(With ``RLSTACK_ZYGOTE_WORKERS`` set, it also listens on a Unix socket for the shared
cluster's Ray workers, `tests/worker_client.py`, and forks ``default_worker.py`` for each:
`WorkerPolicy`, `_fork_worker`, `_apply_worker_settings`.)

``FD`` is a SOCK_SEQPACKET socket to the pytest process. Each message is a JSON request
(``argv``, ``env``, ``cwd``, ``ray``: the address of a Ray cluster of ``ray_cpus`` CPUs to
join where the run would start its own, or null) with four file
descriptors (stdin, stdout, stderr, and a pipe for the exit status). The zygote forks; the
fork becomes the run; the zygote answers ``{"pid": ...}``, and when the run ends writes its
exit status (`subprocess`'s convention: negative for a signal) to the status pipe.

The fork leaves the zygote's loop by returning from `serve`, so the run executes at the
top of this module's stack, and ends as the interpreter ends a program (`finish`): the exit
status of a ``SystemExit`` or 1 after an uncaught exception (its traceback on stderr),
non-daemon threads joined, ``atexit`` handlers run, streams flushed. Then the fork leaves
with ``os._exit``: the interpreter's own teardown (clearing every module the zygote
imported, ~540,000 objects) is skipped. It runs no code of the program (what a program
needs at exit it registers with ``atexit``, and Python does not promise ``__del__`` at
exit), and it cost 2.5 s of every run: each object it touches copies the zygote's page.
"""

from __future__ import annotations

import importlib
import importlib.abc
import io
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

Request = dict[str, Any]


class _Withheld(BaseException):
    """Raised by `_Withhold` (a BaseException: a library's ``except ImportError`` fallback
    must not catch it and preload a module that believes the package absent)."""


class _Withhold(importlib.abc.MetaPathFinder):
    """While the zygote preloads, imports of ``packages`` fail, and so every module that
    imports them: they are left to the forks."""

    def __init__(self, packages: set[str]) -> None:
        self.packages = packages

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname.partition(".")[0] in self.packages:
            raise _Withheld(fullname)
        return None


def preload() -> list[str]:
    """Import the modules `RLSTACK_ZYGOTE_MODULES` lists (one a line, ``#`` comments);
    those that fail to import are left to the runs, which meet the same error.

    ``RLSTACK_ZYGOTE_WITHOUT`` (comma-separated top-level packages) withholds packages and
    whatever imports them: the Ray workers' zygote has no ``ray``, whose C++ settings
    (RayConfig: the worker's job id) are read once, from the environment of the process
    that loads it, and would be the zygote's in every worker."""
    listing = os.environ.pop("RLSTACK_ZYGOTE_MODULES", "")
    without = {name for name in os.environ.pop("RLSTACK_ZYGOTE_WITHOUT", "").split(",") if name}
    names = []
    if listing and os.path.exists(listing):
        with open(listing) as lines:
            names = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    withhold = _Withhold(without)
    sys.meta_path.insert(0, withhold)
    loaded = []
    try:
        for name in names:
            try:
                importlib.import_module(name)
            except (Exception, _Withheld):  # a platform's module, a helper's private name
                continue
            loaded.append(name)
    finally:
        sys.meta_path.remove(withhold)
    return loaded


def serve(
    sock: socket.socket, workers: socket.socket | None, policy: WorkerPolicy | None
) -> tuple[Request, list[int]]:
    """Fork a run for each request (from the pytest process on ``sock``, from a Ray worker's
    `tests/worker_client.py` on ``workers``), reap them, report their status; returns only
    in a fork."""
    running: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, status fd)
    listening = [] if workers is None else [workers.fileno()]
    while True:
        readable, _, _ = select.select([sock.fileno(), *listening, *running], [], [])
        for fd in readable:
            if workers is not None and fd == workers.fileno():
                assert policy is not None
                forked = _fork_worker(workers, policy, running)
                if forked is not None:
                    sock.close()
                    return forked
                continue
            if fd != sock.fileno():
                pid, status_fd = running.pop(fd)
                _, status = os.waitpid(pid, 0)
                os.write(status_fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())
                os.close(status_fd)
                os.close(fd)
                continue
            message, fds, _, _ = socket.recv_fds(sock, 1 << 22, 4)
            if not message:  # the pytest process is gone or done
                for pidfd, (pid, status_fd) in running.items():
                    os.kill(pid, signal.SIGKILL)
                    os.close(status_fd)
                    os.close(pidfd)
                raise SystemExit(0)
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as error:
                for received in fds:
                    os.close(received)
                sock.send(json.dumps({"error": str(error)}).encode())
                continue
            if pid == 0:
                sock.close()
                if workers is not None:
                    workers.close()
                for pidfd, (_, status_fd) in running.items():  # the other runs' ends
                    os.close(pidfd)
                    os.close(status_fd)
                return request, fds
            for received in fds[:3]:
                os.close(received)
            running[os.pidfd_open(pid)] = (pid, fds[3])
            sock.send(json.dumps({"pid": pid}).encode())


def _unimported(packages: Any) -> set[str]:
    """Those of ``packages`` (top-level names) that this process has not imported."""
    return {package for package in packages if package not in sys.modules}


class WorkerPolicy:
    """Which Ray workers are forked: those whose environment differs from the one the zygote
    imported its modules in by no variable read at import (`tests/launcher.py` sends the
    rules: prefixes, and the names exempt: read when used, or applied by the fork,
    `_apply_worker_settings`). Each start is logged, one line, to ``log``."""

    def __init__(self, rules: dict[str, Any], env: dict[str, str]) -> None:
        # A prefix whose package this zygote has not imported is read by the fork's import.
        self.prefixes = tuple(
            prefix
            for prefix in rules["prefixes"]
            if rules["packages"].get(prefix, "") not in _unimported(rules["packages"].values())
        )
        self.exempt = frozenset(rules["exempt"])
        self.log: str = rules["log"]
        self.env = env

    def cold_because(self, env: dict[str, str]) -> list[str]:
        return sorted(
            name
            for name in set(env) | set(self.env)
            if name.startswith(self.prefixes)
            and name not in self.exempt
            and env.get(name) != self.env.get(name)
            # No seed: a fresh worker draws one at random, of which the zygote's 0 is one.
            and not (name == "PYTHONHASHSEED" and name not in env)
        )

    def note(self, line: str) -> None:
        with open(self.log, "a") as log:
            log.write(line + "\n")


def _fork_worker(
    workers: socket.socket, policy: WorkerPolicy, running: dict[int, tuple[int, int]]
) -> tuple[Request, list[int]] | None:
    """Accept one worker's request; fork it (returns in the fork) or answer why not."""
    conn, _ = workers.accept()
    with conn:
        fds: list[int] = []
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 22, 4)
            request = json.loads(message)
        except (OSError, ValueError):  # the client died before it asked: nothing to start
            for received in fds:
                os.close(received)
            return None
        differ = policy.cold_because(request["env"])
        if differ:
            policy.note(f"cold (read at import: {', '.join(differ)})")
            for received in fds:
                os.close(received)
            conn.send(json.dumps({"cold": differ}).encode())
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as error:
            policy.note(f"cold (fork failed: {error})")
            for received in fds:
                os.close(received)
            conn.send(json.dumps({"cold": str(error)}).encode())
            return None
        if pid == 0:
            workers.close()
            for pidfd, (_, status_fd) in running.items():
                os.close(pidfd)
                os.close(status_fd)
            return request, fds
        policy.note("forked")
        for received in fds[:3]:
            os.close(received)
        running[os.pidfd_open(pid)] = (pid, fds[3])
        conn.send(json.dumps({"pid": pid}).encode())
    return None


# Settings a fresh worker's libraries take from the environment as they load, which the fork
# applies itself: torch's thread pool, glibc's allocator thresholds (mallopt's parameters).
# ``RAY_worker_niceness`` is read by Ray's core worker as it starts, in the fork too, not at
# import (tests/test_launcher.py checks the fork's priority).
_MALLOPT = {"MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1}
WORKER_APPLIED = ("OMP_NUM_THREADS", "RAY_worker_niceness", *_MALLOPT)


def _apply_worker_settings(env: dict[str, str], client: int, cpus: list[int]) -> None:
    """What a Ray worker started cold in ``env`` on ``cpus`` would have set up at start; and
    the fork ends when ``client`` (the process Ray started, `tests/worker_client.py`) does."""
    import ctypes
    import threading

    os.sched_setaffinity(0, cpus)

    if "OMP_NUM_THREADS" in env and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    libc = ctypes.CDLL(None)
    for name, parameter in _MALLOPT.items():
        if name in env:
            libc.mallopt(parameter, int(env[name]))
    pidfd = os.pidfd_open(client)

    def end_with_client() -> None:
        select.select([pidfd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=end_with_client, name="end-with-ray's-process", daemon=True).start()


def become(request: Request, fds: list[int], base_path: list[str]) -> None:
    """Turn this fork into ``request["argv"]`` as a fresh interpreter would run it."""
    stdin, stdout, stderr, status = fds
    os.close(status)
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
    for fd in {stdin, stdout, stderr} - {0, 1, 2}:
        os.close(fd)
    os.chdir(request["cwd"])
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    argv: list[str] = request["argv"]
    module = argv[2] if argv[1] == "-m" else None
    code = argv[2] if argv[1] == "-c" else None
    # sys.path[0] as the interpreter sets it: the working directory for -m, '' for -c, the
    # script's folder for a script.
    if module is not None:
        first = os.getcwd()
    elif code is not None:
        first = ""
    else:
        first = os.path.dirname(os.path.abspath(argv[1]))
    pythonpath = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [first, *(os.path.abspath(entry) for entry in pythonpath), *base_path]
    for name in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE"):
        number = getattr(signal, name)
        handler = {"SIGINT": signal.default_int_handler, "SIGPIPE": signal.SIG_IGN}.get(name)
        signal.signal(number, handler or signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    _fresh_streams(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
    if request.get("worker"):
        _apply_worker_settings(env, int(request["worker"]), request["cpus"])
    from rlshell.config import TRACE_ENV_VAR, install_read_tracer

    if env.get(TRACE_ENV_VAR):  # what importing rlshell.config does in a new interpreter
        install_read_tracer(env[TRACE_ENV_VAR])
    _fresh_random_state()
    sys.orig_argv = list(argv)
    try:  # what ps and psutil show: the run's command, not the zygote's
        import setproctitle

        setproctitle.setproctitle(" ".join(argv))
    except ImportError:
        pass
    if request["ray"] is not None:
        _attach_where_it_would_start_ray(
            request["ray"], request["ray_cpus"], request["ray_job_config"]
        )
    import runpy

    if module is not None:
        # As in a new interpreter, where `-m` runs the module before anything imports it.
        sys.modules.pop(module, None)
        sys.argv = [module, *argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif code is not None:
        import types

        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        sys.argv = ["-c", *argv[3:]]
        exec(compile(code, "<string>", "exec"), main.__dict__)
    else:
        sys.argv = list(argv[1:])
        runpy.run_path(argv[1], run_name="__main__")


def _exit_status(error: SystemExit) -> int:
    """The status the interpreter exits with for ``error`` (a message is printed, status 1)."""
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish(request: Request, fds: list[int], base_path: list[str]) -> None:
    """Run the request as `become` does, then end as CPython's ``Py_RunMain`` ends a
    program, and leave with ``os._exit`` (module docstring)."""
    interrupted = False
    try:
        become(request, fds, base_path)
        status = 0
    except SystemExit as error:
        status = _exit_status(error)
    except BaseException as error:  # printed as the interpreter prints it
        interrupted = isinstance(error, KeyboardInterrupt)
        sys.excepthook(type(error), error, error.__traceback__)
        status = 1
    # Py_FinalizeEx's order: wait for non-daemon threads, the atexit handlers, the streams.
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException as error:
        sys.excepthook(type(error), error, error.__traceback__)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            status = 120  # what the interpreter exits with when it cannot flush stdout
    if interrupted:  # an uncaught KeyboardInterrupt: the process dies of SIGINT, as CPython's
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _attach_where_it_would_start_ray(address: str, cpus: int, job_config: str | None) -> None:
    """Where the run would start a local Ray of its own (`Cluster`, at the point it does),
    it joins the pytest process's cluster instead: a cluster of the same machine and
    CPUs, already up, with ``job_config`` (its workers forked from the workers' zygote,
    `tests/worker_client.py`; None: started cold). Ray is not touched before: a run refused
    by validation never meets it. A run that asks for another CPU count or temp dir starts
    its own, as it would."""
    import ray

    import rlshell.cluster.ray_cluster as ray_cluster

    start_own = ray_cluster._start_embedded_ray

    def attach(num_cpus: int | None, namespace: str, temp_dir: str | None) -> None:
        if (num_cpus or os.cpu_count()) != cpus or temp_dir is not None:
            start_own(num_cpus, namespace, temp_dir)
            return
        if job_config is not None:
            os.environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = job_config
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=True)
        finally:
            os.environ.pop("RAY_JOB_CONFIG_JSON_ENV_VAR", None)

    ray_cluster._start_embedded_ray = attach


def _fresh_streams(unbuffered: bool) -> None:
    """stdin, stdout and stderr on fds 0-2 as Python sets them up for pipes (-u: unbuffered)."""

    def writer(fd: int, line_buffering: bool, errors: str) -> io.TextIOWrapper:
        raw = io.FileIO(fd, "w", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            binary,  # type: ignore[arg-type]
            encoding="utf-8",
            errors=errors,
            line_buffering=line_buffering,
            write_through=unbuffered,
        )

    sys.stdout = sys.__stdout__ = writer(1, False, "strict")
    sys.stderr = sys.__stderr__ = writer(2, True, "backslashreplace")
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8"
    )


def _fresh_random_state() -> None:
    """The seeds a new interpreter would draw (forks would otherwise share the zygote's)."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    started = time.process_time()
    own_path = {os.path.dirname(os.path.abspath(__file__))}
    own_path |= {
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    }
    base_path = [entry for entry in sys.path if os.path.abspath(entry or ".") not in own_path]
    rules = os.environ.pop("RLSTACK_ZYGOTE_WORKERS", "")
    before_imports = {k: v for k, v in os.environ.items() if k != "RLSTACK_ZYGOTE_MODULES"}
    preloaded = preload()
    workers, policy = None, None
    if rules:  # a socket on which Ray workers ask to be forked (tests/worker_client.py)
        parsed = json.loads(rules)
        policy = WorkerPolicy(parsed, before_imports)
        workers = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        workers.bind(parsed["socket"])
        workers.listen(64)
    sock.send(
        json.dumps(
            {
                "pid": os.getpid(),
                "preloaded": len(preloaded),
                "cpu_s": time.process_time() - started,
                # What the preloaded modules left in the environment (some set variables).
                "env": dict(os.environ),
                # The top-level packages it imported (`launcher.PACKAGE_OF_PREFIX`'s check).
                "loaded": sorted({name.partition(".")[0] for name in sys.modules}),
            }
        ).encode()
    )
    request, fds = serve(sock, workers, policy)
    finish(request, fds, base_path)


if __name__ == "__main__":
    main()
