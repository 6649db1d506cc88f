"""The reasoning runner's parts in one process: batches, advantages, FSDP manager, checkpoints."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from attrs import evolve
from hypothesis import given
from hypothesis import strategies as st

from rlcore.advantages import group_normalized
from rlcore.masked import masked_whiten
from rlshell.checkpoint import (
    CheckpointError,
    TrainerState,
    clean_partials,
    commit,
    list_checkpoints,
    prune,
    resolve_resume,
    staging_dir,
    write_manifest,
    write_trainer_state,
)
from rlshell.config import Config, ConfigError, OptimConfig, WrapPolicyConfig
from rlshell.engines.rollout.hf import HFRolloutEngine
from rlshell.engines.training.fsdp import FSDPModelManager, build_lr_lambda, wrap_units
from rlshell.models import get_model
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.rollout.advantages import compute_advantages
from rlshell.runners.reasoning.generation import interleave_order
from rlshell.runners.validation import load_config
from rlshell.tokenizer import prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.forward import old_logprobs_and_weights, policy_forward

GRPO = Path("configs/grpo.py")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, Path]:
    run_dir = tmp_path_factory.mktemp("run")
    base = load_config(GRPO, ["rollout.max_new_tokens=6"])
    tokenizer_dir = prepare_tokenizer(base, run_dir)
    return with_tokenizer_ids(base, tokenizer_dir), tokenizer_dir


@pytest.fixture(scope="module")
def engine(config: tuple[Config, Path]) -> HFRolloutEngine:
    from rlshell.tokenizer import load_tokenizer

    cfg, tokenizer_dir = config
    torch.manual_seed(0)
    return HFRolloutEngine(
        get_model(cfg.actor.model), load_tokenizer(tokenizer_dir), torch.device("cpu")
    )


# -- rollout


def test_behaviour_logprobs_equal_a_forward_recompute(engine: HFRolloutEngine) -> None:
    params = SamplingParams(n=3, temperature=0.7, max_new_tokens=6)
    batch = engine.generate(["1+2=", "13+40=", "7+7="], params, seed=5)
    assert batch.rows == 9
    assert batch.group_size == 3
    logprobs, entropy = policy_forward(engine.model, batch, temperature=0.7, chunk_size=4)
    mask = batch.response_mask
    torch.testing.assert_close(logprobs[mask], batch.logprobs[mask], atol=1e-5, rtol=0)
    assert torch.all(entropy[mask] > 0)


def test_the_shared_prompt_forward_gives_the_full_forwards_logprobs_and_gradients(
    config: tuple[Config, Path],
) -> None:
    # Prompts of different lengths (left padding), repeated in groups, with early EOS.
    from rlshell.tokenizer import load_tokenizer

    cfg, tokenizer_dir = config
    torch.manual_seed(1)
    model = get_model(cfg.actor.model)
    engine = HFRolloutEngine(model, load_tokenizer(tokenizer_dir), torch.device("cpu"))
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6)
    batch = engine.generate(["1+2=", "13+40+7=", "7+7=", "5="], params, seed=3)
    batch = batch.select([0, 4, 1, 5, 2, 8, 9, 10, 11])  # groups interleaved and cut
    assert len(set(batch.prompt_mask.sum(1).tolist())) > 1
    for param in model.parameters():
        param.requires_grad_(True)
    results = []
    for share in (False, True):
        model.zero_grad()
        logprobs, entropy = policy_forward(model, batch, 0.8, None, share_prompts=share)
        (logprobs * batch.response_mask).sum().backward()
        grads = [param.grad.clone() for param in model.parameters() if param.grad is not None]
        results.append((logprobs.detach(), entropy.detach(), grads))
    mask = batch.response_mask
    (full_lp, full_h, full_g), (shared_lp, shared_h, shared_g) = results
    torch.testing.assert_close(shared_lp[mask], full_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared_h[mask], full_h[mask], atol=1e-5, rtol=0)
    assert len(shared_g) == len(full_g) > 0
    for shared, full in zip(shared_g, full_g, strict=True):
        torch.testing.assert_close(shared, full, atol=1e-5, rtol=1e-4)


def test_sampling_is_reproducible_from_its_seed_and_leaves_the_global_rng_alone(
    engine: HFRolloutEngine,
) -> None:
    params = SamplingParams(n=4, max_new_tokens=6)
    state = torch.get_rng_state()
    first = engine.generate(["3+4="], params, seed=11)
    assert torch.equal(torch.get_rng_state(), state)
    again = engine.generate(["3+4="], params, seed=11)
    assert torch.equal(first.response_ids, again.response_ids)
    assert first.response_texts == again.response_texts


def test_the_response_mask_ends_at_the_first_eos_and_texts_drop_it(
    engine: HFRolloutEngine,
) -> None:
    batch = engine.generate(["1+1=", "2+2="], SamplingParams(n=8, max_new_tokens=6), seed=3)
    for row, mask, text in zip(
        batch.response_ids, batch.response_mask, batch.response_texts, strict=True
    ):
        eos = (row == engine.eos_id).nonzero()
        valid = int(mask.sum())
        assert valid == (int(eos[0]) + 1 if eos.numel() else row.numel())
        assert len(text) <= valid


def test_greedy_decoding_is_deterministic(engine: HFRolloutEngine) -> None:
    params = SamplingParams(n=1, max_new_tokens=6, greedy=True)
    a = engine.generate(["12+3="], params, seed=1)
    b = engine.generate(["12+3="], params, seed=2)
    assert torch.equal(a.response_ids, b.response_ids)


def _batch(prompt_lengths: list[int], response_lengths: list[int], group: int = 1) -> RolloutBatch:
    rows = len(prompt_lengths)
    width, span = max(prompt_lengths), max(response_lengths)
    prompt_mask = torch.tensor([[i >= width - n for i in range(width)] for n in prompt_lengths])
    response_mask = torch.tensor([[i < n for i in range(span)] for n in response_lengths])
    return RolloutBatch(
        prompt_ids=torch.arange(rows * width).view(rows, width) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=(torch.arange(rows * span).view(rows, span) + 1) * response_mask,
        response_mask=response_mask,
        logprobs=-torch.rand(rows, span) * response_mask,
        response_texts=tuple(str(i) for i in range(rows)),
        group_size=group,
    )


@given(
    st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=6),
    st.integers(1, 3),
)
def test_concat_then_select_gives_back_each_part(rows: list[tuple[int, int]], cut: int) -> None:
    cut = min(cut, len(rows))
    a = _batch([p for p, _ in rows[:cut]], [r for _, r in rows[:cut]])
    if cut == len(rows):
        parts = [a]
    else:
        parts = [a, _batch([p for p, _ in rows[cut:]], [r for _, r in rows[cut:]])]
    merged = RolloutBatch.concat(parts, pad_id=0)
    assert merged.rows == len(rows)
    assert merged.num_tokens == sum(p.num_tokens for p in parts)
    back = merged.select(range(cut))
    assert torch.equal(back.prompt_ids, a.prompt_ids)
    assert torch.equal(back.response_mask, a.response_mask)
    assert torch.equal(back.logprobs, a.logprobs)
    assert back.response_texts == a.response_texts


def test_select_keeps_whole_groups_only_when_asked() -> None:
    batch = _batch([2, 3, 1, 2], [1, 2, 2, 1])
    assert batch.select([0, 1]).group_size == 1
    regrouped = batch.select([2, 3, 0, 1], group_size=2)
    assert regrouped.group_size == 2
    assert regrouped.response_texts == tuple(batch.response_texts[i] for i in (2, 3, 0, 1))
    with pytest.raises(ValueError, match="3 rows do not make groups of 2"):
        batch.select([0, 1, 2], group_size=2)


def test_a_batch_with_mismatched_shapes_is_refused() -> None:
    good = _batch([2, 3], [1, 2])
    with pytest.raises(ValueError, match=r"RolloutBatch\.logprobs has shape"):
        RolloutBatch(
            good.prompt_ids,
            good.prompt_mask,
            good.response_ids,
            good.response_mask,
            good.logprobs[:, :1],
            good.response_texts,
        )


@given(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.integers(1, 3))
def test_interleave_order_undoes_a_round_robin_split(counts: list[int], n: int) -> None:
    # Prompt p went to rank p % R (only ranks with prompts answer, in rank order).
    total = sum(counts)
    ranks = len(counts)
    counts = [len(range(rank, total, ranks)) for rank in range(ranks)]
    rows = [p for rank in range(ranks) for p in range(rank, total, ranks) for _ in range(n)]
    busy = [c for c in counts if c]
    order = interleave_order(busy, n)
    assert [rows[i] for i in order] == [p for p in range(total) for _ in range(n)]


# -- advantages


def test_grpo_advantages_are_rlcores_group_normalised_scores_on_every_token(
    config: tuple[Config, Path],
) -> None:
    cfg, _ = config
    batch = _batch([2] * 8, [1, 2, 3, 4, 4, 3, 2, 1], group=4)
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    advantages = compute_advantages(batch, scores, cfg).advantages
    expected = group_normalized(scores.view(2, 4)).reshape(-1)
    for row in range(8):
        valid = batch.response_mask[row]
        assert torch.allclose(advantages[row][valid], expected[row].expand(int(valid.sum())))
        assert torch.all(advantages[row][~valid] == 0)


def test_reinforce_pp_baselines_form_reaches_the_estimator(config: tuple[Config, Path]) -> None:
    """``algorithm.baseline_form='score'`` gives verl's form: the row's score minus its group's
    mean, the same on every token, whitened over the batch's tokens. With the score on the
    last token it equals the reward-to-go form at γ = 1, so the key's arrival is shown by the
    form's refusal of a γ it would not use (validation refuses the pair before a run)."""
    cfg, _ = config
    batch = _batch([2] * 4, [1, 2, 3, 2], group=2)
    scores = torch.tensor([0.0, 0.0, 1.0, 0.0])
    score_form = evolve(cfg.algorithm, adv_type="reinforce_pp_baseline", baseline_form="score")
    advantages = compute_advantages(batch, scores, evolve(cfg, algorithm=score_form)).advantages
    mask = batch.response_mask
    centred = torch.where(mask, (scores - torch.tensor([0.0, 0.0, 0.5, 0.5])).unsqueeze(-1), 0.0)
    torch.testing.assert_close(advantages, masked_whiten(centred, mask))
    discounted = evolve(cfg, algorithm=evolve(score_form, gamma=0.5))
    with pytest.raises(ValueError, match="baseline_form='score' centres the undiscounted score"):
        compute_advantages(batch, scores, discounted)
    to_go = evolve(
        discounted, algorithm=evolve(score_form, gamma=0.5, baseline_form="reward_to_go")
    )
    # γ = 0.5 discounts row 2's reward-to-go over its three tokens: not constant on the row.
    assert len(set(compute_advantages(batch, scores, to_go).advantages[2][mask[2]].tolist())) == 3


# -- schedule and wrapping


@given(
    st.sampled_from(["constant", "linear", "cosine"]),
    st.integers(0, 10),
    st.floats(0, 1),
    st.integers(1, 50),
)
def test_the_lr_multiplier_warms_up_then_stays_within_its_bounds(
    kind: str, warmup: int, floor: float, total: int
) -> None:
    optim = OptimConfig(lr_scheduler=kind, lr_warmup_steps=warmup, min_lr_ratio=floor)  # type: ignore[arg-type]
    multiplier = build_lr_lambda(optim, total)
    values = [multiplier(step) for step in range(total + warmup + 2)]
    for step in range(warmup):
        assert values[step] == pytest.approx((step + 1) / warmup)
    after = values[warmup:]
    assert all(min(floor, 1.0) - 1e-12 <= v <= 1.0 + 1e-12 for v in after)
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(after))
    if kind == "constant":
        assert all(v == 1.0 for v in after)


def test_wrap_units_follow_the_policy_then_the_models_no_split_modules(
    config: tuple[Config, Path],
) -> None:
    cfg, _ = config
    model = get_model(cfg.actor.model)
    layers = int(cfg.actor.model.model_kwargs["num_hidden_layers"])
    default = wrap_units(model, WrapPolicyConfig())
    assert [type(m).__name__ for m in default] == ["Qwen2DecoderLayer"] * layers
    by_class = wrap_units(model, WrapPolicyConfig(module_classes_to_wrap=("Qwen2MLP",)))
    assert [type(m).__name__ for m in by_class] == ["Qwen2MLP"] * layers
    model.model.norm._fsdp_wrap_name = "final_norm"  # type: ignore[union-attr]
    named = wrap_units(model, WrapPolicyConfig(no_split_names=("final_norm",)))
    assert named == [model.model.norm]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="no module of Qwen2ForCausalLM matches"):
        wrap_units(model, WrapPolicyConfig(transformer_layer_cls_to_wrap=("LlamaDecoderLayer",)))
    layer = sum(p.numel() for p in default[0].parameters())
    assert wrap_units(model, WrapPolicyConfig(min_num_params=layer)) == default
    assert wrap_units(model, WrapPolicyConfig(min_num_params=layer + 1)) == []  # the root only


def test_a_vocabulary_smaller_than_the_tokenizer_is_a_config_error(
    config: tuple[Config, Path],
) -> None:
    cfg, tokenizer_dir = config
    kwargs = {**cfg.actor.model.model_kwargs, "vocab_size": 4}
    small = evolve(cfg, actor=evolve(cfg.actor, model=evolve(cfg.actor.model, model_kwargs=kwargs)))
    with pytest.raises(ConfigError, match="vocab_size: 4 is smaller than the tokenizer's"):
        with_tokenizer_ids(small, tokenizer_dir)


# -- the FSDP manager on one gloo rank


def _train_once(manager: FSDPModelManager) -> tuple[float, list[float]]:
    ids = torch.randint(0, 10, (2, 5))
    logits = manager.module(input_ids=ids).logits
    manager.before_micro_batch(manager.module, is_last=True)
    logits.float().square().mean().backward()
    return manager.optimizer_step()


def test_the_fsdp_manager_trains_saves_and_reloads_exactly(
    config: tuple[Config, Path], process_group: None, tmp_path: Path
) -> None:
    cfg, _ = config
    actor = evolve(cfg.actor, optim=evolve(cfg.actor.optim, lr_scheduler="linear"))
    manager = FSDPModelManager(actor, total_steps=4, device=torch.device("cpu"))
    manager.setup_model_and_optimizer()
    grad_norm, lrs = _train_once(manager)
    assert grad_norm > 0
    assert lrs == [actor.optim.lr]
    manager.save_checkpoint(tmp_path / "ckpt", step=1)
    saved = {k: v.clone() for k, v in manager.get_model_state_dict().items()}
    manager.offload_param_and_grad(offload_grad=True)
    manager.offload_optimizer()
    manager.load_param_and_grad("cpu", load_grad=True)
    manager.load_optimizer("cpu")
    after_save = _train_once(manager)
    weights_after = {k: v.clone() for k, v in manager.get_model_state_dict().items()}
    assert any(not torch.equal(saved[k], weights_after[k]) for k in saved)

    assert manager.load_checkpoint(tmp_path / "ckpt") == 1
    restored = manager.get_model_state_dict()
    assert all(torch.equal(saved[k], restored[k]) for k in saved)
    torch.manual_seed(0)
    replay = _train_once(manager)
    torch.manual_seed(0)
    assert replay[1] == after_save[1]  # the schedule continued from step 1


def test_loading_a_checkpoint_that_is_not_there_names_the_file(
    config: tuple[Config, Path], process_group: None, tmp_path: Path
) -> None:
    cfg, _ = config
    manager = FSDPModelManager(cfg.actor, total_steps=4, device=torch.device("cpu"))
    manager.setup_model_and_optimizer()
    with pytest.raises(FileNotFoundError, match=r"extra_state_rank0\.pt"):
        manager.load_checkpoint(tmp_path / "missing")


# -- checkpoint directories


def _fake_checkpoint(run_dir: Path, step: int) -> Path:
    staging = staging_dir(run_dir, step)
    write_trainer_state(
        staging, TrainerState(step=step, experiment_name="test", sampler_position=step)
    )
    write_manifest(staging)
    return commit(staging, run_dir, step)


def test_checkpoints_commit_atomically_resume_from_the_newest_and_prune(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _fake_checkpoint(tmp_path, step)
    half_written = staging_dir(tmp_path, 8)  # a save interrupted before commit
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4, 6]
    assert resolve_resume("auto", tmp_path) == tmp_path / "checkpoints" / "global_step_6"
    assert resolve_resume(None, tmp_path) is None
    assert clean_partials(tmp_path) == [half_written]
    assert not half_written.exists()
    removed = prune(tmp_path, keep_last=2)
    assert removed == [tmp_path / "checkpoints" / "global_step_2"]
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_resume(str(tmp_path / "nope"), tmp_path)
    incomplete = staging_dir(tmp_path, 10)
    with pytest.raises(CheckpointError, match="refusing to commit"):
        commit(incomplete, tmp_path, 10)


def test_resume_auto_without_checkpoints_starts_fresh(tmp_path: Path) -> None:
    assert resolve_resume("auto", tmp_path) is None


def test_the_custom_trainer_example_trains_and_evaluates() -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "examples/custom_trainer/grpo_arithmetic.py",
            "--steps",
            "3",
            "--eval-every",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("75,392 parameters, vocabulary 17")
    assert lines[-1].startswith("step    3  reward")
    assert "held-out accuracy" in lines[-1]


def test_old_logprobs_are_recomputed_and_the_gap_and_weights_follow_the_config() -> None:
    """π_old, the importance weights and the gap metrics of the update, per config."""
    from rlshell.config import AlgorithmConfig

    generator = torch.Generator().manual_seed(0)
    logprobs = torch.randn(3, 5, generator=generator).requires_grad_(True)
    gap = torch.tensor([[0.0, 0.5, -0.1, 2.0, 0.0]]).expand(3, 5)
    sampled = logprobs.detach() - gap  # ρ = π_old/μ = exp(gap)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    old, proximal, weights, metrics = old_logprobs_and_weights(
        logprobs.detach(), sampled, mask, AlgorithmConfig()
    )
    assert torch.equal(old, logprobs.detach())
    assert not old.requires_grad
    assert weights is None
    assert proximal is None
    assert metrics["rollout/mismatch_abs_diff_max"] == pytest.approx(2.0)
    assert metrics["rollout/mismatch_kl_k3"] > 0
    assert not any(key.startswith("rollout/mismatch_is_") for key in metrics)

    rollout = AlgorithmConfig(old_logprobs="rollout", rollout_is="token_mask")
    old, _, weights, metrics = old_logprobs_and_weights(logprobs.detach(), sampled, mask, rollout)
    assert torch.equal(old, sampled)
    assert weights is not None
    # ρ = e^2 is outside [1/2, 2]: masked where valid; e^0.5 and e^-0.1 are inside.
    expected = torch.tensor([[1.0, 1.0, 1.0, 0.0, 1.0]]).expand(3, 5) * mask
    assert torch.equal(weights, expected)
    assert metrics["rollout/mismatch_is_masked_frac"] == pytest.approx(2 / 13)

    truncate = AlgorithmConfig(rollout_is="token_truncate", rollout_is_threshold=1.5)
    _, _, weights, _ = old_logprobs_and_weights(logprobs.detach(), sampled, mask, truncate)
    assert weights is not None
    assert torch.allclose(weights[0], torch.exp(gap[0]).clamp(max=1.5))

    # decoupled PPO: the ratio against the recomputed (proximal), weighted against μ.
    decoupled = AlgorithmConfig(loss_type="decoupled_ppo")
    behaviour, proximal, weights, _ = old_logprobs_and_weights(
        logprobs.detach(), sampled, mask, decoupled
    )
    assert torch.equal(behaviour, sampled)
    assert weights is None
    assert proximal is not None
    assert torch.equal(proximal, logprobs.detach())
