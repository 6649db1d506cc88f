"""Weight sync on real workers: after every sync the rollout's weights equal the actor's.

Both modes (``bucket``, ``patch``) in both placements: collocated (the engine
inside each actor process, synced in memory) and disaggregated (a rollout
worker of its own, fed by actor rank 0 through the Ray object store).
"""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest
import torch

from rlshell.cluster.ray_cluster import Cluster
from rlshell.data import ArithmeticTask, arithmetic_task
from rlshell.runners.reasoning import ReasoningTrainer
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import load_config, plan_for

COLLOCATED = '{"actor,rollout": "0:0-1", "reward": "0"}'
DISAGGREGATED = '{"actor": "0:0-1", "rollout": "0:0", "reward": "0"}'
TINY = [
    "runner.prompts_per_step=4",
    "algorithm.group_size=4",
    "rollout.max_new_tokens=4",
    "rollout.bucket_size_mb=0.05",  # several buckets per sync
    # The entropy bonus has a gradient even when every group scored the same,
    # so every step changes the weights and every sync has something to send.
    "algorithm.entropy_coef=0.01",
]


def _assert_synced(trainer: ReasoningTrainer) -> dict[str, torch.Tensor]:
    actor: dict[str, torch.Tensor] = trainer.groups.actor.full_weights().wait()[0]
    for rank in range(trainer.groups.rollout.world_size):
        rollout = trainer.groups.rollout.execute_on(rank).rollout_weights().wait()[0]
        assert rollout.keys() == actor.keys()
        for name, tensor in actor.items():
            assert torch.equal(rollout[name], tensor), f"rollout rank {rank}: {name}"
    return actor


MEGATRON_TP2 = [
    "actor.backend=megatron",
    "actor.megatron.tensor_model_parallel_size=2",
    "actor.share_prompt_forward=false",
    "actor.fsdp_config.wrap_policy.min_num_params=0",
]
SYNC_CASES = [
    pytest.param(mode, placement, [], id=f"{name}-{mode}")
    for mode in ("bucket", "patch")
    for placement, name in ((COLLOCATED, "collocated"), (DISAGGREGATED, "disagg"))
]
# Megatron's tensor shards, gathered to HF names on the fly, into a patch sync (the bucket sync
# runs in tests/shell/test_megatron_run.py and the config-read run of configs/grpo_megatron.py).
SYNC_CASES.append(pytest.param("patch", COLLOCATED, MEGATRON_TP2, id="megatron_tp2-patch"))


@pytest.mark.parametrize(("mode", "placement", "backend"), SYNC_CASES)
def test_rollout_weights_equal_the_actors_after_every_sync(
    ray_cluster: Cluster, tmp_path: Path, mode: str, placement: str, backend: list[str]
) -> None:
    overrides = [*TINY, f"rollout.weight_sync={mode}", f"cluster.component_placement={placement}"]
    config = load_config(Path("configs/grpo.py"), [*overrides, *backend])
    plan = plan_for(config, ray_cluster.spec())
    spec = resolve_spec(config)
    assert spec.rollout_in_actor == (placement == COLLOCATED)
    prompts = arithmetic_task("train", ArithmeticTask.of(config.data))[:4]
    with closing(ReasoningTrainer.launch(spec, ray_cluster, plan, tmp_path)) as trainer:
        first = trainer.sync_weights(full=True)
        before = _assert_synced(trainer)
        for step in (1, 2):
            metrics = trainer.train_on(step, prompts)
            after = _assert_synced(trainer)
            assert any(not torch.equal(before[k], after[k]) for k in after), "nothing changed"
            before = after
        assert first["rollout/sync_bytes"] > 0
        if mode == "bucket":
            assert (
                metrics["rollout/sync_messages"] > 1
            )  # a 0.05 MB bucket is smaller than the model


def test_shared_engine_samples_and_trains_as_a_synced_copy_does(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    """``weight_sync=shared`` (generate with the FSDP module itself) changes nothing but cost.

    Two collocated runs, one with a synced copy (bucket) and one sharing the
    actor's module: the same seeds sample the same tokens with the same
    behaviour log-probs, and the updates give the same weights, step by step.
    """
    prompts = arithmetic_task("train", ArithmeticTask.of(load_config(Path("configs/grpo.py")).data))
    prompts = prompts[:4]
    runs: dict[str, list[dict[str, float]]] = {}
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for mode in ("bucket", "shared"):
        overrides = [
            # 'shared' sends no weights: it refuses a bucket size.
            *(o for o in TINY if mode != "shared" or not o.startswith("rollout.bucket_size_mb")),
            f"rollout.weight_sync={mode}",
            f"cluster.component_placement={COLLOCATED}",
        ]
        config = load_config(Path("configs/grpo.py"), overrides)
        plan = plan_for(config, ray_cluster.spec())
        spec = resolve_spec(config)
        with closing(ReasoningTrainer.launch(spec, ray_cluster, plan, tmp_path / mode)) as trainer:
            trainer.sync_weights(full=True)
            runs[mode] = [trainer.train_on(step, prompts) for step in (1, 2, 3)]
            weights[mode] = trainer.groups.actor.full_weights().wait()[0]
            if mode == "shared":
                # The engine reads the actor's own parameters: nothing to sync, nothing sent.
                assert runs[mode][-1]["rollout/sync_bytes"] == 0.0
    compared = ("reward/mean", "rollout/response_length", "train/pg_loss", "train/entropy")
    for bucket, shared in zip(runs["bucket"], runs["shared"], strict=True):
        for key in compared:
            assert shared[key] == pytest.approx(bucket[key], rel=1e-5, abs=1e-7), key
    for name, tensor in weights["bucket"].items():
        torch.testing.assert_close(weights["shared"][name], tensor, rtol=1e-5, atol=1e-6)
