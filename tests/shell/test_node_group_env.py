"""Node groups as RLinf has them: per-group environment variables and interpreter
(``env_configs``), ``hardware``, and the network interface collectives use
(``cluster.comm_net_devices`` / ``RLINF_COMM_NET_DEVICES``), checked before any worker
starts and applied to the workers placed on the group."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import attrs
import psutil
import pytest
import ray

from rlshell.cluster.node_facts import local_interfaces, probe_node
from rlshell.cluster.placement import (
    ComponentRequest,
    PlacementPlan,
    plan_placement,
    read_plan,
    render_table,
    simulated_cluster,
    write_plan,
)
from rlshell.cluster.placement.node_groups import interface_problems, worker_settings
from rlshell.cluster.ray_cluster import Cluster, ReservationError
from rlshell.cluster.worker import Worker
from rlshell.config import Config, config_from_dict, config_to_dict
from rlshell.config.schema import NodeGroupEntry, NodeGroupEnvConfig, NodeHardwareConfig
from rlshell.runners.validation import cluster_spec_for, plan_for, validate
from tests.shell.test_multinode import nodes as two_nodes  # noqa: F401  (a fixture)

GROUP = "cluster.node_groups: node group 'g'"


def with_cluster(config: Config, **changes: Any) -> Config:
    return attrs.evolve(config, cluster=attrs.evolve(config.cluster, **changes))


def entry(
    ranks: str = "0",
    *envs: NodeGroupEnvConfig,
    hardware: NodeHardwareConfig | None = None,
) -> NodeGroupEntry:
    return NodeGroupEntry(ranks, env_configs=envs, hardware=hardware)


def problems_of(**changes: Any) -> list[str]:
    return validate(with_cluster(Config(), **changes), for_run=False)


@pytest.fixture(autouse=True)
def _no_rlinf_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLINF_COMM_NET_DEVICES", raising=False)


# ----------------------------------------------------------------------------- config


def test_a_node_group_in_rlinfs_long_form_reads_and_round_trips() -> None:
    data = {
        "cluster": {
            "node_groups": {
                "cpu": "0",
                "sim": {
                    "node_ranks": "0",
                    "env_configs": [
                        {
                            "node_ranks": "0",
                            "env_vars": {"MUJOCO_GL": "egl"},
                            "python_interpreter_path": "/opt/venv/sim/bin/python",
                        }
                    ],
                    "hardware": {"type": "Accelerator"},
                },
            },
            "comm_net_devices": "eth0",
        }
    }
    config = config_from_dict(data)
    sim = config.cluster.node_groups["sim"]
    assert isinstance(sim, NodeGroupEntry)
    assert sim.env_configs[0].env_vars == {"MUJOCO_GL": "egl"}
    assert sim.hardware == NodeHardwareConfig("Accelerator")
    assert config.cluster.node_groups["cpu"] == "0"
    assert config_from_dict(json.loads(json.dumps(config_to_dict(config)))) == config


@pytest.mark.parametrize(
    ("group", "problem"),
    [
        (
            {"node_ranks": "0", "env_config": []},
            "unknown key 'cluster.node_groups.g.env_config'",
        ),
        (3, "cluster.node_groups.g: expected node ranks such as '0-1' or"),
    ],
)
def test_a_malformed_node_group_names_its_key(group: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        config_from_dict({"cluster": {"node_groups": {"g": group}}})


# ------------------------------------------------------------------ env_configs refused


@pytest.mark.parametrize(
    ("env_vars", "problem"),
    [
        ({"1ST": "x"}, "'1ST' is not a variable name (letters, digits and '_', not starting"),
        ({"MY-VAR": "x"}, "'MY-VAR' is not a variable name"),
        (
            {"RLSHELL_EXT_OBJECTS": "x"},
            "'RLSHELL_EXT_OBJECTS': RLSHELL_* variables are rlstack's own",
        ),
        ({"RAY_DEDUP_LOGS": "0"}, "'RAY_DEDUP_LOGS': RAY_* variables are Ray's"),
        ({"RANK": "3"}, "'RANK' is set by rlstack in every worker (the worker's rank"),
        ({"PYTHONPATH": "/x"}, "'PYTHONPATH' is set by rlstack in every worker (the driver's"),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "'CUDA_VISIBLE_DEVICES' is set by rlstack"),
        (
            {"GLOO_SOCKET_IFNAME": "nosuch9"},
            "GLOO_SOCKET_IFNAME=nosuch9: no network interface 'nosuch9' on this node (node 0); "
            "its interfaces: ",
        ),
    ],
)
def test_env_vars_a_group_cannot_set_are_refused_before_start(
    env_vars: dict[str, str], problem: str
) -> None:
    problems = problems_of(node_groups={"g": entry("0", NodeGroupEnvConfig(env_vars=env_vars))})
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{GROUP}: env_configs[0].env_vars: {problem}"), problems


def test_a_missing_or_relative_interpreter_is_refused_before_start(tmp_path: Path) -> None:
    not_executable = tmp_path / "python"
    not_executable.write_text("")
    envs = [
        NodeGroupEnvConfig(python_interpreter_path=str(tmp_path / "nowhere" / "python")),
        NodeGroupEnvConfig(python_interpreter_path="venv/bin/python"),
        NodeGroupEnvConfig(python_interpreter_path=str(not_executable)),
        NodeGroupEnvConfig(python_interpreter_path=str(tmp_path)),
    ]
    groups = {f"g{i}": entry("0", env) for i, env in enumerate(envs)}
    problems = problems_of(node_groups=groups)
    at = "cluster.node_groups: node group 'g{}': env_configs[0].python_interpreter_path: "
    assert problems == [
        at.format(1) + "expected an absolute path to a Python executable on the group's "
        "nodes, got 'venv/bin/python'",
        at.format(0) + f"'{tmp_path}/nowhere/python' does not exist on this node",
        at.format(2) + f"'{not_executable}' is not executable on this node",
        at.format(3) + f"'{tmp_path}' is not a file on this node",
    ]
    fine = NodeGroupEnvConfig(python_interpreter_path=sys.executable)
    assert problems_of(node_groups={"g": entry("0", fine)}) == []


def test_env_configs_must_split_the_groups_nodes() -> None:
    config = with_cluster(Config(), simulate="4x0", num_nodes=4)
    groups = {
        "g": entry(
            "1-2",
            NodeGroupEnvConfig(node_ranks="1-3", env_vars={"A": "1"}),
            NodeGroupEnvConfig(node_ranks="2", env_vars={"A": "2"}),
            NodeGroupEnvConfig(node_ranks="x"),
        )
    }
    problems = validate(with_cluster(config, node_groups=groups), for_run=False)
    assert problems[:3] == [
        f"{GROUP}: env_configs[0].node_ranks: node 3 not in the group (its nodes 1-2)",
        f"{GROUP}: env_configs[1].node_ranks: node 2 already configured by env_configs[0]; "
        "each node takes one entry",
        f"{GROUP}: env_configs[2].node_ranks: bad rank 'x' in 'x'; expected a rank like '5' "
        "or an inclusive range like '0-7'",
    ]


# -------------------------------------------------------------------------- hardware


@pytest.mark.parametrize(
    ("hardware", "problem"),
    [
        (
            NodeHardwareConfig("Franka", ({"node_rank": 0, "robot_ip": "10.0.0.1"},)),
            "hardware.type: 'Franka' is one of RLinf's robots, which its scheduler finds and "
            "pings on their nodes; rlstack has no robot drivers to do so.",
        ),
        (
            NodeHardwareConfig("Accelerater"),
            "hardware.type: unknown hardware type 'Accelerater' (did you mean 'Accelerator'?)",
        ),
        (
            NodeHardwareConfig("Accelerator"),
            "hardware.type: 'Accelerator' is not present on node 0 of the group, which have "
            "no GPU (GPUs per node: node 0: 0)",
        ),
    ],
)
def test_hardware_rlstack_cannot_honour_is_refused_with_the_reason(
    hardware: NodeHardwareConfig, problem: str
) -> None:
    if hardware.type == "Accelerator" and _gpus():
        pytest.skip("this machine has a GPU: the accelerator is present")
    problems = problems_of(node_groups={"g": entry("0", hardware=hardware)})
    assert next(p for p in problems if p.startswith(GROUP)).startswith(f"{GROUP}: {problem}")


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def test_accelerator_hardware_is_honoured_where_the_nodes_have_gpus() -> None:
    config = config_from_dict(
        {
            "cluster": {
                "simulate": "2x8x32",
                "num_nodes": 2,
                "node_groups": {"a800": {"node_ranks": "1", "hardware": {"type": "Accelerator"}}},
                "component_placement": {
                    "actor,rollout": {"placement": "0-7", "node_group": "a800"},
                    "reward": "0",
                },
            }
        }
    )
    assert validate(config, for_run=False) == []
    spec = cluster_spec_for(config)
    assert spec is not None
    assert spec.node_group("a800").hardware == "Accelerator"
    plan = plan_for(config, spec)
    assert {w.node_rank for w in plan.component("actor").workers} == {1}
    assert "a800 = node 1 (Accelerator)" in render_table(plan)
    configs = NodeHardwareConfig("Accelerator", ({"model": "A800"},))
    refused = validate(
        with_cluster(config, node_groups={"a800": entry("1", hardware=configs)}), for_run=False
    )
    assert refused == [
        "cluster.node_groups: node group 'a800': hardware.configs: 'Accelerator' takes no "
        "configs (each node's GPUs are read from the node), got 1"
    ]


# ------------------------------------------------------------ the collectives' interface


def test_a_bad_interface_is_refused_before_start_naming_the_nodes_interfaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    present = ", ".join(local_interfaces())
    assert problems_of(comm_net_devices="nosuch0") == [
        "cluster.comm_net_devices: no network interface 'nosuch0' on this node (node 0); "
        f"its interfaces: {present}"
    ]
    assert problems_of(comm_net_devices="lo,nosuch1")[0].startswith(
        "cluster.comm_net_devices: no network interface 'nosuch1'"
    )
    assert problems_of(comm_net_devices="lo eth0") == [
        "cluster.comm_net_devices: expected network interface names joined by ',' (e.g. "
        "'eth0' or 'ib0,eth0'), got 'lo eth0'"
    ]
    assert problems_of(comm_net_devices="lo") == []
    # RLinf's variable, read when the key is unset, is checked the same way (and named).
    monkeypatch.setenv("RLINF_COMM_NET_DEVICES", "nosuch2")
    assert problems_of() == [
        "RLINF_COMM_NET_DEVICES: no network interface 'nosuch2' on this node (node 0); its "
        f"interfaces: {present}"
    ]
    assert problems_of(comm_net_devices="lo") == []  # the key wins


def test_the_plan_records_each_workers_group_env_and_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = {
        "sim": entry(
            "1",
            NodeGroupEnvConfig(
                env_vars={"MUJOCO_GL": "egl", "GLOO_SOCKET_IFNAME": "eth1"},
                python_interpreter_path="/opt/venv/sim/bin/python",
            ),
        )
    }
    monkeypatch.setenv("RLINF_COMM_NET_DEVICES", "eth0")
    config = with_cluster(
        Config(),
        simulate="2x2x16",
        num_nodes=2,
        node_groups=groups,
        component_placement={
            "actor,rollout": "0-1",
            "reward": "0",
        },
    )
    requests = [
        ComponentRequest("env", "0", node_group="sim", uses_gpus=False),
        ComponentRequest("actor", "0-1"),
    ]
    spec = cluster_spec_for(config)
    assert spec is not None
    assert spec.comm_net_devices == "eth0"
    plan = plan_placement(spec, requests)
    (env_worker,) = plan.component("env").workers
    assert env_worker.env_vars == {
        "GLOO_SOCKET_IFNAME": "eth1",  # the group's own interface over the cluster's
        "NCCL_SOCKET_IFNAME": "eth0",
        "MUJOCO_GL": "egl",
    }
    assert env_worker.python_executable == "/opt/venv/sim/bin/python"
    for actor in plan.component("actor").workers:
        assert actor.env_vars == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0"}
        assert actor.python_executable is None
    written = json.loads(write_plan(plan, tmp_path / "placement.json").read_text())
    assert written["cluster"]["comm_net_devices"] == "eth0"
    sim = written["cluster"]["node_groups"][1]
    assert sim["envs"] == [
        {
            "node_ranks": [1],
            "env_vars": {"MUJOCO_GL": "egl", "GLOO_SOCKET_IFNAME": "eth1"},
            "python_executable": "/opt/venv/sim/bin/python",
        }
    ]
    assert [c["name"] for c in written["components"]] == ["env", "actor"]
    assert written["components"][1]["workers"][0]["python_executable"] is None
    assert read_plan(tmp_path) == plan
    table = render_table(plan)
    assert "sim = node 1 (node 1: GLOO_SOCKET_IFNAME, MUJOCO_GL, python /opt/venv/sim" in table
    assert "collectives' network interface: eth0" in table


def test_plan_for_gives_a_spec_read_from_ray_the_configs_interface() -> None:
    config = with_cluster(Config(), comm_net_devices="lo")
    spec = cluster_spec_for(config)
    assert spec is not None
    bare = attrs.evolve(spec, comm_net_devices=None)  # as Cluster.spec reads the nodes
    plan = plan_for(config, bare)
    assert plan.cluster.comm_net_devices == "lo"
    assert all(w.env_vars["GLOO_SOCKET_IFNAME"] == "lo" for c in plan.components for w in c.workers)


def test_nccl_names_prefixes_and_exclusions() -> None:
    present = ["eth0", "ib0", "lo"]
    assert interface_problems({"NCCL_SOCKET_IFNAME": "eth"}, present, "node 0") == []
    assert interface_problems({"NCCL_SOCKET_IFNAME": "^docker"}, present, "node 0") == []
    assert interface_problems({"NCCL_SOCKET_IFNAME": "=eth"}, present, "node 0") == [
        "NCCL_SOCKET_IFNAME==eth: no network interface 'eth' on node 0; its interfaces: "
        "eth0, ib0, lo"
    ]
    assert interface_problems({"GLOO_SOCKET_IFNAME": "eth"}, present, "node 0") != []
    spec = simulated_cluster("1x0", {"g": entry("0", NodeGroupEnvConfig(env_vars={"X": "1"}))})
    assert worker_settings(spec.node_group("g"), 0, None) == ({"X": "1"}, None)
    assert worker_settings(spec.node_group("all"), 0, None) == ({}, None)


# ------------------------------------------------------------------- real Ray workers


class Probe(Worker):
    """Reports what its process was started with, and joins a gloo group."""

    def report(self) -> dict[str, str | None]:
        return {
            "marker": os.environ.get("GROUP_TEST_MARKER"),
            "gloo": os.environ.get("GLOO_SOCKET_IFNAME"),
            "nccl": os.environ.get("NCCL_SOCKET_IFNAME"),
            "executable": sys.executable,
            "prefix": sys.prefix,
        }

    def gloo_all_reduce(self) -> dict[str, Any]:
        """Sum the ranks over gloo; the local addresses of the connections the group made."""
        import torch
        import torch.distributed as dist

        process = psutil.Process()

        # Without an embedded cluster's rendezvous file, the ranks also meet at rank 0's
        # TCP store (MASTER_PORT): not gloo's pairs.
        store_port = int(os.environ.get("MASTER_PORT", "0"))

        def connections() -> set[tuple[Any, Any]]:
            return {
                (c.laddr, c.raddr)
                for c in process.net_connections(kind="tcp")
                if c.raddr
                and c.status == psutil.CONN_ESTABLISHED
                and store_port not in (c.laddr.port, c.raddr.port)
            }

        before = connections()
        self.init_process_group("gloo", timeout_s=120)
        total = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(total)
        made = connections() - before
        dist.destroy_process_group()
        return {"sum": float(total.item()), "local_ips": sorted({laddr.ip for laddr, _ in made})}


@pytest.fixture
def alternative_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second interpreter: a virtual environment of its own prefix whose packages are this
    one's (its ``lib`` links to this venv's), as a group's venv on another machine would be."""
    root = tmp_path_factory.mktemp("altpy")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (root / "lib").symlink_to(Path(sys.prefix) / "lib")
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", root / "pyvenv.cfg")
    return root / "bin" / "python"


def _plan(
    cluster: Cluster,
    groups: dict[str, NodeGroupEntry],
    *requests: ComponentRequest,
    comm_net_devices: str | None = None,
) -> PlacementPlan:
    spec = attrs.evolve(cluster.spec(groups), comm_net_devices=comm_net_devices)
    return plan_placement(spec, list(requests))


@pytest.mark.slow
def test_a_groups_env_and_interpreter_reach_only_its_workers(
    ray_cluster: Cluster, alternative_python: Path
) -> None:
    groups = {
        "sim": entry(
            "0",
            NodeGroupEnvConfig(
                env_vars={"GROUP_TEST_MARKER": "sim-only"},
                python_interpreter_path=str(alternative_python),
            ),
        )
    }
    with Cluster() as cluster:
        plan = _plan(
            cluster,
            groups,
            ComponentRequest(
                "grouped", "0", node_group="sim", cpus_per_worker=0.25, uses_gpus=False
            ),
            ComponentRequest("plain", "0", cpus_per_worker=0.25, uses_gpus=False),
        )
        grouped = Probe.create_group().launch(cluster, plan.component("grouped"))
        plain = Probe.create_group().launch(cluster, plan.component("plain"))
        (inside,) = grouped.report().wait()
        (outside,) = plain.report().wait()
    assert inside["marker"] == "sim-only"
    assert inside["executable"] == str(alternative_python)
    assert inside["prefix"] == str(alternative_python.parent.parent)
    assert outside["marker"] is None
    assert outside["prefix"] != inside["prefix"]


def _interfaces_with_ipv4() -> dict[str, str]:
    return {
        name: next(a.address for a in addresses if a.family == socket.AF_INET)
        for name, addresses in psutil.net_if_addrs().items()
        if any(a.family == socket.AF_INET for a in addresses)
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["loopback", "other"])
def test_a_gloo_group_forms_over_the_named_interface(ray_cluster: Cluster, kind: str) -> None:
    addresses = _interfaces_with_ipv4()
    names = [n for n in addresses if (n == "lo") == (kind == "loopback")]
    if not names:
        pytest.skip(f"this machine has no {kind} interface with an IPv4 address")
    name = names[0]
    with Cluster() as cluster:
        plan = _plan(
            cluster,
            {},
            ComponentRequest("net", "0:0-1", cpus_per_worker=0.25, uses_gpus=False),
            comm_net_devices=name,
        )
        group = Probe.create_group().launch(cluster, plan.component("net"))
        reports = group.report().wait()
        results = group.gloo_all_reduce().wait()
    assert [(r["gloo"], r["nccl"]) for r in reports] == [(name, name)] * 2
    assert [r["sum"] for r in results] == [3.0, 3.0]
    # The pairs gloo connected are on the named interface's address, and only there.
    assert all(r["local_ips"] == [addresses[name]] for r in results), (name, results)


@pytest.mark.slow
@pytest.mark.parametrize("probe", [False, True])
def test_a_bad_interface_or_interpreter_is_refused_before_any_worker_starts(
    ray_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, probe: bool, tmp_path: Path
) -> None:
    with Cluster() as cluster:
        if probe:  # read the node by a task pinned to it, as on an attached cluster
            monkeypatch.setattr(cluster, "embedded", False)
        name = f"refused{int(probe)}"
        missing = tmp_path / "python"
        groups = {"g": entry("0", NodeGroupEnvConfig(python_interpreter_path=str(missing)))}
        plan = _plan(
            cluster,
            groups,
            ComponentRequest(name, "0:0-1", node_group="g", cpus_per_worker=0.25, uses_gpus=False),
            comm_net_devices="nosuch0",
        )
        with pytest.raises(ReservationError) as refused:
            Probe.create_group().launch(cluster, plan.component(name))
    message = str(refused.value)
    present = ", ".join(local_interfaces())
    assert message.startswith(f"component '{name}' cannot start: node group 'g': ")
    assert "GLOO_SOCKET_IFNAME=nosuch0: no network interface 'nosuch0' on node 0 " in message
    assert f"its interfaces: {present}" in message
    assert f"python_interpreter_path: '{missing}' does not exist on node 0" in message
    for rank in (0, 1):
        with pytest.raises(ValueError, match="Failed to look up actor"):
            ray.get_actor(f"{name}:{rank}", namespace=cluster.namespace)


@pytest.mark.slow
def test_a_probe_reads_the_nodes_interfaces_and_interpreters(ray_cluster: Cluster) -> None:
    node_id = ray_cluster.node_ids()[0]
    facts = probe_node(node_id, [sys.executable, "/nowhere/python"])
    assert facts.interfaces == local_interfaces()
    assert facts.executable_problem(sys.executable) is None
    assert facts.executable_problem("/nowhere/python") == "'/nowhere/python' does not exist"


def test_the_command_lines_overrides_take_the_long_form_and_the_interface() -> None:
    """What ``python -m rlshell.train configs/grpo.py ...`` reads: a group in RLinf's long
    form and the interface, refused together with their keys when wrong."""
    from rlshell.config import ConfigError
    from rlshell.runners.validation import load_config

    group = (
        'cluster.node_groups={"g": {"node_ranks": "0", "env_configs": [{"env_vars": '
        '{"RAY_ADDRESS": "x"}, "python_interpreter_path": "/nowhere/python"}], '
        '"hardware": {"type": "DualFranka", "configs": [{"node_rank": 0}]}}}'
    )
    with pytest.raises(ConfigError) as refused:
        load_config("configs/grpo.py", [group, "cluster.comm_net_devices=nosuch0"], for_run=False)
    lines = refused.value.problems
    assert sorted(line.split(":")[0] for line in lines) == [
        "cluster.comm_net_devices",
        "cluster.node_groups",
        "cluster.node_groups",
        "cluster.node_groups",
    ]
    assert any("'RAY_ADDRESS': RAY_* variables are Ray's" in line for line in lines)
    assert any("'/nowhere/python' does not exist on this node" in line for line in lines)
    assert any("'DualFranka' is one of RLinf's robots" in line for line in lines)
    fine = (
        'cluster.node_groups={"g": {"node_ranks": "0", "env_configs": [{"env_vars": {"A": "1"}}]}}'
    )
    config = load_config("configs/grpo.py", [fine, "cluster.comm_net_devices=lo"], for_run=False)
    assert config.cluster.node_groups["g"] == entry("0", NodeGroupEnvConfig(env_vars={"A": "1"}))
    assert config.cluster.comm_net_devices == "lo"


# ------------------------------------------------- a node's own RLINF_COMM_NET_DEVICES


def test_a_worker_adopts_its_nodes_rlinf_interface_where_the_launch_named_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlshell.cluster.node_facts import adopt_node_interface

    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    assert adopt_node_interface("node 0") == {}  # nothing set on the node: gloo chooses
    monkeypatch.setenv("RLINF_COMM_NET_DEVICES", "lo")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # the launch's (or the node's) own, kept
    assert adopt_node_interface("node 0") == {"NCCL_SOCKET_IFNAME": "lo"}
    assert os.environ["NCCL_SOCKET_IFNAME"] == "lo"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    monkeypatch.setenv("RLINF_COMM_NET_DEVICES", "nosuch0")
    with pytest.raises(ValueError, match="no network interface 'nosuch0' on node 3") as bad:
        adopt_node_interface("node 3 (10.0.0.3)")
    assert str(bad.value) == (
        "RLINF_COMM_NET_DEVICES=nosuch0 (this node's, for its collectives): no network "
        f"interface 'nosuch0' on node 3 (10.0.0.3); its interfaces: {', '.join(local_interfaces())}"
    )
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_an_attached_clusters_plan_leaves_each_node_its_own_rlinf_interface(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver's RLINF_COMM_NET_DEVICES is its node's: an embedded or planned cluster's
    plan gives it to every worker; an attached cluster's nodes each have their own."""
    monkeypatch.setenv("RLINF_COMM_NET_DEVICES", "lo")
    embedded = Config()
    spec = cluster_spec_for(embedded)
    assert spec is not None
    assert plan_for(embedded, spec).cluster.comm_net_devices == "lo"
    attached = with_cluster(Config(), address="auto")
    assert (
        plan_for(attached, attrs.evolve(spec, comm_net_devices=None)).cluster.comm_net_devices
        is None
    )
    keyed = with_cluster(attached, comm_net_devices="eth0")
    assert (
        plan_for(keyed, attrs.evolve(spec, comm_net_devices=None)).cluster.comm_net_devices
        == "eth0"
    )


@pytest.mark.slow
def test_workers_on_a_node_with_rlinf_comm_net_devices_use_it_or_refuse_it(
    ray_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    addresses = _interfaces_with_ipv4()
    name = next((n for n in addresses if n != "lo"), "lo")
    for node_value in (name, "nosuch0"):
        # As on a node of an attached cluster: the variable in the node's environment, no
        # interface named by the launch (an embedded cluster's gloo default is loopback).
        with Cluster(runtime_env_vars={"RLINF_COMM_NET_DEVICES": node_value}) as cluster:
            monkeypatch.setattr(cluster, "embedded", False)
            plan = _plan(
                cluster,
                {},
                ComponentRequest(
                    f"node-{node_value}", "0:0-1", cpus_per_worker=0.25, uses_gpus=False
                ),
            )
            if node_value == "nosuch0":
                with pytest.raises(Exception, match="RLINF_COMM_NET_DEVICES=nosuch0") as refused:
                    Probe.create_group().launch(cluster, plan.component(f"node-{node_value}"))
                assert f"its interfaces: {', '.join(local_interfaces())}" in str(refused.value)
                continue
            group = Probe.create_group().launch(cluster, plan.component(f"node-{node_value}"))
            reports = group.report().wait()
            results = group.gloo_all_reduce().wait()
        assert [(r["gloo"], r["nccl"]) for r in reports] == [(name, name)] * 2
        assert all(r["local_ips"] == [addresses[name]] for r in results), results


# ------------------------------------------------------------- an attached, two-node cluster

ATTACHED = r"""
import json, os, sys
import attrs
from rlshell.cluster.placement import ComponentRequest, plan_placement
from rlshell.cluster.ray_cluster import Cluster, ReservationError
from rlshell.cluster.worker import Worker
from rlshell.config.schema import NodeGroupEntry, NodeGroupEnvConfig

address, python = sys.argv[1:3]


class Where(Worker):
    def report(self):
        import ray
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "marker": os.environ.get("GROUP_TEST_MARKER"),
            "executable": sys.executable,
        }


def group(**env):
    return {"envs": NodeGroupEntry("pool=envs", env_configs=(NodeGroupEnvConfig(**env),))}


out = {}
with Cluster(address) as cluster:
    out["embedded"] = cluster.embedded
    out["node_ids"] = list(cluster.node_ids())
    good = cluster.spec(
        group(env_vars={"GROUP_TEST_MARKER": "envs"}, python_interpreter_path=python)
    )
    plan = plan_placement(good, [
        ComponentRequest("inside", "0", node_group="envs", cpus_per_worker=0.25,
                         uses_gpus=False),
        ComponentRequest("outside", "0", cpus_per_worker=0.25, uses_gpus=False),
    ])
    for name in ("inside", "outside"):
        out[name] = Where.create_group().launch(cluster, plan.component(name)).report().wait()[0]
    bad = cluster.spec(
        group(env_vars={"GLOO_SOCKET_IFNAME": "nosuch0"}, python_interpreter_path="/nowhere/python")
    )
    plan = plan_placement(bad, [
        ComponentRequest("refused", "0", node_group="envs", cpus_per_worker=0.25,
                         uses_gpus=False),
    ])
    try:
        Where.create_group().launch(cluster, plan.component("refused"))
    except ReservationError as error:
        out["refused"] = str(error)
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.xdist_group("multinode")
def test_an_attached_clusters_group_env_reaches_its_node_and_its_nodes_are_probed(
    two_nodes: Any,  # noqa: F811  (the fixture imported above)
    alternative_python: Path,
) -> None:
    """Two Ray nodes (`tests.shell.test_multinode.Nodes`): the group ``pool=envs`` (node 1)
    gives its worker the variable and the interpreter; a worker of the group "all" on node 0
    gets neither; a bad interface and interpreter are found by the probe pinned to node 1
    and refused before the component's worker starts."""
    import subprocess

    from tests.shell.test_run import ROOT, cli_env

    two_nodes.add(1)
    env = cli_env(two_nodes.temp_dir, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", ATTACHED, two_nodes.address, str(alternative_python)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["embedded"] is False
    assert out["node_ids"] == [two_nodes.node_id(0), two_nodes.node_id(1)]
    assert out["inside"] == {
        "node_id": two_nodes.node_id(1),
        "marker": "envs",
        "executable": str(alternative_python),
    }
    assert out["outside"]["node_id"] == two_nodes.node_id(0)
    assert out["outside"]["marker"] is None
    assert out["outside"]["executable"] != str(alternative_python)
    refused = out["refused"]
    assert refused.startswith("component 'refused' cannot start: node group 'envs': ")
    assert "GLOO_SOCKET_IFNAME=nosuch0: no network interface 'nosuch0' on node 1 (" in refused
    assert "python_interpreter_path: '/nowhere/python' does not exist on node 1 (" in refused
