"""rlcore.testing: the strategies draw what they promise, and the checks catch broken maths."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

from rlcore.advantages import AdvantageBatch, AdvantageConfig, group_normalized
from rlcore.losses import PolicyLossBatch, PolicyLossConfig, ppo_policy_loss
from rlcore.masked import masked_sum
from rlcore.testing import (
    CategoricalBatch,
    GaussianBatch,
    TokenBatch,
    Trajectory,
    categorical_batches,
    check_advantage_estimator,
    check_policy_loss,
    gaussian_batches,
    group_scores,
    token_batches,
    trajectories,
)
from rlcore.tokens import broadcast_to_tokens
from rlcore.types import Advantages, LossOutput


@given(batch=token_batches(contiguous_mask=True, allow_empty_rows=False, batch_multiple_of=3))
def test_token_batches_respect_their_options(batch: TokenBatch) -> None:
    mask = batch.mask
    assert mask.shape[0] % 3 == 0
    assert mask.any(dim=-1).all()
    lengths = mask.sum(-1, keepdim=True)
    assert torch.equal(mask, torch.arange(mask.shape[1]) < lengths)
    assert torch.all(batch.logprobs <= 0)


@given(trajectory=trajectories(consistent_values=True))
def test_trajectories_have_consistent_next_values_inside_episodes(trajectory: Trajectory) -> None:
    done = trajectory.terminated | trajectory.truncated
    assert not torch.any(trajectory.terminated & trajectory.truncated)
    inside = ~done[:, :-1]
    follow = trajectory.values[:, 1:]
    assert torch.equal(trajectory.next_values[:, :-1][inside], follow[inside])


@given(scores=group_scores(min_group_size=3))
def test_group_scores_have_the_requested_group_size(scores: torch.Tensor) -> None:
    assert scores.ndim == 2
    assert scores.shape[1] >= 3


@given(batch=categorical_batches(min_batch=2, max_batch=3, min_actions=4, max_actions=4))
def test_categorical_batches_hold_finite_logits_and_actions_in_range(
    batch: CategoricalBatch,
) -> None:
    assert batch.logits.shape[0] in (2, 3)
    assert batch.logits.shape[1] == 4
    assert batch.logits.dtype == torch.float64
    assert torch.isfinite(batch.logits).all()
    assert batch.actions.dtype == torch.int64
    assert batch.actions.shape == batch.logits.shape[:1]
    assert torch.all((batch.actions >= 0) & (batch.actions < 4))


@given(
    shared=gaussian_batches(shared_log_std=True, max_abs_x=3.0, dtype=torch.float32),
    per_row=gaussian_batches(shared_log_std=False),
)
def test_gaussian_batches_share_log_std_when_asked(
    shared: GaussianBatch, per_row: GaussianBatch
) -> None:
    assert shared.log_std.shape == shared.mean.shape[-1:]
    assert shared.x.dtype == torch.float32
    assert per_row.log_std.shape == per_row.mean.shape == per_row.x.shape
    for batch in (shared, per_row):
        assert torch.all((batch.log_std >= -5) & (batch.log_std <= 2))
        assert torch.all(batch.mean.abs() <= 5)


def leaky_loss(batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
    """Averages over all positions: padding leaks into the loss."""
    ratio = torch.exp(batch.logprobs - batch.old_logprobs)
    return LossOutput((-batch.advantages * ratio).mean())


def per_batch_mean_loss(batch: PolicyLossBatch, config: PolicyLossConfig) -> LossOutput:
    """Ignores the global normaliser: micro-batch losses do not add up."""
    return ppo_policy_loss(batch.logprobs, batch.old_logprobs, batch.advantages, batch.mask)


def leaky_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    """Sums rewards over every position, padding included."""
    scores = batch.token_rewards.sum(-1).view(-1, batch.group_size)
    advantages = broadcast_to_tokens(group_normalized(scores).reshape(-1), batch.mask)
    return Advantages(advantages, advantages)


def dense_estimator(batch: AdvantageBatch, config: AdvantageConfig) -> Advantages:
    """Forgets to zero the masked positions."""
    scores = masked_sum(batch.token_rewards, batch.mask, axis=-1).view(-1, batch.group_size)
    advantages = group_normalized(scores).reshape(-1, 1).expand_as(batch.token_rewards)
    return Advantages(advantages.contiguous(), advantages.contiguous())


@pytest.mark.parametrize(
    ("loss", "message"),
    [(leaky_loss, "masked positions"), (per_batch_mean_loss, "do not add up")],
)
def test_check_policy_loss_catches_broken_losses(loss: object, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_policy_loss(loss, max_examples=60, shrink=False)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("estimator", "message"),
    [(leaky_estimator, "masked inputs changed"), (dense_estimator, "masked positions are not 0")],
)
def test_check_advantage_estimator_catches_broken_estimators(
    estimator: object, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        check_advantage_estimator(estimator, max_examples=60, shrink=False)  # type: ignore[arg-type]
