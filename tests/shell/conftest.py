"""A local Ray cluster for shell tests, started at most once per pytest process.

Ray takes ~4 s to start, so the cluster is session-scoped: each pytest-xdist
worker gets its own (two run side by side under ``-n 2``, which Ray handles).
Each has a short temp dir of its own, as Ray's socket paths must stay under 107
characters. Workers ask for small fractional CPU bundles (`plan_component`'s
default 0.25) so that tests never wait on each other for resources.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlshell.cluster.placement import ComponentPlan, WorkerPlacement
from rlshell.cluster.ray_cluster import Cluster

PlanFactory = Callable[..., ComponentPlan]
ROOT = Path(__file__).resolve().parents[2]

_names = itertools.count()


@pytest.fixture(scope="session")
def ray_cluster() -> Cluster:
    """This pytest process's embedded 2-CPU Ray cluster (`tests.launcher.shared_cluster`: the
    one runs started by `tests.launcher` attach to), with Ray's token authentication on and
    the session's token from tests/conftest.py."""
    from tests import launcher

    cluster: Cluster = launcher.shared_cluster()
    return cluster


def make_plan(
    name: str, world_size: int = 2, cpus: float = 0.25, gpus: tuple[int, ...] = ()
) -> ComponentPlan:
    """A component with ``world_size`` workers on node 0, built by hand (no planner)."""
    return ComponentPlan(
        name=name,
        placement=f"0:0-{world_size - 1}",
        node_group="all",
        workers=[
            WorkerPlacement(
                rank=rank,
                node_rank=0,
                local_rank=rank,
                local_world_size=world_size,
                cpus=cpus,
                gpus=gpus,
                resources=(0,),
            )
            for rank in range(world_size)
        ],
    )


@pytest.fixture(scope="session")
def plan_component() -> PlanFactory:
    """``plan_component("actor", world_size=2, cpus=0.25)``: a plan with a name unique to this
    process, so actor names never collide between tests sharing the cluster."""

    def factory(
        name: str, world_size: int = 2, cpus: float = 0.25, gpus: tuple[int, ...] = ()
    ) -> ComponentPlan:
        return make_plan(f"{name}-{next(_names)}", world_size, cpus, gpus)

    return factory


@contextmanager
def single_rank_group() -> Iterator[None]:
    """A gloo process group of this process alone, for `FSDPModelManager` outside Ray.

    Its rendezvous is a file, as the workers' is: a TCP store would listen on every
    interface for as long as this test process lives (tests/shell/test_worker.py checks
    that nothing of a run does)."""
    import tempfile

    import torch.distributed as dist

    with tempfile.TemporaryDirectory(prefix="rlshell-rendezvous-") as directory:
        dist.init_process_group(
            "gloo", init_method=f"file://{directory}/store", rank=0, world_size=1
        )
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.fixture
def process_group() -> Iterator[None]:
    """`single_rank_group` for the test."""
    with single_rank_group():
        yield


@pytest.fixture
def ray_never_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything calls ``ray.init`` (an error that must come before Ray starts).

    ``ray.is_initialized()`` cannot say it: the session's `ray_cluster` may be up already.
    """
    import ray

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("ray.init was called: Ray started before the error was reported")

    monkeypatch.setattr(ray, "init", refuse)


TrainHere = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def train_here(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], ray_never_starts: None
) -> Iterator[TrainHere]:
    """``train_here(*args)``: ``python -m rlshell.train ARGS``'s status and output, from its
    ``main`` in this process, for commands that stop before Ray starts (Ray may not start).

    The same code as the command line from the repository root, without RLSHELL_EXT_MODULE,
    less an interpreter start-up (seconds of imports) per call.
    """
    from rlshell.train import main

    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("RLSHELL_EXT_MODULE", raising=False)
    ctrl_c = signal.getsignal(signal.SIGINT)  # main() installs Python's handler

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        status = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["rlshell.train", *args], status, out, err)

    yield run
    if ctrl_c is not None:
        signal.signal(signal.SIGINT, ctrl_c)
