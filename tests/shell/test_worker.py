"""Worker groups on a real local Ray cluster: calls, views, failures, gloo, extensions.

The worker classes live at module level so Ray workers can import them by name
(Ray puts the driver's working directory on their path).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util import placement_group_table

from rlshell.cluster.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.cluster.placement import ComponentPlan, WorkerPlacement
from rlshell.cluster.ray_cluster import Cluster
from rlshell.cluster.worker import Worker
from rlshell.extensions import ExtensionError

PlanFactory = Callable[..., ComponentPlan]


class CodedError(Exception):
    """An exception with a constructor of its own and an extra attribute."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code


class SealedError(Exception):
    """An exception type that refuses subclasses, as final types do."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError(f"{cls.__name__}: SealedError is final")


class EchoWorker(Worker):
    """A worker with a little of everything for the tests to call."""

    def __init__(self, offset: int, *, label: str = "") -> None:
        self.offset = offset
        self.label = label

    def whoami(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "placement": self.placement,
            "node_ip": self.node_ip,
            "label": self.label,
        }

    def add(self, value: int, *, times: int = 1) -> int:
        return (self.offset + value) * times + self.rank * 0

    def rank_plus(self, value: int) -> int:
        return self.rank + value

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    def fail(self, message: str) -> None:
        raise ValueError(f"{message} on rank {self.rank}")

    def fail_on(self, rank: int, slow_seconds: float) -> int:
        if self.rank == rank:
            raise RuntimeError(f"rank {rank} gives up")
        time.sleep(slow_seconds)
        return self.rank

    def die_or_fail(self, dying_rank: int) -> None:
        """``dying_rank``'s process ends; the others then fail as a collective with it would."""
        if self.rank == dying_rank:
            os._exit(1)
        time.sleep(0.05)
        raise ConnectionError(f"rank {dying_rank} closed the connection")

    def fail_coded(self) -> None:
        raise CodedError(42, "no answer")

    def fail_sealed(self) -> None:
        raise SealedError("sealed shut")

    def fail_os(self) -> None:
        raise FileNotFoundError(2, "no such file", "/data/shard-0")

    def fail_many(self) -> None:
        raise ExceptionGroup("two problems", [ValueError("a"), KeyError("b")])

    def _secret(self) -> str:
        return "hidden"


class FragileWorker(Worker):
    """A constructor that fails on rank 1."""

    def __init__(self) -> None:
        if self.rank == 1:
            raise KeyError("checkpoint_dir")

    def ping(self) -> str:
        return "pong"


class GlooWorker(Worker):
    """Forms a gloo process group and all-reduces ranks."""

    def all_reduce_rank(self) -> float:
        # torch is imported here, not at module level, so that the other test
        # workers start without paying for it.
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(tensor)
        return float(tensor.item())

    def torch_threads(self) -> int:
        import torch

        return torch.get_num_threads()


class ExtensionProbe(Worker):
    """Reports what an extension module's register() recorded in this process."""

    def registered(self, module: str) -> list[str]:
        return list(sys.modules[module].REGISTERED) if module in sys.modules else []


@pytest.fixture(scope="module")
def echo(ray_cluster: Cluster, plan_component: PlanFactory) -> Iterator[WorkerGroup[EchoWorker]]:
    """A 2-rank group shared by the tests that leave it healthy; two calls may run at once."""
    group = EchoWorker.create_group(10, label="shared").launch(
        ray_cluster, plan_component("echo"), max_concurrency=2
    )
    yield group
    group.shutdown()


# ------------------------------------------------------------- calling


def test_group_call_returns_results_in_rank_order(echo: WorkerGroup[EchoWorker]) -> None:
    assert len(echo) == echo.world_size == 2
    assert echo.rank_plus(100).wait() == [100, 101]
    assert echo.add(5, times=2).wait() == [30, 30]
    infos = echo.whoami().wait()
    assert [info["rank"] for info in infos] == [0, 1]
    for rank, info in enumerate(infos):
        assert info["component"] == echo.name
        assert (info["world_size"], info["local_rank"]) == (2, rank)
        assert isinstance(info["placement"], WorkerPlacement)
        assert info["placement"] == echo.placement.workers[rank]  # type: ignore[union-attr]
        assert info["node_ip"] == echo.workers[rank].node_ip
        assert info["label"] == "shared"


def test_execute_on_limits_the_next_call_to_those_ranks(echo: WorkerGroup[EchoWorker]) -> None:
    assert echo.execute_on(1).rank_plus(0).wait() == [1]
    assert echo.execute_on(1, 0).rank_plus(10).wait() == [11, 10]
    assert echo.rank_plus(0).wait() == [0, 1]  # the view did not stick
    with pytest.raises(ValueError, match=r"ranks \[2\] are outside component"):
        echo.execute_on(2)
    with pytest.raises(ValueError, match="repeat a rank"):
        echo.execute_on(0, 0)


def test_scatter_sends_one_item_per_rank(echo: WorkerGroup[EchoWorker]) -> None:
    assert echo.scatter.add([1, 2], times=[1, 10]).wait() == [11, 120]
    assert echo.execute_on(1).scatter.rank_plus([5]).wait() == [6]
    with pytest.raises(ValueError, match=r"argument 0 must hold one item per rank .* got 3"):
        echo.scatter.add([1, 2, 3])


def test_call_by_name_and_done(echo: WorkerGroup[EchoWorker]) -> None:
    call = echo.call("sleep", 0.5)
    assert isinstance(call, GroupCall)
    assert not call.done()
    assert call.wait() == [0, 1]
    assert call.done()
    assert call.wait() == [0, 1]  # results stay


def test_unknown_and_private_methods_are_attribute_errors(
    echo: WorkerGroup[EchoWorker],
) -> None:
    with pytest.raises(AttributeError, match=r"EchoWorker has no public method 'ad' \(did you"):
        echo.ad(1)
    with pytest.raises(AttributeError, match="did you mean 'whoami'"):
        echo.execute_on(0).whoamy()
    with pytest.raises(AttributeError, match="'_secret' is private"):
        echo._secret()
    with pytest.raises(AttributeError, match="no public method 'create_group'"):
        echo.call("create_group")
    assert not hasattr(echo, "no_such_method")


# ------------------------------------------------------------- failures


def test_a_raising_method_is_its_own_type_and_a_worker_error(
    echo: WorkerGroup[EchoWorker],
) -> None:
    call = echo.execute_on(1).fail("bad batch")
    with pytest.raises(ValueError, match="bad batch on rank 1") as info:
        call.wait()
    error = info.value
    assert isinstance(error, WorkerError)
    worker = echo.workers[1]
    message = str(error)
    assert f"component '{echo.name}' rank 1 (node {worker.node_ip}, pid {worker.pid})" in message
    assert "raised in fail(): ValueError: bad batch on rank 1" in message
    assert 'test_worker.py", line' in message  # the worker's own frame
    assert "in fail" in error.remote_traceback
    assert "ray::" not in error.remote_traceback
    assert (error.component, error.rank, error.method, error.pid) == (
        echo.name,
        1,
        "fail",
        worker.pid,
    )
    assert isinstance(error.cause, ValueError)
    with pytest.raises(ValueError, match="bad batch") as again:  # the same error again
        call.wait()
    assert again.value is error
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, ValueError)
    assert isinstance(copy, WorkerError)
    assert str(copy) == message


def test_exception_fields_read_through_and_final_types_fall_back(
    echo: WorkerGroup[EchoWorker],
) -> None:
    with pytest.raises(CodedError) as coded:
        echo.execute_on(0).fail_coded().wait()
    assert isinstance(coded.value, WorkerError)
    assert coded.value.code == 42
    assert coded.value.args == (42, "no answer")

    with pytest.raises(FileNotFoundError) as missing:
        echo.execute_on(0).fail_os().wait()
    assert isinstance(missing.value, WorkerError)
    assert (missing.value.errno, missing.value.filename) == (2, "/data/shard-0")

    with pytest.raises(ExceptionGroup) as several:
        echo.execute_on(0).fail_many().wait()
    assert isinstance(several.value, WorkerError)
    assert [type(e) for e in several.value.exceptions] == [ValueError, KeyError]

    with pytest.raises(WorkerError, match=r"raised in fail_sealed\(\): SealedError") as sealed:
        echo.execute_on(0).fail_sealed().wait()
    assert not isinstance(sealed.value, SealedError)
    assert isinstance(sealed.value.cause, SealedError)
    assert "sealed shut" in str(sealed.value)


def test_the_first_failure_surfaces_without_waiting_for_slow_ranks(
    echo: WorkerGroup[EchoWorker],
) -> None:
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 gives up") as info:
        echo.fail_on(1, slow_seconds=3.0).wait()
    assert time.monotonic() - start < 2.0
    assert isinstance(info.value, WorkerError)
    assert info.value.rank == 1


def test_a_call_past_its_timeout_names_the_method_and_ranks(
    echo: WorkerGroup[EchoWorker],
) -> None:
    call = echo.sleep(1.0)
    with pytest.raises(WorkerTimeoutError) as info:
        call.wait(timeout=0.2)
    error = info.value
    assert isinstance(error, TimeoutError)
    assert (error.method, error.pending_ranks, error.timeout_s) == ("sleep", (0, 1), 0.2)
    message = str(error)
    assert f"sleep() on component '{echo.name}' did not finish within 0.2 s" in message
    assert "still running on rank(s) [0, 1]" in message
    assert call.wait() == [0, 1]  # the same call, waited on again


def test_the_group_default_call_timeout_applies(echo: WorkerGroup[EchoWorker]) -> None:
    echo.call_timeout_s = 0.2
    try:
        with pytest.raises(WorkerTimeoutError, match=r"sleep\(\)"):
            echo.execute_on(0).sleep(0.6).wait()
    finally:
        echo.call_timeout_s = None


def test_a_killed_worker_raises_worker_died_error(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    group = EchoWorker.create_group(0).launch(ray_cluster, plan_component("doomed"))
    try:
        (pid,) = group.execute_on(1).pid().wait()
        node = group.workers[1].node_ip
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as info:
            group.pid().wait(timeout=30)
        message = str(info.value)
        assert f"component '{group.name}' rank 1 (node {node}, pid {pid})" in message
        assert "died while running pid()" in message
        assert group.dead_ranks == (1,)
        assert group.execute_on(0).rank_plus(0).wait() == [0]  # rank 0 still answers
    finally:
        group.shutdown()


def test_a_rank_that_died_is_named_before_the_peers_that_failed_because_of_it(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    # Its peers' errors (a collective whose other end closed) come back first; Ray takes a
    # moment to declare the death. The error names the cause, then the consequences.
    group = EchoWorker.create_group(0).launch(ray_cluster, plan_component("dying"))
    try:
        with pytest.raises(WorkerDiedError) as info:
            group.die_or_fail(1).wait(timeout=30)
        message = str(info.value)
        assert f"component '{group.name}' rank 1" in message
        assert "died while running die_or_fail()" in message
        assert "Also failed: rank 0 (ConnectionError: rank 1 closed the connection)" in message
        assert group.dead_ranks == (1,)
    finally:
        group.shutdown()


def test_a_constructor_error_fails_the_launch_and_cleans_up(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    plan = plan_component("fragile")
    group = FragileWorker.create_group()
    with pytest.raises(KeyError) as info:
        group.launch(ray_cluster, plan)
    error = info.value
    assert isinstance(error, WorkerError)
    message = str(error)
    assert f"component '{plan.name}' rank 1 (node " in message
    assert "raised in __init__(): KeyError: 'checkpoint_dir'" in message
    # The worker's own frame, without the start-up plumbing around it.
    assert error.remote_traceback.startswith("Traceback (most recent call last):")
    assert 'test_worker.py", line' in error.remote_traceback
    assert 'raise KeyError("checkpoint_dir")' in error.remote_traceback
    assert "_rlshell_ready" not in error.remote_traceback
    assert error.method == "__init__"
    assert not group.actors
    states = [
        entry["state"]
        for entry in placement_group_table().values()
        if entry["name"].startswith(f"{plan.name}:")
    ]
    assert states == ["REMOVED"]
    with pytest.raises(RuntimeError, match="shut down"):
        group.ping()


def test_groups_started_side_by_side_answer_once_waited_for_and_a_failure_stops_them(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    """`start` creates a group's actors without waiting; `wait_started` waits. The reasoning
    runner starts its groups so, all before it waits for any."""
    first = EchoWorker.create_group(1).start(ray_cluster, plan_component("side_a"))
    second = EchoWorker.create_group(2).start(ray_cluster, plan_component("side_b"))
    try:
        with pytest.raises(RuntimeError, match="already launched"):
            first.start(ray_cluster, plan_component("side_c"))
        assert first.wait_started() is first
        assert second.wait_started() is second
        assert first.add(10).wait() == [11, 11]
        assert second.add(10).wait() == [12, 12]
        with pytest.raises(RuntimeError, match="already launched"):
            second.wait_started()
    finally:
        first.shutdown()
        second.shutdown()
    with pytest.raises(RuntimeError, match="call start\\(\\) first"):
        EchoWorker.create_group(0).wait_started()
    # A constructor that raises fails at the wait, and its group is stopped.
    fragile = FragileWorker.create_group().start(ray_cluster, plan_component("side_fragile"))
    with pytest.raises(KeyError, match="checkpoint_dir"):
        fragile.wait_started()
    assert not fragile.actors


def test_launching_a_name_twice_is_refused(
    echo: WorkerGroup[EchoWorker], ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    with pytest.raises(WorkerError, match=f"an actor named '{echo.name}:0' already exists"):
        EchoWorker.create_group(0).launch(ray_cluster, plan_component("again"), name=echo.name)


# ------------------------------------------------------------- torch.distributed


def test_gloo_process_group_all_reduces_across_ranks(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    group = GlooWorker.create_group().launch(ray_cluster, plan_component("gloo"))
    try:
        group.init_process_group("gloo", timeout_s=60).wait(timeout=120)
        assert group.all_reduce_rank().wait(timeout=60) == [3.0, 3.0]
        assert group.torch_threads().wait() == [1, 1]  # max(1, int(0.25 CPUs))
        # The embedded cluster keeps to loopback: Ray's GCS, raylet, workers and agents,
        # and the gloo group's pairs and rendezvous (a file, no TCP store) listen nowhere
        # else, so that nothing on another machine can reach them.
        assert open_listeners() == []
    finally:
        group.shutdown()


def test_the_cluster_refuses_a_client_without_its_token(ray_cluster: Cluster) -> None:
    # Token authentication is on in the tests as in runs (tests/conftest.py): a process of
    # this machine that reaches the loopback ports still needs the token to do anything.
    # Asked here of the GCS, where every driver and worker starts (Ray's own client of it).
    address = ray.get_runtime_context().gcs_address
    code = (
        "from ray._raylet import GcsClient\n"
        "try:\n"
        f"    GcsClient(address={address!r}).internal_kv_keys(b'', namespace=None, timeout=30)\n"
        "    print('answered')\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, str(error).split(':')[1].strip())"
    )
    tries = {
        "its token": {},
        "another token": {"RAY_AUTH_TOKEN": "0" * 64},
        "no token": {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": ""},
    }
    outcomes = {}
    for name, change in tries.items():
        env = {**os.environ, **change}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        outcomes[name] = done.stdout.strip()
    refused = "AuthenticationError InvalidAuthToken"
    assert outcomes == {"its token": "answered", "another token": refused, "no token": refused}


def open_listeners() -> list[str]:
    """The TCP sockets this process and its descendants (Ray's daemons and workers among
    them) listen on, other than on a loopback address: ``"address:port (process)"``."""
    import ipaddress

    import psutil

    mine = {psutil.Process().pid, *(p.pid for p in psutil.Process().children(recursive=True))}
    found = []
    for connection in psutil.net_connections(kind="inet"):
        if connection.status != psutil.CONN_LISTEN or connection.pid not in mine:
            continue
        address = ipaddress.ip_address(connection.laddr.ip)
        mapped = getattr(address, "ipv4_mapped", None)
        if not (address.is_loopback or (mapped is not None and mapped.is_loopback)):
            name = psutil.Process(connection.pid).name()
            found.append(f"{connection.laddr.ip}:{connection.laddr.port} ({name})")
    return sorted(found)


# ------------------------------------------------------------- extensions


def write_extension(directory: Path) -> str:
    name = f"rlshell_test_ext_{uuid.uuid4().hex[:8]}"
    (directory / f"{name}.py").write_text(
        "import os\nREGISTERED = []\ndef register():\n    REGISTERED.append(os.environ['RANK'])\n"
    )
    return name


def test_extension_modules_are_registered_in_every_worker(
    ray_cluster: Cluster,
    plan_component: PlanFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = write_extension(tmp_path)
    monkeypatch.setenv("RLSHELL_EXT_MODULE", module)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    group = ExtensionProbe.create_group().launch(ray_cluster, plan_component("ext"))
    try:
        assert group.registered(module).wait() == [["0"], ["1"]]
    finally:
        group.shutdown()


def test_a_missing_extension_module_fails_the_launch_naming_module_and_rank(
    ray_cluster: Cluster, plan_component: PlanFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSHELL_EXT_MODULE", "rlshell_no_such_extension")
    plan = plan_component("noext", world_size=1)
    with pytest.raises(ExtensionError) as info:
        ExtensionProbe.create_group().launch(ray_cluster, plan)
    assert isinstance(info.value, WorkerError)
    message = str(info.value)
    assert "module 'rlshell_no_such_extension' could not be imported" in message
    assert "ModuleNotFoundError: No module named 'rlshell_no_such_extension'" in message
    assert f"on the {plan.name} rank 0 (host" in message
    assert f"component '{plan.name}' rank 0 (node" in message


def test_an_extension_that_fails_on_one_worker_only_is_named_with_that_rank(
    ray_cluster: Cluster,
    plan_component: PlanFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An extension whose import fails in rank 1 only (a package missing on one node, say):
    the launch fails naming rank 1 and the extension's own error, not rank 0."""
    name = f"rlshell_test_ext_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "import os\nif os.environ.get('RANK') == '1':\n"
        "    raise ImportError('libfoo.so.1: cannot open shared object file')\n"
        "def register():\n    pass\n"
    )
    monkeypatch.setenv("RLSHELL_EXT_MODULE", name)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    plan = plan_component("halfext")
    with pytest.raises(ExtensionError) as info:
        ExtensionProbe.create_group().launch(ray_cluster, plan)
    message = str(info.value)
    assert f"component '{plan.name}' rank 1 (node" in message
    assert "libfoo.so.1: cannot open shared object file" in message
    assert f"component '{plan.name}' rank 0" not in message
    assert info.value.rank == 1


def test_the_rendezvous_port_is_free_and_below_the_ephemeral_range(tmp_path: Path) -> None:
    import socket

    from rlshell.cluster.worker import rendezvous_port

    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    ports = {rendezvous_port(ranges) for _ in range(20)}
    assert all(10_000 <= port < 32768 for port in ports)
    assert len(ports) > 1  # drawn at random: two launches do not race for one port
    with socket.socket() as sock:  # free when returned
        sock.bind(("", ports.pop()))
    # A machine without the file (not Linux): the kernel's choice.
    assert rendezvous_port(tmp_path / "missing") > 0
