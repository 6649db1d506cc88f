"""The reasoning actor's update in one process: PPO epochs over mini-batches against a fixed π_old.

An `ActorWorker` on one gloo rank (FSDP2 over one rank, as every actor rank
runs it) is checked against a plain-torch oracle built from the same seed:
the same Hugging Face model, torch's AdamW and gradient clipping, and rlcore's
PPO loss, stepped over the mini-batches `update_schedule` draws. The oracle
holds the maths the update must do; the worker is what the runner runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from attrs import evolve

from rlcore.losses import ppo_policy_loss
from rlcore.masked import aggregation_normalizer
from rlshell.config import Config
from rlshell.engines.rollout.hf import HFRolloutEngine
from rlshell.models import get_model
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.rollout.advantages import compute_advantages
from rlshell.runners.rules.reasoning import optimizer_steps_per_batch
from rlshell.runners.validation import load_config
from rlshell.tokenizer import load_tokenizer, prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.actor import ActorWorker
from rlshell.workers.common import NonFiniteLossError
from rlshell.workers.forward import policy_forward
from rlshell.workers.schedule import update_schedule

GRPO = Path("configs/grpo.py")
# Plain AdamW in both (the fused kernel rounds in another order); a lr large enough that a
# second epoch's ratios leave the clip range.
BASE = [
    "algorithm.group_size=4",
    "runner.prompts_per_step=4",
    "actor.optim.fused=false",
    "actor.optim.lr=0.01",
    "rollout.max_new_tokens=4",
    # The oracle's loss and rate: PPO's alone (no entropy bonus), constant; and the 2-layer
    # model whose seeded batch has responses of several lengths.
    "algorithm.entropy_coef=0",
    "actor.optim.lr_scheduler=constant",
    "actor.model.model_kwargs.num_hidden_layers=2",
    "actor.model.model_kwargs.intermediate_size=128",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return prepare_tokenizer(load_config(GRPO, BASE), tmp_path_factory.mktemp("run"))


def _config(tokenizer_dir: str, overrides: list[str]) -> Config:
    return with_tokenizer_ids(load_config(GRPO, [*BASE, *overrides]), tokenizer_dir)


def _batch(config: Config, tokenizer_dir: str) -> tuple[RolloutBatch, torch.Tensor]:
    torch.manual_seed(config.actor.seed)
    engine = HFRolloutEngine(
        get_model(config.actor.model), load_tokenizer(tokenizer_dir), torch.device("cpu")
    )
    prompts = ["1+2+3=", "4+4=", "9+9+9=", "7+0+1="]
    batch = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=4), seed=5)
    scores = torch.linspace(0.0, 1.0, batch.rows).roll(3)  # unequal within every group
    return batch, scores


def _worker(config: Config, tokenizer_dir: str) -> ActorWorker:
    worker = ActorWorker(
        config, total_steps=optimizer_steps_per_batch(config), rollout_in_actor=False
    )
    worker.rank, worker.world_size = 0, 1
    worker.init_worker(tokenizer_dir)
    return worker


def _updates(
    configs: list[Config], tokenizer_dir: str, batch: RolloutBatch, advantages: torch.Tensor
) -> list[tuple[torch.Tensor, dict[str, float], dict[str, torch.Tensor]]]:
    """π_old, the update's metrics and the weights after it, of a fresh worker per config."""
    results = []
    for config in configs:
        worker = _worker(config, tokenizer_dir)
        old = worker.compute_logprobs(batch)
        metrics = worker.run_training(batch, advantages, old_logprobs=old)
        results.append((old, metrics, worker.full_weights()))
    return results


def _oracle(
    config: Config, batch: RolloutBatch, advantages: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The update as plain torch does it: π_old once, then one AdamW step per mini-batch."""
    torch.manual_seed(config.actor.seed)
    model = get_model(config.actor.model)
    optim = config.actor.optim
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=optim.lr,
        betas=(optim.adam_beta1, optim.adam_beta2),
        eps=optim.adam_eps,
        weight_decay=optim.weight_decay,
    )
    temperature = config.rollout.temperature
    with torch.no_grad():
        old, _ = policy_forward(model, batch, temperature, None)
    for _, rows in update_schedule(config, batch.rows, batch.group_size, step=0):
        index = torch.as_tensor(rows)
        mini = batch.select(rows)
        logprobs, _ = policy_forward(model, mini, temperature, None)
        mask = mini.response_mask
        normalizer = aggregation_normalizer(mask, "token-mean")
        loss = ppo_policy_loss(
            logprobs, old[index], advantages[index], mask, normalizer=normalizer
        ).loss
        optimizer.zero_grad()
        loss.backward()
        assert optim.clip_grad is not None
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_grad)
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_epochs_over_mini_batches_step_once_per_mini_batch_against_the_first_log_probs(
    tokenizer_dir: str, process_group: None
) -> None:
    config = _config(tokenizer_dir, ["algorithm.ppo_epochs=2", "actor.mini_batch_size=2"])
    batch, scores = _batch(config, tokenizer_dir)
    advantages = compute_advantages(batch, scores, config).advantages
    schedule = update_schedule(config, batch.rows, batch.group_size, step=0)
    # 4 prompts × 4 samples in mini-batches of 2 prompts, twice: 4 steps of 8 whole-group rows.
    assert [len(rows) for _, rows in schedule] == [8, 8, 8, 8]
    assert [epoch for epoch, _ in schedule] == [0, 0, 1, 1]
    assert optimizer_steps_per_batch(config) == 4

    worker = _worker(config, tokenizer_dir)
    old = worker.compute_logprobs(batch)
    metrics = worker.run_training(batch, advantages, old_logprobs=old)
    assert metrics["train/optimizer_steps"] == 4
    # By the second epoch the policy has moved away from π_old: ratios leave the clip range.
    assert metrics["train/approx_kl_epoch1"] > 0
    assert metrics["train/clipfrac_epoch1"] > 0

    expected = _oracle(config, batch, advantages)
    weights = worker.full_weights()
    assert weights.keys() == expected.keys()
    torch.manual_seed(config.actor.seed)
    initial = dict(get_model(config.actor.model).named_parameters())
    # Four AdamW steps of lr 0.01 move each weight by up to 0.04; float32 rounding in another
    # order moves the two apart by at most ~3e-5 (Adam rescales near-zero gradients, such as
    # the key biases', to full steps). A wrong π_old or schedule moves them 1e-3 and more apart.
    for name, value in expected.items():
        assert float((value - initial[name]).detach().abs().max()) > 100 * 1e-4, name
        torch.testing.assert_close(weights[name], value, rtol=0, atol=1e-4, msg=name)

    # Several steps without π_old from before the first would drift: refused.
    with pytest.raises(ValueError, match="4 optimizer steps on one batch need π_old"):
        worker.run_training(batch, advantages)


def test_one_step_against_the_prepass_log_probs_is_the_fused_step(
    tokenizer_dir: str, process_group: None
) -> None:
    """π_old from `compute_logprobs` and π_old as the step's own detached forward are one
    and the same step (the runner skips the extra pass when there is one step per batch)."""
    config = _config(tokenizer_dir, [])
    batch, scores = _batch(config, tokenizer_dir)
    advantages = compute_advantages(batch, scores, config).advantages
    fused = _worker(config, tokenizer_dir)
    fused_metrics = fused.run_training(batch, advantages)
    fused_weights = fused.full_weights()
    prepass = _worker(evolve(config), tokenizer_dir)
    old = prepass.compute_logprobs(batch)
    # The pre-pass is the sampled batch's recompute: it matches the engine's log-probs.
    torch.testing.assert_close(old * batch.response_mask, batch.logprobs * batch.response_mask)
    metrics = prepass.run_training(batch, advantages, old_logprobs=old)
    assert metrics["train/optimizer_steps"] == fused_metrics["train/optimizer_steps"] == 1
    assert metrics["train/pg_loss"] == pytest.approx(fused_metrics["train/pg_loss"], abs=1e-6)
    for name, value in prepass.full_weights().items():
        torch.testing.assert_close(value, fused_weights[name], rtol=0, atol=1e-6, msg=name)


def test_the_critic_regresses_onto_the_returns_and_resumes_exactly(
    tokenizer_dir: str, process_group: None, tmp_path: Path
) -> None:
    """GAE from the critic's values; its updates move the values towards the returns; a
    checkpoint restores its weights and optimizer (a second update from both is the same)."""
    from rlshell.workers.critic import CriticWorker

    config = _config(
        tokenizer_dir, ["algorithm.adv_type=gae", "algorithm.ppo_epochs=2", "critic.optim.lr=0.001"]
    )
    batch, scores = _batch(config, tokenizer_dir)

    def critic() -> CriticWorker:
        worker = CriticWorker(config, total_steps=10)
        worker.rank, worker.world_size = 0, 1
        worker.init_worker()
        return worker

    worker = critic()
    values = worker.compute_values(batch)
    assert values.shape == batch.response_mask.shape
    assert torch.equal(values == 0, ~batch.response_mask | (values == 0))  # 0 at padding
    estimate = compute_advantages(batch, scores, config, values)
    mask = batch.response_mask

    def error(v: torch.Tensor) -> float:
        return float(((v - estimate.returns) ** 2)[mask].mean())

    metrics = worker.run_training(batch, estimate.returns, values)
    assert metrics["critic/vf_loss"] > 0
    assert error(worker.compute_values(batch)) < error(values)

    worker.save_checkpoint(str(tmp_path), step=1)
    fresh = critic()
    assert fresh.load_checkpoint(str(tmp_path)) == 1
    torch.testing.assert_close(fresh.compute_values(batch), worker.compute_values(batch))
    worker.run_training(batch, estimate.returns, values)
    fresh.run_training(batch, estimate.returns, values)
    assert torch.equal(fresh.compute_values(batch), worker.compute_values(batch))
    with pytest.raises(FileNotFoundError, match="has no critic/ folder"):
        fresh.load_checkpoint(str(tmp_path / "elsewhere"))


def test_the_packed_update_makes_the_padded_updates_steps(
    tokenizer_dir: str, process_group: None
) -> None:
    """``actor.pack_sequences``: π_old and every epoch's forward and backward run packed, and
    the weights after the update are the padded update's."""
    epochs = ["algorithm.ppo_epochs=2", "actor.mini_batch_size=2"]
    padded_config = _config(tokenizer_dir, [*epochs, "actor.share_prompt_forward=false"])
    packed_config = _config(tokenizer_dir, [*epochs, "actor.pack_sequences=true"])
    batch, scores = _batch(padded_config, tokenizer_dir)
    assert len(set(batch.response_lengths.tolist())) > 1
    advantages = compute_advantages(batch, scores, padded_config).advantages
    results = _updates([padded_config, packed_config], tokenizer_dir, batch, advantages)
    (padded_old, padded_metrics, padded), (packed_old, packed_metrics, packed) = results
    mask = batch.response_mask
    torch.testing.assert_close(packed_old * mask, padded_old * mask, rtol=0, atol=1e-5)
    assert packed_metrics["train/pg_loss"] == pytest.approx(
        padded_metrics["train/pg_loss"], abs=1e-5
    )
    torch.manual_seed(padded_config.actor.seed)
    initial = dict(get_model(padded_config.actor.model).named_parameters())
    # As against the oracle above: the steps move weights by 1e-2, rounding them by < 1e-4.
    for name, value in padded.items():
        assert float((value - initial[name]).detach().abs().max()) > 100 * 1e-4, name
        torch.testing.assert_close(packed[name], value, rtol=0, atol=1e-4, msg=name)


def test_micro_batches_narrower_than_the_batch_make_the_whole_batchs_step(
    tokenizer_dir: str, process_group: None
) -> None:
    """Micro-batches whose responses are all shorter than the batch's longest (their columns
    trimmed by `RolloutBatch.select`) take their advantages and π_old at their own width, and
    their accumulated gradients make the one-micro-batch step."""
    whole_config = _config(tokenizer_dir, ["algorithm.ppo_epochs=2"])
    batch, scores = _batch(whole_config, tokenizer_dir)
    # Every row is a micro-batch of its own: some are narrower than the batch.
    row_tokens = int((batch.prompt_mask.sum(1) + batch.response_mask.sum(1)).max())
    split_config = _config(
        tokenizer_dir, ["algorithm.ppo_epochs=2", f"actor.micro_batch_max_tokens={row_tokens}"]
    )
    width = batch.response_ids.shape[1]
    assert int(batch.response_lengths.min()) < width
    advantages = compute_advantages(batch, scores, whole_config).advantages
    results = _updates([whole_config, split_config], tokenizer_dir, batch, advantages)
    (_, whole_metrics, whole), (_, split_metrics, split) = results
    assert whole_metrics["train/micro_batches"] == 1
    assert split_metrics["train/micro_batches"] == batch.rows
    assert split_metrics["train/pg_loss"] == pytest.approx(whole_metrics["train/pg_loss"], abs=1e-5)
    # AdamW's step is lr·m̂/(√v̂ + ε): where a gradient is near 0, the order in which the micro-
    # batches' float sums accumulate decides up to a step of its own (lr = 3e-4 here); measured
    # 1.4e-4 on one machine. A micro-batch at the wrong width moves weights by far more.
    for name, value in whole.items():
        torch.testing.assert_close(split[name], value, rtol=0, atol=5e-4, msg=name)


def test_a_nan_gradient_with_a_finite_loss_skips_the_step_and_dumps_the_micro_batches(
    tokenizer_dir: str, process_group: None, tmp_path: Path
) -> None:
    """The logits' gradient made NaN (the loss stays finite): the optimizer skips the step,
    the error names the step and the rank, and this rank's micro-batches of the step are in
    ``<run dir>/nonfinite/step_1_rank_0_grad.pt``, the file the error names."""
    config = _config(
        tokenizer_dir, [f"runner.output_dir={tmp_path}", "actor.micro_batch_max_tokens=64"]
    )
    batch, scores = _batch(config, tokenizer_dir)
    advantages = compute_advantages(batch, scores, config).advantages
    worker = _worker(config, tokenizer_dir)
    before = worker.full_weights()

    def nan_gradient(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if module.training:
            output.logits.register_hook(lambda grad: grad * float("nan"))
        return output

    worker.model.register_forward_hook(nan_gradient)
    with pytest.raises(NonFiniteLossError) as caught:
        worker.run_training(batch, advantages)
    dump = tmp_path / config.runner.experiment_name / "nonfinite" / "step_1_rank_0_grad.pt"
    assert str(caught.value) == (
        "step 1: the gradient norm is nan on actor rank 0; the update was skipped. "
        f"Its batch is in {dump} (torch.load(path, weights_only=False))"
    )
    record = torch.load(dump, weights_only=False)
    assert (record["step"], record["rank"], math.isnan(record["grad_norm"])) == (1, 0, True)
    micro = record["micro_batches"]
    assert len(micro) > 1  # micro_batch_max_tokens split the batch
    rows = sum(m["batch"]["prompt_ids"].shape[0] for m in micro)
    assert rows == batch.rows
    assert all(m["advantages"].shape[0] == m["batch"]["prompt_ids"].shape[0] for m in micro)
    for name, value in worker.full_weights().items():
        assert torch.equal(value, before[name]), name
