"""Several Ray nodes on this machine (Ray's own multi-node test utility, `ray.cluster_utils`),
each with its own CPUs and labels: placements that span them, node groups by label, a plan
that needs more nodes than are alive, and a node that dies mid-run and comes back.

Each node is a raylet of its own, as on separate machines, so a worker's Ray node id says
where it runs; nodes here share one IP, so they are ranked by the ``rlstack/node-rank``
label (`rlshell.cluster.ray_cluster.NODE_RANK_LABEL`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlshell.checkpoint import list_checkpoints, verify_checkpoint
from rlshell.cluster.ray_cluster import NODE_RANK_LABEL, _loopback_only
from rlshell.metrics import read_metrics
from tests.shell.test_run import ROOT, cli_env, train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("multinode")]

cluster_utils = pytest.importorskip("ray.cluster_utils")


class Nodes:
    """A head node (rank 0, ``pool=learner``) and worker nodes added by `add`."""

    def __init__(self, temp_dir: Path) -> None:
        self.temp_dir = temp_dir
        # Nodes on loopback, as this process's own embedded cluster is (`_loopback_only`):
        # Ray here resolves its node address to 127.0.0.1, and every node, and the runs that
        # attach, must agree with it.
        self._restore = _loopback_only()
        self.cluster = cluster_utils.Cluster(
            initialize_head=True,
            head_node_args=self._args(0, "learner"),
        )
        self.by_rank: dict[int, Any] = {0: self.cluster.head_node}

    def _args(self, rank: int, pool: str) -> dict[str, Any]:
        return {
            "num_cpus": 2,
            "labels": {NODE_RANK_LABEL: str(rank), "pool": pool},
            "temp_dir": str(self.temp_dir),
            "include_dashboard": False,
        }

    def add(self, rank: int, pool: str = "envs") -> Any:
        self.by_rank[rank] = self.cluster.add_node(**self._args(rank, pool))
        return self.by_rank[rank]

    def kill(self, rank: int) -> None:
        """The node's raylet and every process of it SIGKILLed, as a machine that is lost."""
        self.cluster.remove_node(self.by_rank.pop(rank), allow_graceful=False)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def node_id(self, rank: int) -> str:
        return str(self.by_rank[rank].node_id)

    def shutdown(self) -> None:
        self.cluster.shutdown()
        self._restore()


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Nodes]:
    temp_dir = Path(tempfile.mkdtemp(prefix="rm", dir="/tmp"))  # Ray's socket paths stay short
    # ray.cluster_utils writes the head's address into the default Ray temp dir, and fails
    # where that folder was never made (no embedded Ray ran on this machine before): the
    # test's own folder serves, and /tmp/ray is left alone.
    monkeypatch.setenv("RAY_TMPDIR", str(temp_dir))
    (temp_dir / "ray").mkdir()
    started = Nodes(temp_dir)
    try:
        yield started
    finally:
        started.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _env() -> dict[str, str]:
    return cli_env(Path(tempfile.gettempdir()))


def test_a_placement_across_nodes_lands_each_worker_on_its_planned_node(
    nodes: Nodes, tmp_path: Path
) -> None:
    """The actor on node 0, the env workers on the node group ``pool=envs`` (node 1), in a
    probe of the embodied PPO run's hybrid placement: each worker reports, from inside its
    process, the Ray node it runs on, and it is the node its plan names."""
    nodes.add(1)
    common = [
        "configs/ppo_cartpole.py",
        f"cluster.address={nodes.address}",
        "cluster.num_nodes=2",
        'cluster.node_groups={"envs": "pool=envs"}',
        f"runner.output_dir={tmp_path}",
    ]
    placement = (
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", '
        '"env": {"placement": "0:0-1", "node_group": "envs"}}'
    )
    probe = train(
        *common, placement, "rollout.pipeline_stage_num=2", "runner.runner_type=probe",
        "runner.max_steps=2", env=_env(), timeout=300,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    assert "cluster: 2 CPU-only nodes" in probe.stdout
    report = json.loads((tmp_path / "ppo_cartpole" / "probe.json").read_text())
    assert report["nodes"] == [nodes.node_id(0), nodes.node_id(1)]
    landed = {
        name: [(r["env"]["NODE_RANK"], r["node_id"]) for r in reports]
        for name, reports in report["reports"].items()
    }
    assert landed["actor"] == [("0", nodes.node_id(0))]
    assert landed["rollout"] == [("0", nodes.node_id(0))]
    assert landed["env"] == [("1", nodes.node_id(1))] * 2

    # A plan that needs a third node waits for it, then names what is missing.
    waited = train(
        *common, "cluster.num_nodes=3", "cluster.startup_timeout_s=3", "runner.runner_type=probe",
        env=_env(),
    )  # fmt: skip
    assert waited.returncode == 1
    assert "cluster.num_nodes: expected 3 nodes, but the Ray cluster" in waited.stderr
    assert "has 2 after 3 s" in waited.stderr
    # A node group whose label no alive node has is named, with the labels there are.
    unlabelled = train(
        *common[:3], 'cluster.node_groups={"envs": "pool=gpu"}', common[4],
        "runner.runner_type=probe", env=_env(),
    )  # fmt: skip
    assert unlabelled.returncode == 2, unlabelled.stderr
    assert "node group 'envs': no alive node has label pool=gpu" in unlabelled.stderr
    assert "pool: envs, learner" in unlabelled.stderr


def test_a_reasoning_run_with_its_actor_and_rollout_on_two_nodes_trains_and_evaluates(
    nodes: Nodes, tmp_path: Path
) -> None:
    """GRPO (the quickstart, shortened) with its two actor ranks on node 0 and its rollout
    and reward workers on the node group ``pool=envs`` (node 1): every worker group checks,
    as it starts, that each worker reports from inside its process the Ray node its plan
    names; the weights go from node 0's actor to node 1's rollout each step, the run
    trains, evaluates and saves, and ``placement.json`` records the nodes."""
    nodes.add(1)
    result = train(
        "configs/grpo.py",
        f"cluster.address={nodes.address}",
        "cluster.num_nodes=2",
        'cluster.node_groups={"gen": "pool=envs"}',
        'cluster.component_placement={"actor": "0:0-1", '
        '"rollout": {"placement": "0:0", "node_group": "gen"}, '
        '"reward": {"placement": "0", "node_group": "gen"}}',
        "runner.max_steps=2",
        "runner.prompts_per_step=2",
        "algorithm.group_size=2",
        "rollout.max_new_tokens=4",
        "runner.eval_interval=2",
        "data.num_val=4",
        "checkpoint.interval=2",
        f"runner.output_dir={tmp_path}",
        env=_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = tmp_path / "grpo"
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in records if "time/step" in r] == [1, 2]
    assert "eval/accuracy" in records[-1]
    verify_checkpoint(run_dir / "checkpoints" / "global_step_2")
    plan = json.loads((run_dir / "placement.json").read_text())
    nodes_of = {
        component["name"]: sorted({w["node_rank"] for w in component["workers"]})
        for component in plan["components"]
    }
    assert nodes_of == {"actor": [0], "rollout": [1], "reward": [1]}


def test_a_node_lost_mid_run_is_named_and_resume_auto_continues_without_a_gap(
    nodes: Nodes, tmp_path: Path
) -> None:
    """The embodied PPO run (CartPole) in one process on node 1; node 1's raylet is killed
    after the checkpoint of step 4. The run stops naming node 1 and what ran there; the
    last checkpoint verifies; with node 1 back, ``resume=auto`` finishes and the metrics
    hold every step once."""
    nodes.add(1)
    args = [
        "configs/ppo_cartpole.py",
        f"cluster.address={nodes.address}",
        "cluster.num_nodes=2",
        'cluster.component_placement={"actor,rollout,env": "1:0"}',
        "runner.max_steps=400",
        "runner.rollout_steps=16",
        "algorithm.ppo_epochs=2",
        "checkpoint.interval=4",
        "checkpoint.keep_last=null",
        f"runner.output_dir={tmp_path}",
    ]
    run = subprocess.Popen(
        [sys.executable, "-m", "rlshell.train", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / "ppo_cartpole"
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "global_step_4").is_dir() and run.poll() is None:
        assert time.monotonic() < deadline, "the run made no checkpoint at step 4"
        time.sleep(0.05)
    nodes.kill(1)
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 1, stdout[-2000:] + stderr[-2000:]
    lost = nodes_lost_line(stderr)
    assert "node 1 (" in lost
    assert "left the Ray cluster" in lost
    assert "'actor,rollout,env' rank [0]" in lost or "'actor' rank [0]" in lost
    saved = list_checkpoints(run_dir)
    assert saved, "the checkpoints before the loss are kept"
    for _, path in saved:
        verify_checkpoint(path)
    last = saved[-1][0]

    nodes.add(1)
    resumed = train(
        *args[:4], "runner.max_steps=" + str(last + 4), *args[5:], "checkpoint.resume=auto",
        env=_env(), timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"resumed from {saved[-1][1]} (step {last})" in resumed.stdout
    steps = [int(r["step"]) for r in read_metrics(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, last + 5))


def nodes_lost_line(stderr: str) -> str:
    """The line of ``stderr`` that says a worker died."""
    return next((line for line in stderr.splitlines() if " died while " in line), stderr[-2000:])
