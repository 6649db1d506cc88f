"""Multi-turn, tool-using runs for real (``agent.tools``, Ray, the tool sandbox).

configs/grpo_async.py with the calculator: the rollout worker runs whole trajectories
(turns, tool calls in its sandbox processes, observations) one step ahead of the update,
so the checkpoint of step 2 holds step 3's multi-turn batch, generated but not trained.
Resumed from that checkpoint, the run trains on the saved trajectories and makes exactly
the step 3 the uninterrupted run made: the same metrics, the same weights. Along the way
the ``agent/`` and ``tools/`` metrics are logged at every step and evaluation.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rlshell.checkpoint import QUEUE_FILE
from rlshell.export import load_policy
from rlshell.metrics import read_metrics
from tests.shell.test_async_run import _deterministic
from tests.shell.test_run import cli_env, ray_tmpdir, train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("agent_run")]

__all__ = ["ray_tmpdir"]  # the fixture, used here

ARGS = [
    "configs/grpo_async.py",
    'agent.tools=["calculator"]',
    "agent.default_tool=calculator",
    "agent.tool_error_reward=-0.1",
    "data.operator=*",
    "data.num_terms=2",
    "data.max_operand=99",
    "data.num_val=8",
    "runner.prompts_per_step=4",
    "algorithm.group_size=4",
    "rollout.max_new_tokens=8",
    "runner.eval_interval=2",
    "checkpoint.interval=2",
    "checkpoint.keep_last=null",
    "algorithm.entropy_coef=0.01",
    "actor.optim.lr_scheduler=constant",
    "actor.optim.lr=0.003",
    'logger.backends=["jsonl"]',
]


def test_a_run_resumed_between_generating_and_training_a_multi_turn_batch_repeats_its_step(
    tmp_path: Path, ray_tmpdir: Path
) -> None:
    env = cli_env(ray_tmpdir)
    run_dir = tmp_path / "full" / "grpo_async"
    full = train(
        *ARGS, "runner.max_steps=3", f"runner.output_dir={run_dir.parent}", env=env, timeout=400
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
    part = tmp_path / "part" / "grpo_async"
    shutil.copytree(second, part / "checkpoints" / "global_step_2")
    kept = (run_dir / "metrics.jsonl").read_text().splitlines()[:3]  # steps 0 to 2
    (part / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    again = train(
        *ARGS,
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
