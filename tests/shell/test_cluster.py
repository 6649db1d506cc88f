"""Cluster: the live spec, reservations with real placement groups, worker environments."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import ray
import torch
from ray.util import placement_group_table

from rlshell.cluster.placement import (
    ComponentPlan,
    NodeGroup,
    label_selector,
    local_cluster_spec,
    parse_node_ranks,
)
from rlshell.cluster.ray_cluster import NODE_RANK_LABEL, Cluster, ReservationError
from rlshell.cluster.worker import Worker
from rlshell.config import WORKER_MALLOC_ENV

PlanFactory = Callable[..., ComponentPlan]

ENV_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "RLSHELL_TEST_FLAVOUR",
    "MALLOC_TRIM_THRESHOLD_",
)


class EnvWorker(Worker):
    """Reports the environment the launch gave it."""

    def env(self) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in ENV_NAMES}


def pg_state(group: Any) -> str:
    return str(placement_group_table(group)["state"])


# ------------------------------------------------------------- pure helpers


def test_parse_node_ranks_reads_ranges_and_lists() -> None:
    assert parse_node_ranks("0-1,3", 4) == (0, 1, 3)
    assert parse_node_ranks("2", 4) == (2,)
    assert parse_node_ranks("all", 3) == (0, 1, 2)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("0-5", r"node group 'env': node ranks \[4, 5\] in '0-5' do not exist"),
        ("3-1", "runs backwards"),
        ("0,x", "'x' in '0,x' is not a node rank"),
        ("0-1,1", r"node ranks \[1\] appear twice"),
    ],
)
def test_parse_node_ranks_names_the_group_and_the_problem(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_node_ranks(text, 4, "env")


def test_local_cluster_spec_describes_this_machine_without_ray() -> None:
    spec = local_cluster_spec()
    assert len(spec.nodes) == 1
    assert spec.nodes[0].cpus == float(len(os.sched_getaffinity(0)))
    assert spec.nodes[0].gpus == torch.cuda.device_count()
    assert spec.node_groups == (NodeGroup("all", (0,)),)
    assert not spec.simulated


def test_attaching_refuses_embedded_only_options() -> None:
    with pytest.raises(ValueError, match="num_cpus and temp_dir configure an embedded Ray"):
        Cluster("auto", num_cpus=2)


TIMED_OUT = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


@pytest.mark.parametrize(
    ("failures", "started"),
    [([TIMED_OUT], True), ([TIMED_OUT, TIMED_OUT], False), (["no such interface"], False)],
    ids=["timed-out-once", "timed-out-twice", "another-error"],
)
def test_an_embedded_start_that_times_out_is_tried_once_more_and_said(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failures: list[str],
    started: bool,
) -> None:
    """Ray gives its node a fixed 30 s to start; on a loaded machine that can pass. The
    start is tried once more, after a pause, saying so; a second time-out, or any other
    error, is raised as Ray raised it, and whatever a failed try left is shut down."""
    import rlshell.cluster.ray_cluster as ray_cluster

    calls: list[dict[str, Any]] = []
    shutdowns: list[int] = []

    def init(**kwargs: Any) -> None:
        calls.append(kwargs)
        if len(calls) <= len(failures):
            raise Exception(failures[len(calls) - 1])

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # the session's Ray may be up
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(ray_cluster, "_RETRY_PAUSE_S", 0.0)
    if started:
        Cluster(num_cpus=2, temp_dir="/tmp/rt").shutdown()
    else:
        with pytest.raises(Exception, match=failures[-1]):
            Cluster(num_cpus=2, temp_dir="/tmp/rt")
    retried = failures[0] == TIMED_OUT
    assert len(calls) == (2 if retried else 1)
    assert all(call["address"] == "local" and call["_temp_dir"] == "/tmp/rt" for call in calls)
    assert len(shutdowns) == (1 if retried else 0)
    said = capsys.readouterr().err
    assert (
        "did not start within Ray's 30 s" in said and "starting it once more" in said
    ) == retried


# ------------------------------------------------------------- the live cluster


def test_spec_reads_the_live_node(ray_cluster: Cluster) -> None:
    spec = ray_cluster.spec()
    assert len(spec.nodes) == 1
    node = spec.nodes[0]
    assert (node.cpus, node.gpus) == (2.0, 0)
    assert node.address == ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    assert spec.node_groups == (NodeGroup("all", (0,)),)
    assert ray_cluster.node_ids() == (ray.get_runtime_context().get_node_id(),)
    assert ray_cluster.startup_seconds > 0


def test_spec_labels_node_groups(ray_cluster: Cluster) -> None:
    spec = ray_cluster.spec({"head": "0"})
    assert spec.node_groups == (NodeGroup("all", (0,)), NodeGroup("head", (0,)))
    with pytest.raises(ValueError, match=r"node group 'gpu': node ranks \[1\]"):
        ray_cluster.spec({"gpu": "0-1"})
    with pytest.raises(ValueError, match="'all' is built in"):
        ray_cluster.spec({"all": "0"})


def _node(node_id: str, ip: str, **labels: str) -> dict[str, Any]:
    return {
        "NodeID": node_id,
        "Alive": True,
        "NodeManagerAddress": ip,
        "Resources": {"CPU": 2.0},
        "Labels": labels,
    }


def test_nodes_rank_by_their_rank_label_then_the_driver_then_ip(
    ray_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three nodes on one IP (as Ray's multi-node test utility makes them): the
    ``rlstack/node-rank`` label orders them, whatever their node ids; without labels the
    driver's node is rank 0 and the rest go by IP. Node groups select by any label."""
    import rlshell.cluster.ray_cluster as module

    driver = ray.get_runtime_context().get_node_id()
    labelled = [
        _node("c" * 8, "10.0.0.1", **{NODE_RANK_LABEL: "2", "pool": "envs"}),
        _node(driver, "10.0.0.1", **{NODE_RANK_LABEL: "0", "pool": "learner"}),
        _node("a" * 8, "10.0.0.1", **{NODE_RANK_LABEL: "1", "pool": "envs"}),
    ]
    monkeypatch.setattr(module, "_ray_nodes", lambda: labelled)
    assert ray_cluster.node_ids() == (driver, "a" * 8, "c" * 8)
    spec = ray_cluster.spec({"envs": "pool=envs"})
    assert spec.node_groups[1] == NodeGroup("envs", (1, 2))
    with pytest.raises(ValueError, match=r"no alive node has label pool=gpu \(the 3 alive nodes "):
        ray_cluster.spec({"envs": "pool=gpu"})
    unlabelled = [
        _node("b" * 8, "10.0.0.9"),
        _node("a" * 8, "10.0.0.10"),
        _node(driver, "10.0.0.11"),
    ]
    monkeypatch.setattr(module, "_ray_nodes", lambda: unlabelled)
    assert ray_cluster.node_ids() == (driver, "b" * 8, "a" * 8)
    broken = [_node(driver, "10.0.0.1", **{NODE_RANK_LABEL: "first"})]
    monkeypatch.setattr(module, "_ray_nodes", lambda: broken)
    with pytest.raises(ValueError, match=r"label rlstack/node-rank='first' is not a node rank"):
        ray_cluster.node_ids()


def test_label_node_groups_need_a_running_cluster() -> None:
    from rlshell.cluster.placement import NodeSpec, PlacementError, cluster_spec

    assert label_selector("pool=cpu") == ("pool", "cpu")
    assert label_selector("0-2") is None
    with pytest.raises(ValueError, match="neither node ranks nor a label"):
        label_selector("pool=")
    with pytest.raises(PlacementError, match=r"node group 'envs': 'pool=cpu' selects nodes by"):
        cluster_spec([NodeSpec(0, 2)], {"envs": "pool=cpu"})


def test_reserve_pins_one_bundle_per_worker_to_the_node(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    plan = plan_component("reserve")
    reservation = ray_cluster.reserve(plan, timeout_s=30)
    try:
        (group,) = reservation.groups.values()
        table = placement_group_table(group)
        assert table["state"] == "CREATED"
        assert table["strategy"] == "STRICT_PACK"
        assert list(table["bundles"].values()) == [{"CPU": 0.25}, {"CPU": 0.25}]
        assert set(table["bundles_to_node_id"].values()) == set(ray_cluster.node_ids())
        assert [reservation.bundle_index(rank) for rank in (0, 1)] == [0, 1]
        assert reservation.node_id(1) == ray_cluster.node_ids()[0]
        assert reservation.scheduling_strategy(1).placement_group_bundle_index == 1
    finally:
        reservation.release()
    assert pg_state(group) == "REMOVED"
    reservation.release()  # idempotent


def test_impossible_reservation_fails_at_once_saying_asked_and_available(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    plan = plan_component("greedy", world_size=2, cpus=1.5)
    start = time.monotonic()
    with pytest.raises(ReservationError) as info:
        ray_cluster.reserve(plan, timeout_s=30)
    assert time.monotonic() - start < 2.0
    message = str(info.value)
    assert f"component '{plan.name}'" in message
    assert "node 0" in message
    assert "ranks 0, 1 ask for 3 CPUs in all, the node has 2 CPUs" in message


def test_reservation_on_a_missing_node_or_gpu_is_refused(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    plan = plan_component("far", world_size=1)
    far = attrs.evolve(plan, workers=[attrs.evolve(w, node_rank=3) for w in plan.workers])
    with pytest.raises(ReservationError, match=r"on node 3, but the cluster has 1 alive node"):
        ray_cluster.reserve(far)
    with pytest.raises(ReservationError, match=r"rank 0 asks for GPUs \[1\] on node 0 .* 0 GPU"):
        ray_cluster.reserve(plan_component("gpu", world_size=1, gpus=(1,)))


def test_busy_resources_time_out_with_what_is_free(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    holder = ray_cluster.reserve(plan_component("holder", world_size=1, cpus=0.5))
    try:
        plan = plan_component("waiter", world_size=1, cpus=2.0)
        with pytest.raises(ReservationError) as info:
            ray_cluster.reserve(plan, timeout_s=0.5)
    finally:
        holder.release()
    message = str(info.value)
    assert f"component '{plan.name}': placement groups not placed within 0.5 s" in message
    assert "ranks 0 ask for 2 CPUs;" in message
    assert "of the node's 2 CPUs are free" in message


def test_worker_env_pins_gpus_and_keeps_ray_off_them(
    ray_cluster: Cluster, plan_component: PlanFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLSHELL_EXT_MODULE", "my_ext")
    monkeypatch.setenv("PYTHONPATH", "/opt/ext")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", "/data/hub")
    plan = plan_component("gpu-env", world_size=1, cpus=3.0, gpus=(2, 3))
    env = ray_cluster.worker_env(plan, plan.workers[0], gpu_node=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1"
    assert env["OMP_NUM_THREADS"] == "3"
    assert (env["RLSHELL_EXT_MODULE"], env["PYTHONPATH"]) == ("my_ext", "/opt/ext")
    # Workers resolve Hub ids in the cache, and offline, as the driver validated them.
    assert (env["HF_HUB_OFFLINE"], env["HF_HUB_CACHE"]) == ("1", "/data/hub")
    # By default workers keep freed memory (cluster.worker_env_vars' default).
    assert {key: env[key] for key in WORKER_MALLOC_ENV} == WORKER_MALLOC_ENV
    cpu_only = ray_cluster.worker_env(plan_component("cpu-env"), plan.workers[0], gpu_node=False)
    assert "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES" in cpu_only  # the worker asked for GPUs


def test_workers_see_their_rank_rendezvous_and_devices(
    ray_cluster: Cluster, plan_component: PlanFactory
) -> None:
    # A second Cluster in the same process reuses Ray; its shutdown leaves Ray up.
    with Cluster(runtime_env_vars={"RLSHELL_TEST_FLAVOUR": "mint"}) as cluster:
        assert not cluster.owns_ray
        group = EnvWorker.create_group().launch(cluster, plan_component("env"))
        envs = group.env().wait()
        rank0_ip = group.workers[0].node_ip
        for rank, env in enumerate(envs):
            assert env["RANK"] == str(rank)
            assert env["LOCAL_RANK"] == str(rank)
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["NODE_RANK"]) == ("2", "2", "0")
            assert env["MASTER_ADDR"] == rank0_ip
            assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"]
            assert 0 < int(env["MASTER_PORT"] or 0) < 65536
            assert env["CUDA_VISIBLE_DEVICES"] == ""
            assert env["OMP_NUM_THREADS"] == "1"
            assert env["RLSHELL_TEST_FLAVOUR"] == "mint"
            assert env["MALLOC_TRIM_THRESHOLD_"] is None  # explicit vars replace the default
        assert group.reservation is not None
        groups = list(group.reservation.groups.values())
    # Cluster.shutdown stopped the group and removed its placement groups, not Ray.
    assert ray.is_initialized()
    assert group.dead_ranks == ()
    assert not group.actors
    assert [pg_state(pg) for pg in groups] == ["REMOVED"]
    cluster.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="shut down"):
        cluster.spec()
