"""The tests' runs of the command-line tools, without paying an interpreter's start each time.

Most of the suite's CPU time went to starting processes, not to what they check:
`tests/profile_suite.py` found two thirds of it in imports (every ``python -m
rlshell.train`` imports torch, transformers, Ray and the runners, ~6 CPU-s) and in
starting a Ray cluster for each run (~9 CPU-s of daemons). Here a run is:

- **forked from a warm interpreter** (the zygote, one per pytest process, started on
  first use) that has imported the drivers' modules once; the fork then runs the
  module as ``python -m`` would (``runpy``, as ``__main__``, its own ``sys.argv``,
  environment, working directory, stdin/stdout/stderr, signals, exit status). It is a
  real process: tests signal it, kill it and read its exit status as before.
- **attached to this pytest process's Ray cluster** (`shared_cluster`, the one the
  ``ray_cluster`` fixture gives) instead of starting its own: where the run's
  `rlshell.cluster.ray_cluster.Cluster` would start a local Ray, it joins that one
  (``ray.init(address=...)``), and leaves it up when it shuts down.

Each is used only where it cannot change what the run does; otherwise the run is
started the ordinary way, and nothing else differs:

- a module imported in the zygote may have read its environment at import (Hugging
  Face's cache paths, Ray's settings, thread counts): a run whose environment differs
  from the zygote's in any such variable (`IMPORT_TIME_PREFIXES`) is started cold;
- workers on the shared cluster are started by its raylet, with this process's
  environment plus what `Cluster.worker_env` forwards: a run whose environment differs
  in anything else (a fault-injection variable its workers read) starts its own Ray;
- a test that checks Ray's own start or shutdown, or the processes a run leaves,
  asks for its own Ray (``shared_ray=False``).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]

# Variables some module the zygote imports reads when it is imported (not when called).
IMPORT_TIME_PREFIXES = (
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS",
    "TOKENIZERS",
    "TORCH",
    "PYTORCH",
    "OMP_",
    "MKL",
    "KMP_",
    "RAY_",
    "PYTHON",
    "CUDA",
    "VLLM",
    "JAX",
    "XLA",
    "MPL",
    "WANDB",
    "MUJOCO",
    "LD_",
    "MALLOC",
    "RLCORE_",
    "TQDM",
    "TMP",
    "TEMP",
    "XDG_",
    "LANG",
    "LC_",
    "RLSHELL_TRACE_CONFIG_READS",
)
# The packages that read the variables of a prefix at import and that the zygote may not
# have imported (`tests/zygote_modules.txt` leaves them to the runs that use them): where
# the zygote has not, a fork imports the package itself and reads the run's own values.
PACKAGE_OF_PREFIX = {
    "WANDB": "wandb",
    "VLLM": "vllm",
    "MUJOCO": "mujoco",
    "JAX": "jax",
    "XLA": "jax",
}
# ... except these, which are read when used (or applied to the fork here). The last three
# are what ``ray.init`` sets in the environment of the process that calls it (this one,
# once the shared cluster is up), which runs then inherit.
READ_WHEN_USED = frozenset(
    {
        # torch sets it in os.environ (to its default) the first time it compiles here.
        "TORCHINDUCTOR_CACHE_DIR",
        "RAY_TMPDIR",
        "PYTHONPATH",
        "PYTHONUNBUFFERED",
        "PYTHONBREAKPOINT",
        "RAY_CLIENT_MODE",
        "RAY_USAGE_STATS_ENABLED",
        # Read by `ray.init` (the job config a driver's workers start under), not at import.
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        # Read by the tokenizers library when it first encodes in parallel, not at import.
        "TOKENIZERS_PARALLELISM",
    }
)
# Set in a worker's environment, read when used, not at import: what the raylet sets
# (ray._private: process_watcher, ray_logging, services; the job config a nested driver
# would read), and the devices the plan gives the worker (torch, jax and vllm read
# CUDA_VISIBLE_DEVICES when they first touch a device).
WORKER_READ_WHEN_USED = frozenset(
    {
        "RAY_JOB_ID",
        "RAY_RAYLET_PID",
        "RAY_LD_PRELOAD_ON_WORKERS",
        "RAY_JOB_CONFIG_JSON_ENV_VAR",
        "CUDA_VISIBLE_DEVICES",
        # An embedded cluster's loopback switch (rlshell.cluster.ray_cluster._loopback_only),
        # which the raylet hands its workers: ray reads it when the fork imports ray (the
        # zygote withholds ray).
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    }
)
# Ray's own way to give a driver a job config (`ray.init` reads it): how runs on the shared
# cluster get their workers forked (`Zygote.job_config`).
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# Where the session leaves it unset, the zygote runs with string hashing seeded at 0, and a
# fork keeps its parent's seed: a run that asks for seed 0, or leaves it unset (a seed drawn
# at random, of which 0 is one), is forked; any other value starts it cold.
HASH_SEED = "PYTHONHASHSEED"
HASH_SEEDS_FORKED = (None, "0")
# What no worker reads: a run that differs from the shared cluster only in these (and in
# what `Cluster.worker_env` forwards) runs there as it would on its own cluster.
NOT_FOR_WORKERS = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        # A worker's interpreter is started by the cluster's raylet and draws its own seed.
        HASH_SEED,
        "TORCHINDUCTOR_CACHE_DIR",
        "RAY_TMPDIR",
        "PYTHONUNBUFFERED",
        "PYTHONBREAKPOINT",
        "RAY_CLIENT_MODE",
        "RAY_USAGE_STATS_ENABLED",
        # Set to "hide" by importing gymnasium, which every worker that could read it does
        # first (a test whose fixture imports gymnasium here would otherwise count it as its).
        "PYGAME_HIDE_SUPPORT_PROMPT",
    }
)
# Read by the driver alone: W&B's variables by the metrics logger (`rlshell.metrics`), which
# no worker builds.
DRIVER_ONLY_PREFIXES = ("WANDB_",)
# The modules the drivers of short runs imported (`record_modules` writes the list): the
# zygote imports them once. Many are imported lazily, inside the functions that use them
# (transformers' model classes, matplotlib, tensorboard), so naming the entry points would
# leave most of the work to every run. A stale list costs time, never correctness: what
# it lacks a run imports itself, and what no longer exists is skipped.
MODULES_FILE = Path(__file__).with_name("zygote_modules.txt")
# Short runs whose drivers' imports make the list: every runner, evaluation and export.
RECORDED_RUNS = (
    [
        "configs/grpo.py",
        "runner.max_steps=1",
        "runner.prompts_per_step=2",
        "algorithm.group_size=2",
        "data.num_val=2",
        "checkpoint.interval=1",
    ],
    ["configs/ppo_cartpole.py", "runner.max_steps=1", "runner.rollout_steps=8"],
    [
        "configs/sac_pendulum.py",
        "runner.max_steps=1",
        "runner.rollout_steps=8",
        "algorithm.sac.batch_size=8",
        "algorithm.sac.learning_starts=8",
    ],
    ["configs/sft_arithmetic.py", "runner.max_steps=1", "runner.prompts_per_step=2"],
)


def _worker_forwarded() -> frozenset[str]:
    from rlshell.cluster.ray_cluster import HUB_ENV_VARS
    from rlshell.config import TRACE_ENV_VAR
    from rlshell.extensions import ENV_VAR, OBJECTS_ENV_VAR

    return frozenset({ENV_VAR, OBJECTS_ENV_VAR, "PYTHONPATH", TRACE_ENV_VAR, *HUB_ENV_VARS})


# The environment the current test started in (`note_test_start`, an autouse fixture).
_TEST_START_ENV: dict[str, str] = {}


def note_test_start() -> None:
    _TEST_START_ENV.clear()
    _TEST_START_ENV.update(os.environ)


def left_over(env: Mapping[str, str]) -> frozenset[str]:
    """The variables ``env`` has from this process's environment as earlier tests and
    imports left it, not from the test that starts the run: a library writes to
    os.environ when imported or used here (importing vllm sets
    PYTORCH_NVML_BASED_CUDA_CHECK, its CPU engine LD_PRELOAD, sapien its Vulkan paths,
    wandb WANDB_SERVICE), and a test's run inherits them with the rest. A value the current
    test set (``monkeypatch.setenv``, the env it passes) is the test's, and counts."""
    return frozenset(
        name
        for name in set(_TEST_START_ENV) | set(SESSION_ENV)
        if _TEST_START_ENV.get(name) != SESSION_ENV.get(name)
        and env.get(name) == _TEST_START_ENV.get(name) == os.environ.get(name)
    )


def as_the_session_had_it(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each `left_over` variable back to the session's value (or unset): a run
    started from a shell would not have what this process's imports and earlier tests wrote
    to os.environ, and its Ray workers, which compare their environment with the workers'
    zygote's, would otherwise start cold for it (vllm's import-time variables made every
    worker of a run on a Ray of its own start cold after any vLLM test in that process)."""
    stale = left_over(env)
    kept = {name: value for name, value in env.items() if name not in stale}
    kept.update({name: SESSION_ENV[name] for name in stale if name in SESSION_ENV})
    return kept


def not_imported(loaded: Collection[str] | None) -> tuple[str, ...]:
    """The prefixes of `PACKAGE_OF_PREFIX` whose package is not among ``loaded`` (a zygote's
    imported top-level packages; None: unknown, so none)."""
    if loaded is None:
        return ()
    return tuple(prefix for prefix, package in PACKAGE_OF_PREFIX.items() if package not in loaded)


def warm_fork_keeps(
    env: Mapping[str, str],
    zygote_env: Mapping[str, str],
    zygote_env_after: Mapping[str, str] | None = None,
    zygote_loaded: Collection[str] | None = None,
) -> list[str]:
    """The variables that stop a run in ``env`` from being forked from a zygote started in
    ``zygote_env`` whose imports left ``zygote_env_after`` (empty: it can be). A value the
    imports set themselves (a library's ``os.environ.setdefault`` at import, which the
    pytest process's own imports leave in the runs' environment too) is the value those
    imports would meet and keep in a fresh interpreter. A variable read at import by a
    package the zygote has not imported (``zygote_loaded``: its top-level packages) is read
    by the fork's own import of it."""
    from rlshell.config import TRACE_ENV_VAR

    after = zygote_env if zygote_env_after is None else zygote_env_after
    names = set(env) | set(zygote_env)
    ignored = left_over(env)
    imported_by_the_fork = not_imported(zygote_loaded)
    return sorted(
        name
        for name in names
        if name.startswith(IMPORT_TIME_PREFIXES)
        and not (imported_by_the_fork and name.startswith(imported_by_the_fork))
        and name not in ignored
        and name not in READ_WHEN_USED
        and env.get(name) != zygote_env.get(name)
        and not (name in after and env.get(name) == after[name])
        # rlshell.config installs the tracer when imported; the fork does it (tests/zygote.py).
        and not (name == TRACE_ENV_VAR and name not in zygote_env)
        and not (
            name == HASH_SEED and name not in zygote_env and env.get(name) in HASH_SEEDS_FORKED
        )
    )


def shared_ray_hides(env: Mapping[str, str], cluster_env: Mapping[str, str]) -> list[str]:
    """The variables that a run in ``env`` would hide from its workers on a cluster started
    in ``cluster_env`` (empty: it can run there)."""
    forwarded = _worker_forwarded()
    ignored = left_over(env)
    return sorted(
        name
        for name in set(env) | set(cluster_env)
        if name not in ignored
        and env.get(name) != cluster_env.get(name)
        and name not in NOT_FOR_WORKERS
        and not name.startswith(DRIVER_ONLY_PREFIXES)
        and not (name in forwarded and name in env)
    )


# ------------------------------------------------------------------------ the shared cluster

# The environment the session started in (tests/conftest.py imports this module once it has
# set its defaults). The zygote and the shared cluster start in it, whatever a test that
# happens to start them first has set in os.environ since.
SESSION_ENV = dict(os.environ)

# Workers ask for fractional CPU bundles (0.25 by default), so tests never wait on each other.
SHARED_CPUS = 2


@dataclasses.dataclass(frozen=True)
class SharedCluster:
    """The pytest process's Ray cluster and what a run must share with it to join it."""

    cluster: Any  # rlshell.cluster.ray_cluster.Cluster
    address: str
    # The environment it started in (ray.init adds a few variables): its workers' environment.
    env: dict[str, str]
    # Its workers' working directory, from which they resolve a run's relative paths
    # (runner.output_dir='runs').
    cwd: Path
    temp_dir: str


_SHARED: SharedCluster | None = None


@contextlib.contextmanager
def _session_environment() -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(SESSION_ENV)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _shared() -> SharedCluster:
    global _SHARED
    if _SHARED is None or _SHARED.cluster.closed:
        import tempfile

        import ray

        from rlshell.cluster.ray_cluster import Cluster

        temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # socket paths stay short
        job_config = worker_job_config()  # this process's workers are forked too
        with _session_environment():
            if job_config is not None:
                os.environ[RAY_JOB_CONFIG] = job_config
            cluster = Cluster(num_cpus=SHARED_CPUS, temp_dir=temp_dir)
            os.environ.pop(RAY_JOB_CONFIG, None)
            env = dict(os.environ)
        address = str(ray.get_runtime_context().gcs_address)
        _SHARED = SharedCluster(cluster, address, env, Path.cwd().resolve(), temp_dir)
    return _SHARED


def shared_cluster() -> Any:
    """This pytest process's Ray cluster (an embedded 2-CPU one), started on first use and
    shut down at the end of the session (`shutdown`). Tests launch worker groups on it
    directly (the ``ray_cluster`` fixture) and runs attach to it. Nothing is left on it
    between tests: a run's job ends with its driver, and Ray then removes its actors and
    placement groups."""
    return _shared().cluster


def shutdown() -> None:
    """Stop the zygote and the shared cluster, if they were started (the session's end)."""
    global _SHARED, _ZYGOTE, _WORKER_ZYGOTE
    for warm in (_ZYGOTE, _WORKER_ZYGOTE):
        if warm is not None:
            warm.close()
    _ZYGOTE = _WORKER_ZYGOTE = None
    if _SHARED is not None:
        import shutil

        _SHARED.cluster.shutdown()
        shutil.rmtree(_SHARED.temp_dir, ignore_errors=True)
        _SHARED = None


atexit.register(shutdown)


# ------------------------------------------------------------------------------ the zygote

_ZYGOTE: Zygote | None = None
_WORKER_ZYGOTE: Zygote | None = None
# What the Ray workers' zygote does not preload (tests/zygote.py `preload`): ray reads its
# C++ settings, the worker's job id among them, once, from the environment it is loaded in;
# rlshell's modules import ray.
WITHHELD_FROM_WORKERS = "ray,rlshell"
# Set to 1, the shared cluster's workers start as Ray starts them (to tell whether a failure
# has to do with forking them).
COLD_WORKERS = "RLSTACK_TEST_COLD_WORKERS"


class Zygote:
    """A warm interpreter that forks a process for each run (`tests/zygote.py`); with
    ``workers``, one that forks the Ray workers of the runs on the shared cluster, on their
    request (`tests/worker_client.py`)."""

    def __init__(self, workers: bool = False) -> None:
        import tempfile

        from rlshell.config import TRACE_ENV_VAR
        from tests.zygote import WORKER_APPLIED

        self.env = dict(SESSION_ENV)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.socket = ours
        # Where Ray workers ask to be forked, and the zygote notes how each started.
        self.folder = tempfile.mkdtemp(prefix="rz", dir="/tmp")  # socket paths stay short
        self.worker_socket = os.path.join(self.folder, "workers")
        self.worker_log = os.path.join(self.folder, "starts")
        env = {HASH_SEED: "0", **self.env, "RLSTACK_ZYGOTE_MODULES": str(MODULES_FILE)}
        if workers:
            rules = {
                "socket": self.worker_socket,
                "log": self.worker_log,
                "prefixes": IMPORT_TIME_PREFIXES,
                "packages": PACKAGE_OF_PREFIX,
                # ... and the config-read tracer's directory: the fork imports rlshell.config
                # (withheld from this zygote), which installs the tracer the variable names.
                "exempt": sorted(
                    READ_WHEN_USED | WORKER_READ_WHEN_USED | {*WORKER_APPLIED, TRACE_ENV_VAR}
                ),
            }
            env.update(
                RLSTACK_ZYGOTE_WORKERS=json.dumps(rules),
                RLSTACK_ZYGOTE_WITHOUT=WITHHELD_FROM_WORKERS,
            )
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("zygote.py")), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            cwd=ROOT,
            env=env,
        )
        theirs.close()
        reply = self.socket.recv(1 << 20)
        if not reply:
            raise RuntimeError(f"the zygote exited before it was ready ({self.process.wait()})")
        self.ready = json.loads(reply)
        # The zygote's environment once its modules are imported: some set variables there.
        self.env_after: dict[str, str] = self.ready.pop("env")
        # Its imported top-level packages among those that read variables at import.
        self.loaded: list[str] = self.ready.pop("loaded")

    def job_config(self) -> str:
        """The Ray job config (`RAY_JOB_CONFIG_JSON_ENV_VAR`) under which a driver's workers are
        forked from this (workers') zygote: Ray starts each with `tests/worker_client.py` as
        its Python (``runtime_env["py_executable"]``, which the actors' own ``env_vars``
        leave as it is)."""
        client = f"{sys.executable} -I {Path(__file__).with_name('worker_client.py')}"
        return json.dumps({"runtime_env": {"py_executable": f"{client} {self.worker_socket}"}})

    def worker_starts(self) -> collections.Counter[str]:
        """How the Ray workers that asked this zygote started (forked, or cold and why)."""
        try:
            with open(self.worker_log) as log:
                return collections.Counter(f"Ray worker {line.strip()}" for line in log)
        except FileNotFoundError:
            return collections.Counter()

    def fork(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        ray_address: str | None,
        fds: Sequence[int],
    ) -> int:
        request = {
            "argv": list(argv),
            "env": dict(env),
            "cwd": str(cwd),
            "ray": ray_address,
            "ray_cpus": SHARED_CPUS,
            "ray_job_config": worker_job_config() if ray_address else None,
        }
        socket.send_fds(self.socket, [json.dumps(request).encode()], list(fds))
        reply = json.loads(self.socket.recv(4096))
        if "error" in reply:
            raise RuntimeError(f"the zygote could not fork: {reply['error']}")
        return int(reply["pid"])

    def close(self) -> None:
        self.socket.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        import shutil

        PAST_WORKER_STARTS.update(self.worker_starts())
        shutil.rmtree(self.folder, ignore_errors=True)


def zygote() -> Zygote:
    """The runs' zygote, started on first use."""
    global _ZYGOTE
    if _ZYGOTE is None or _ZYGOTE.process.poll() is not None:
        _ZYGOTE = Zygote()
    return _ZYGOTE


def worker_job_config() -> str | None:
    """The job config that has a driver's workers on the shared cluster forked
    (`Zygote.job_config`); None where ``RLSTACK_TEST_COLD_WORKERS=1`` asks for them cold."""
    if os.environ.get(COLD_WORKERS) == "1":
        return None
    return worker_zygote().job_config()


def worker_zygote() -> Zygote:
    """The Ray workers' zygote, started on first use (a dead one is replaced: the workers that
    asked the old one's socket start cold)."""
    global _WORKER_ZYGOTE
    if _WORKER_ZYGOTE is None or _WORKER_ZYGOTE.process.poll() is not None:
        _WORKER_ZYGOTE = Zygote(workers=True)
    return _WORKER_ZYGOTE


# ---------------------------------------------------------------------------- the processes


class WarmProcess:
    """A forked run, used like a `subprocess.Popen` (``stdout``/``stderr`` pipes to read, or
    files it writes to)."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        ray_address: str | None,
        stdout: int | IO[Any],
        stderr: int | IO[Any],
        stdin: int | None = None,
    ) -> None:
        self.args = list(argv)
        self.returncode: int | None = None
        to_close: list[int] = []

        def target(where: int | IO[Any]) -> tuple[int | None, int]:
            """(our end to read, or None; the fork's fd)."""
            if where == subprocess.PIPE:
                read, write = os.pipe()
                to_close.append(write)
                return read, write
            assert not isinstance(where, int), where
            return None, where.fileno()

        out_r, out_w = target(stdout)
        if stderr == subprocess.STDOUT:
            err_r, err_w = None, out_w
        else:
            err_r, err_w = target(stderr)
        status_r, status_w = os.pipe()
        if stdin == subprocess.PIPE:
            in_r, in_w = os.pipe()
            self.stdin: IO[bytes] | None = os.fdopen(in_w, "wb")
        else:
            assert stdin is None, stdin
            in_r, self.stdin = os.open(os.devnull, os.O_RDONLY), None
        to_close += [status_w, in_r]
        try:
            self.pid = zygote().fork(argv, env, cwd, ray_address, [in_r, out_w, err_w, status_w])
        finally:
            for fd in to_close:
                os.close(fd)
        # Our ends, closed by `communicate` (the pipes) and `_read_status` (the status).
        self.stdout = os.fdopen(out_r, "rb") if out_r is not None else None
        self.stderr = os.fdopen(err_r, "rb") if err_r is not None else None
        self._status = os.fdopen(status_r, "rb")

    def poll(self) -> int | None:
        if self.returncode is None:
            ready = selectors.DefaultSelector()
            ready.register(self._status, selectors.EVENT_READ)
            if ready.select(timeout=0):
                self._read_status()
            ready.close()
        return self.returncode

    def _read_status(self) -> None:
        text = self._status.read().decode().strip()
        self._status.close()
        # Empty only if the zygote itself died before it reaped the run.
        self.returncode = int(text) if text else -int(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            ready = selectors.DefaultSelector()
            ready.register(self._status, selectors.EVENT_READ)
            found = ready.select(timeout=timeout)
            ready.close()
            if not found:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(
        self, input: bytes | None = None, timeout: float | None = None
    ) -> tuple[bytes | None, bytes | None]:
        """``input`` written to the run's stdin (then closed), and everything it writes to
        its pipes until it exits (``timeout``: kill it after so long and raise
        `subprocess.TimeoutExpired`, as `subprocess.run` does)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        streams = [stream for stream in (self.stdout, self.stderr) if stream is not None]
        chunks: dict[Any, list[bytes]] = {stream: [] for stream in streams}
        selector = selectors.DefaultSelector()
        for stream in streams:
            selector.register(stream, selectors.EVENT_READ)
        open_streams = len(streams)
        pending = memoryview(input or b"")
        if self.stdin is not None:
            if pending:
                selector.register(self.stdin, selectors.EVENT_WRITE)
                open_streams += 1
            else:
                self.stdin.close()
        try:
            while open_streams:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.kill()
                    self.wait()
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                for key, _ in selector.select(timeout=left):
                    if key.fileobj is self.stdin:
                        try:
                            written = os.write(self.stdin.fileno(), pending[:65536])
                        except BrokenPipeError:  # the run exited without reading it all
                            written = len(pending)
                        pending = pending[written:]
                        if not pending:
                            selector.unregister(self.stdin)
                            self.stdin.close()
                            open_streams -= 1
                        continue
                    data = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                    if data:
                        chunks[key.fileobj].append(data)
                    else:
                        selector.unregister(key.fileobj)
                        open_streams -= 1
        finally:
            selector.close()
            if self.stdin is not None and not self.stdin.closed:
                self.stdin.close()
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        for stream in streams:
            stream.close()
        out = b"".join(chunks[self.stdout]) if self.stdout is not None else None
        err = b"".join(chunks[self.stderr]) if self.stderr is not None else None
        return out, err


# How the runs of this process were started, and why (printed at the end of the session).
STATS: collections.Counter[str] = collections.Counter()
# How the Ray workers of closed zygotes started (`Zygote.worker_starts`).
PAST_WORKER_STARTS: collections.Counter[str] = collections.Counter()


def launches() -> collections.Counter[str]:
    """How this process's runs started (`STATS`), and the Ray workers forked for them."""
    counts = STATS + PAST_WORKER_STARTS
    if _WORKER_ZYGOTE is not None:
        counts.update(_WORKER_ZYGOTE.worker_starts())
    return counts


def _cold(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    stdout: int | IO[Any],
    stderr: int | IO[Any],
    stdin: int | None,
    why: str,
) -> subprocess.Popen[bytes]:
    STATS[f"cold ({why})"] += 1
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
    )


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path = ROOT,
    shared_ray: bool = True,
    stdout: int | IO[Any] = subprocess.PIPE,
    stderr: int | IO[Any] = subprocess.PIPE,
    stdin: int | None = None,
) -> WarmProcess | subprocess.Popen[bytes]:
    """``argv`` (``[sys.executable, "-m", MODULE, ...]``, ``[sys.executable, "-c", CODE, ...]``
    or ``[sys.executable, SCRIPT, ...]``) forked from the zygote, and on the shared cluster
    where it would start a Ray of its own, wherever that cannot change the run (module
    docstring); else an ordinary subprocess. ``stdout``/``stderr``: `subprocess.PIPE`, an
    open file, or (stderr) `subprocess.STDOUT`; ``stdin``: `subprocess.PIPE`, or None (the
    null device). Variables that earlier tests or this process's imports left in ``env``
    get the session's values back (`as_the_session_had_it`)."""
    env = as_the_session_had_it(env)
    if argv[0] != sys.executable or not hasattr(os, "pidfd_open"):
        why = "not this interpreter, or no pidfd_open"
        return _cold(argv, env, cwd, stdout, stderr, stdin, why)
    warm = zygote()
    keeps = warm_fork_keeps(env, warm.env, warm.env_after, warm.loaded)
    if keeps:
        return _cold(argv, env, cwd, stdout, stderr, stdin, f"read at import: {', '.join(keeps)}")
    address = None
    if shared_ray:
        shared = _shared()
        hidden = shared_ray_hides(env, shared.env)
        if hidden:
            STATS[f"forked, own Ray (its workers read {', '.join(hidden)})"] += 1
        elif Path(cwd).resolve() != shared.cwd:
            STATS["forked, own Ray (its workers would run in another directory)"] += 1
        else:
            address = shared.address
            STATS["forked, on the shared Ray"] += 1
    else:
        STATS["forked, own Ray (asked)"] += 1
    return WarmProcess(argv, env, cwd, address, stdout, stderr, stdin)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path = ROOT,
    timeout: float | None = None,
    shared_ray: bool = True,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`popen`, waited for: ``subprocess.run(argv, capture_output=True, text=True, ...)``
    (``input``: written to its stdin)."""
    stdin = None if input is None else subprocess.PIPE
    process = popen(argv, env=env, cwd=cwd, shared_ray=shared_ray, stdin=stdin)
    try:
        data = None if input is None else input.encode()
        out, err = process.communicate(input=data, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(
        list(argv), process.wait(), out.decode(), (err or b"").decode()
    )


# ------------------------------------------------------------------- the zygote's module list

_RECORDER = """
import atexit, os, sys

def _record():
    if sys.argv and sys.argv[0].endswith(("rlshell/train.py", "rlshell/evaluate.py")):
        folder = os.environ["RLSTACK_RECORD_MODULES"]
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as out:
            for name, module in list(sys.modules.items()):
                out.write(f"{name}\\t{getattr(module, '__file__', None) or ''}\\n")

atexit.register(_record)
"""


def record_modules() -> list[str]:
    """Run `RECORDED_RUNS` (and an evaluation) cold, each driver writing the modules it
    imported; keep those of the installed packages and of rlcore/rlshell (never a test's or
    an extension's: the zygote must not register anything) and write `MODULES_FILE`."""
    import shutil
    import site
    import sysconfig
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="modules-"))
    (folder / "sitecustomize.py").write_text(_RECORDER)
    out = folder / "runs"
    env = {
        **os.environ,
        "PYTHONPATH": str(folder),
        "RLSTACK_RECORD_MODULES": str(folder),
        "RAY_TMPDIR": tempfile.mkdtemp(prefix="rm", dir="/tmp"),
    }
    commands = [
        [sys.executable, "-m", "rlshell.train", *run, f"runner.output_dir={out}"]
        for run in RECORDED_RUNS
    ]
    commands.append(
        [
            sys.executable,
            "-m",
            "rlshell.evaluate",
            str(out / "grpo" / "checkpoints" / "global_step_1"),
        ]
    )
    for command in commands:
        subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True, timeout=600)
    places = {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
        *site.getsitepackages(),
        str(ROOT / "src"),
    }
    names = set()
    for record in folder.glob("*.txt"):
        for line in record.read_text().splitlines():
            name, _, path = line.partition("\t")
            if name in ("__main__", "sitecustomize") or name.startswith("rlshell.train"):
                continue
            if not path or any(path.startswith(place) for place in places):
                names.add(name)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    ordered = sorted(names)
    MODULES_FILE.write_text(
        "# The modules the drivers of short runs imported: tests/zygote.py imports them once.\n"
        "# Made by `.venv/bin/python tests/launcher.py --record-modules`.\n"
        + "\n".join(ordered)
        + "\n"
    )
    return ordered


if __name__ == "__main__":
    if sys.argv[1:] != ["--record-modules"]:
        raise SystemExit("usage: python tests/launcher.py --record-modules")
    print(f"{len(record_modules())} modules written to {MODULES_FILE}")
