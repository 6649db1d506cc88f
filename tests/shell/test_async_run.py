"""``runner.mode='async'`` for real (`python -m rlshell.train configs/grpo_async.py`, Ray).

- With ``algorithm.max_staleness=0`` the asynchronous runner is the synchronous one, to the
  bit: the same metrics and the same final weights, on the same placement and seed; also
  with partial rollouts, whose weights, offered while a request generates, switch its rows'
  version between two tokens.
- A rollout worker killed mid-run (bound 1): the run stops naming it after saving its last
  complete step with the queue (the prompts of the rollouts lost with it); the resume samples
  them again first and trains every step once, on the prompts an uninterrupted run draws.
- Resumed from an earlier checkpoint, the run trains on the rollout saved with it and makes
  exactly the step it made before, to the same weights.
- An async checkpoint resumed by a synchronous run is refused before start.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import torch

from rlshell.checkpoint import QUEUE_FILE
from rlshell.cluster.ray_cluster import Cluster
from rlshell.export import load_policy
from rlshell.metrics import read_metrics
from rlshell.models import MODELS
from rlshell.rollout import SamplingParams
from rlshell.runners.reasoning import ReasoningTrainer
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import load_config, plan_for
from tests.shell import fault_ext
from tests.shell.test_run import ROOT, cli_env, train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("async_run")]

TINY = [
    "runner.prompts_per_step=4",
    "algorithm.group_size=4",
    "rollout.max_new_tokens=4",
    "data.num_val=16",
    "runner.eval_interval=2",
    "checkpoint.keep_last=null",
    "algorithm.entropy_coef=0.01",  # a gradient at every step, whatever the rewards
    "actor.optim.lr_scheduler=constant",  # a rate that does not depend on max_steps
    "actor.optim.lr=0.003",  # large enough that a stale batch differs from a fresh one
    'logger.backends=["jsonl"]',
]
# configs/grpo_async.py's placement and loss, for the synchronous run it is compared with.
DISAGGREGATED = [
    'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}',
    "actor.fsdp_config.wrap_policy.min_num_params=0",
    "algorithm.loss_type=decoupled_ppo",
    "algorithm.behavior_weight_cap=2.0",
]
# Wall-clock figures and the queue's timing differ between runs; nothing else may.
TIMING = ("time/", "perf/", "reward/seconds", "rollout/sync_seconds", "rollout/sync_engine")
ASYNC_TIMING = (
    "async/queue_ready",
    "async/wait_s",
    "async/rollout_busy_s",
    "async/rollout_idle_s",
    "async/generate",
    "async/update_",
)


def _deterministic(records: list[dict[str, float]]) -> list[dict[str, float]]:
    return [
        {k: v for k, v in r.items() if not k.startswith(TIMING + ASYNC_TIMING)} for r in records
    ]


@pytest.fixture(scope="module")
def ray_tmp() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="ra", dir="/tmp"))


def _three_steps(
    cluster: Cluster,
    run_dir: Path,
    path: str,
    *overrides: str,
    then: Callable[[ReasoningTrainer], None] | None = None,
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """Three steps of a trainer launched on ``cluster``: their metrics and the final weights
    (``then``: called with the trainer after them)."""
    config = load_config(Path(path), [*TINY, *overrides])
    plan = plan_for(config, cluster.spec())
    with closing(ReasoningTrainer.launch(resolve_spec(config), cluster, plan, run_dir)) as trainer:
        records = [trainer.step(step) for step in (1, 2, 3)]
        assert trainer.actor is not None
        weights = trainer.actor.full_weights().wait()[0]
        if then is not None:
            then(trainer)
    return _deterministic(records), weights


@pytest.fixture(scope="module")
def synchronous(
    ray_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    """The synchronous runner's three steps on configs/grpo_async.py's placement and loss."""
    run_dir = tmp_path_factory.mktemp("sync")
    return _three_steps(ray_cluster, run_dir, "configs/grpo.py", *DISAGGREGATED)


def _same_as_synchronous(
    asynchronous: list[dict[str, float]],
    weights: dict[str, torch.Tensor],
    synchronous: tuple[list[dict[str, float]], dict[str, torch.Tensor]],
) -> None:
    sync, reference = synchronous
    for mine, theirs in zip(asynchronous, sync, strict=True):
        # The async run's own metrics: every batch sampled by the weights it trains.
        assert mine.pop("async/staleness_max") == 0.0
        assert mine.pop("async/rows_frac_lag0") == 1.0
        assert {k: v for k, v in mine.items() if not k.startswith("async/")} == theirs
    assert weights.keys() == reference.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, reference[name]), name


def test_a_bound_of_0_is_the_synchronous_run_to_the_bit(
    ray_cluster: Cluster,
    tmp_path: Path,
    synchronous: tuple[list[dict[str, float]], dict[str, torch.Tensor]],
) -> None:
    asynchronous, weights = _three_steps(
        ray_cluster, tmp_path, "configs/grpo_async.py", "algorithm.max_staleness=0"
    )
    _same_as_synchronous(asynchronous, weights, synchronous)


def test_partial_rollouts_switch_weights_mid_request_and_at_bound_0_are_the_synchronous_run(
    ray_cluster: Cluster,
    tmp_path: Path,
    synchronous: tuple[list[dict[str, float]], dict[str, torch.Tensor]],
) -> None:
    """With ``rollout.partial_rollouts`` the weights are offered beside the requests (the
    workers' control thread) instead of queued behind them. At bound 0 nothing is in flight
    when they arrive: the synchronous run, to the bit. Then a long request (every response
    made to run 200 tokens) is given new weights while it generates: its rows switch version
    between two tokens, every row at the same token."""
    seen: dict[str, Any] = {}

    def interrupt(trainer: ReasoningTrainer) -> None:
        params = SamplingParams(n=2, max_new_tokens=200, min_new_tokens=200)
        for pause in (0.3, 0.15, 0.05):  # the offer must land while the request generates
            ticket = trainer.running.generator.submit(
                ["1+1=", "2+3="], params, 9, 0, "generate_versioned"
            )
            time.sleep(pause)
            trainer.version += 1  # as after an update: the same weights, a new version
            trainer.sync_weights(full=False)
            (result,) = ticket.wait()
            if result.syncs:
                break
        seen.update(result=result, version=trainer.version)

    asynchronous, weights = _three_steps(
        ray_cluster,
        tmp_path,
        "configs/grpo_async.py",
        "algorithm.max_staleness=0",
        "rollout.partial_rollouts=true",
        then=interrupt,
    )
    for record in asynchronous:
        assert record.pop("async/syncs_mid_generation") == 0.0
        assert record.pop("async/requests_interrupted_frac") == 0.0
        assert record.pop("async/tokens_frac_lag0") == 1.0
    _same_as_synchronous(asynchronous, weights, synchronous)

    result, version = seen["result"], seen["version"]
    assert len(result.syncs) == 1, "the offer never landed while the request generated"
    assert result.syncs[0]["applied_bytes"] > 0
    tags = result.token_versions
    assert result.version == version - 1
    assert tags.shape == (4, 200)
    assert bool(result.batch.response_mask.all())
    switch = int((tags == version - 1).sum(dim=1)[0])
    assert 0 < switch < 200
    assert torch.all(tags[:, :switch] == version - 1)
    assert torch.all(tags[:, switch:] == version)


def test_a_rollout_worker_killed_mid_run_loses_no_step_and_a_resume_repeats_none(
    tmp_path: Path, ray_tmp: Path
) -> None:
    marker = tmp_path / "killed"
    env = cli_env(
        ray_tmp,
        RLSHELL_EXT_MODULE="fault_ext",
        PYTHONPATH=os.pathsep.join(
            [str(ROOT / "tests" / "shell"), os.environ.get("PYTHONPATH", "")]
        ),
    )
    args = [
        "configs/grpo_async.py",
        "actor.model.model_type=faulty_lm",
        *TINY,
        "runner.eval_interval=0",
        "checkpoint.interval=2",
        # The fault (tests/shell/fault_ext.py), for the workers that read it. The 4th
        # generation is step 4's rollout (no evaluation): queued at the start of step 3, it
        # dies while step 3 trains, and step 4 finds it dead.
        "cluster.worker_env_vars.RLSHELL_TEST_FAULT=kill_rollout",
        "cluster.worker_env_vars.RLSHELL_TEST_FAULT_AT=4",
        f"cluster.worker_env_vars.RLSHELL_TEST_FAULT_MARKER={marker}",
    ]
    run_dir = tmp_path / "crash" / "grpo_async"
    crashed = train(
        *args, "runner.max_steps=6", f"runner.output_dir={run_dir.parent}", env=env, timeout=400
    )
    assert crashed.returncode == 1, crashed.stdout[-2000:] + crashed.stderr[-2000:]
    assert marker.is_file()
    assert "component 'rollout' rank 0" in crashed.stderr
    saved = run_dir / "checkpoints" / "global_step_3"
    assert f"saved a checkpoint of step 3, its last complete step ({saved})" in crashed.stderr
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3]
    # Steps 1 and 2 were sampled by version 0 (queued before any update): step 1's batch by
    # the weights it trained, the others one update behind.
    assert [r["async/staleness_max"] for r in records] == [0.0, 1.0, 1.0]
    # Step 4's rollout, and step 5's if step 4 had queued it before finding the worker dead:
    # lost with the worker, their prompts kept, to be sampled again.
    lost = torch.load(saved / QUEUE_FILE, weights_only=False)
    assert [slot.step for slot in lost] in ([4], [4, 5])
    assert all(slot.results is None and len(slot.prompts) == 4 for slot in lost)
    # The checkpoint of step 2 holds step 3's rollout, generated by version 1 while step 2
    # trained.
    second = run_dir / "checkpoints" / "global_step_2"
    (queued,) = torch.load(second / QUEUE_FILE, weights_only=False)
    assert (queued.step, [result.version for result in queued.results]) == (3, [1])

    # Resumed from step 2's checkpoint, step 3 trains on that saved rollout: exactly the step
    # 3 the run made, to the same weights.
    part = tmp_path / "part" / "grpo_async"
    shutil.copytree(second, part / "checkpoints" / "global_step_2")
    kept = (run_dir / "metrics.jsonl").read_text().splitlines()[:2]
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
    fault_ext.register()  # the runs' model type, to rebuild their checkpoints here
    try:
        mine = load_policy(part / "checkpoints" / "global_step_3").model.state_dict()
        theirs = load_policy(saved).model.state_dict()
    finally:
        MODELS.unregister("faulty_lm")
    assert all(torch.equal(mine[name], theirs[name]) for name in theirs)

    # The crashed run resumed: step 4's prompts sampled again first, then on to step 6.
    resumed = train(
        *args,
        "runner.max_steps=6",
        f"runner.output_dir={run_dir.parent}",
        "checkpoint.resume=auto",
        env=env,
        timeout=400,
    )
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[3]["async/staleness_max"] == 0.0  # step 4 sampled again, by version 3
    # Prompts drawn for steps 1-7 (one ahead of 6), no more: step 4's were not drawn twice.
    state = json.loads(
        (run_dir / "checkpoints" / "global_step_6" / "trainer_state.json").read_text()
    )
    assert (state["sampler_epoch"], state["sampler_position"]) == (0, 7 * 4)

    # An async checkpoint in a synchronous run: refused before start, or step 3's rollout
    # would be skipped.
    refused = train(
        "configs/grpo.py",
        *TINY,
        *DISAGGREGATED,
        "runner.max_steps=4",
        f"runner.output_dir={tmp_path / 'sync'}",
        f"checkpoint.resume={second}",
        env=cli_env(ray_tmp),
        timeout=400,
    )
    assert refused.returncode != 0
    assert f"checkpoint.resume: {second} holds rollouts generated ahead by a " in refused.stderr
    assert "workers up" not in refused.stdout
