"""The SFT → RL recipe of docs/agents.md for real: configs/sft_tool_calls.py, then
configs/grpo_tool_agent.py from its checkpoint (Ray, the tool sandbox), briefly.

The RL run is made asynchronous (its rollout in a worker of its own, one step ahead), so the
checkpoint of step 2 holds step 3's multi-turn batch, generated but not trained. Resumed
from that checkpoint, the run trains on the saved trajectories and makes exactly the step 3
the uninterrupted run made: the same metrics, the same weights. Along the way the ``agent/``
and ``tools/`` metrics are logged at every step and evaluation. (Four SFT steps teach the
format little; docs/agents.md has the full runs' figures.)
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from rlshell.checkpoint import QUEUE_FILE
from rlshell.export import load_policy
from rlshell.metrics import read_metrics
from tests import launcher
from tests.shell.test_async_run import _deterministic
from tests.shell.test_run import cli_env, ray_tmpdir, train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("agent_run")]

__all__ = ["ray_tmpdir"]  # the fixture, used here

SFT = [
    "configs/sft_tool_calls.py",
    "runner.max_steps=4",
    "runner.eval_interval=0",
    "checkpoint.interval=4",
    'logger.backends=["jsonl"]',
]
AGENT = [
    "configs/grpo_tool_agent.py",
    # Asynchronous: the rollout in a worker of its own, one step ahead of the update.
    'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}',
    "runner.mode=async",
    "algorithm.max_staleness=1",
    "algorithm.loss_type=decoupled_ppo",
    "algorithm.behavior_weight_cap=2.0",
    "actor.fsdp_config.wrap_policy.min_num_params=0",
    "agent.tool_error_reward=-0.1",
    "data.num_val=8",
    "runner.prompts_per_step=4",
    "algorithm.group_size=4",
    "runner.eval_interval=2",
    "checkpoint.interval=2",
    "checkpoint.keep_last=null",
    "algorithm.entropy_coef=0.01",
    "actor.optim.lr=0.003",
    'logger.backends=["jsonl"]',
]


def test_sft_then_rl_with_tools_resumed_mid_multi_turn_batch_repeats_its_step(
    tmp_path: Path, ray_tmpdir: Path
) -> None:
    env = cli_env(ray_tmpdir)
    sft = train(*SFT, f"runner.output_dir={tmp_path / 'sft'}", env=env, timeout=400)
    assert sft.returncode == 0, sft.stdout[-3000:] + sft.stderr[-3000:]
    warm_start = tmp_path / "sft" / "sft_tool_calls" / "checkpoints" / "global_step_4"
    args = [*AGENT, f"actor.model.checkpoint={warm_start}"]
    run_dir = tmp_path / "full" / "grpo_tool_agent"
    full = train(
        *args, "runner.max_steps=3", f"runner.output_dir={run_dir.parent}", env=env, timeout=400
    )
    assert full.returncode == 0, full.stdout[-3000:] + full.stderr[-3000:]
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [0, 1, 2, 3]  # 0: the evaluation before step 1
    assert records[0]["eval/tool_calls_per_response"] >= 0.0
    assert "eval/tool_calls_per_response" in records[2]
    for record in records[1:]:
        assert record["agent/turns_mean"] >= 1.0
        assert record["tools/calls"] == pytest.approx(record["agent/tool_calls_per_response"] * 16)
    assert sum(r["tools/calls"] for r in records[1:]) > 0, "no tool call in 48 trajectories"

    # Step 2's checkpoint holds step 3's multi-turn batch: sampled, not trained.
    second = run_dir / "checkpoints" / "global_step_2"
    (queued,) = torch.load(second / QUEUE_FILE, weights_only=False)
    assert queued.step == 3
    (result,) = queued.results
    batch = result.batch
    assert batch.loss_mask is not None
    assert "turns" in batch.row_stats
    assert bool((batch.loss_mask <= batch.response_mask).all())

    # Resumed there, step 3 trains on those trajectories: the step the run made.
    part = tmp_path / "part" / "grpo_tool_agent"
    shutil.copytree(second, part / "checkpoints" / "global_step_2")
    kept = (run_dir / "metrics.jsonl").read_text().splitlines()[:3]  # steps 0 to 2
    (part / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    again = train(
        *args,
        "runner.max_steps=3",
        f"runner.output_dir={part.parent}",
        "checkpoint.resume=auto",
        env=env,
        timeout=400,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert _deterministic(read_metrics(part / "metrics.jsonl")) == _deterministic(records)
    mine = load_policy(part / "checkpoints" / "global_step_3").model.state_dict()
    theirs = load_policy(run_dir / "checkpoints" / "global_step_3").model.state_dict()
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)

    # The final checkpoint evaluated with its tools, then without them (--no-tools): one
    # turn as long as a whole trajectory, the model alone.
    final = str(run_dir / "checkpoints" / "global_step_3")
    for extra in ([], ["--no-tools"]):
        shown = launcher.run(
            [sys.executable, "-m", "rlshell.evaluate", final, "--limit", "4", *extra],
            env=env,
            timeout=300,
        )
        assert shown.returncode == 0, shown.stderr[-3000:]
        report = json.loads(shown.stdout.strip().splitlines()[-1])
        assert report["eval/examples"] == 4.0
        assert ("eval/tool_calls_per_response" in report) == (not extra)
