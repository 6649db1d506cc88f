"""Property checks a user runs against their own policy loss or advantage estimator.

Each check draws many inputs with hypothesis and raises ``AssertionError``
(with hypothesis's minimal failing example) when a property fails::

    from rlcore.testing import check_policy_loss

    def test_my_loss() -> None:
        check_policy_loss(my_loss, PolicyLossConfig(clip_high=0.28))

The properties are the ones every rlcore built-in satisfies; they are what
the shell relies on when it splits a batch into micro-batches and ranks.
"""

from __future__ import annotations

import attrs
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rlcore.advantages import AdvantageBatch, AdvantageConfig, AdvantageEstimator
from rlcore.losses import PolicyLoss, PolicyLossBatch, PolicyLossConfig
from rlcore.masked import aggregation_normalizer
from rlcore.testing.strategies import TokenBatch, token_batches

__all__ = ["check_advantage_estimator", "check_policy_loss"]


def _settings(max_examples: int, shrink: bool) -> settings:
    phases = tuple(Phase) if shrink else tuple(p for p in Phase if p is not Phase.shrink)
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        phases=phases,
    )


def _loss_batch(
    batch: TokenBatch, logprobs: torch.Tensor, normalizer: float | None = None
) -> PolicyLossBatch:
    return PolicyLossBatch(
        logprobs=logprobs,
        old_logprobs=batch.old_logprobs,
        advantages=batch.advantages,
        mask=batch.mask,
        proximal_logprobs=batch.ref_logprobs,
        normalizer=normalizer,
    )


def check_policy_loss(
    loss_fn: PolicyLoss,
    config: PolicyLossConfig | None = None,
    max_examples: int = 50,
    shrink: bool = True,
) -> None:
    """Check the properties every policy loss must have.

    1. The loss is a finite scalar and differentiable in ``logprobs``.
    2. Masked positions do not matter: changing every input there changes
       neither the loss nor any gradient, and their gradient is 0.
    3. A zero advantage everywhere gives a zero gradient.
    4. Micro-batch invariance: with the whole batch's normaliser, the losses
       of any split of the rows add up to the loss of the whole batch.

    ``shrink=False`` skips hypothesis's search for a minimal failing example.
    """
    cfg = PolicyLossConfig() if config is None else config

    @_settings(max_examples, shrink)
    @given(batch=token_batches(), cut=st.integers(0, 64), noise=st.floats(-5.0, 5.0))
    def run(batch: TokenBatch, cut: int, noise: float) -> None:
        logprobs = batch.logprobs.clone().requires_grad_(True)
        out = loss_fn(_loss_batch(batch, logprobs), cfg)
        assert out.loss.ndim == 0, f"loss must be a scalar, got shape {tuple(out.loss.shape)}"
        assert torch.isfinite(out.loss), f"loss is not finite: {out.loss}"
        (grad,) = torch.autograd.grad(out.loss, logprobs, allow_unused=True)
        grad = torch.zeros_like(logprobs) if grad is None else grad
        assert torch.all(grad[~batch.mask] == 0), "masked positions received a gradient"

        hidden = ~batch.mask
        perturbed = attrs.evolve(
            batch,
            logprobs=torch.where(hidden, batch.logprobs + noise, batch.logprobs),
            old_logprobs=torch.where(hidden, batch.old_logprobs - noise, batch.old_logprobs),
            ref_logprobs=torch.where(hidden, batch.ref_logprobs + noise, batch.ref_logprobs),
            advantages=torch.where(hidden, batch.advantages * 3 + noise, batch.advantages),
        )
        other_logprobs = perturbed.logprobs.clone().requires_grad_(True)
        other = loss_fn(_loss_batch(perturbed, other_logprobs), cfg)
        torch.testing.assert_close(other.loss, out.loss, msg="masked positions changed the loss")
        (other_grad,) = torch.autograd.grad(other.loss, other_logprobs, allow_unused=True)
        other_grad = torch.zeros_like(logprobs) if other_grad is None else other_grad
        torch.testing.assert_close(other_grad, grad, msg="masked positions changed the gradient")

        zero = attrs.evolve(batch, advantages=torch.zeros_like(batch.advantages))
        zero_logprobs = batch.logprobs.clone().requires_grad_(True)
        zero_out = loss_fn(_loss_batch(zero, zero_logprobs), cfg)
        (zero_grad,) = torch.autograd.grad(zero_out.loss, zero_logprobs, allow_unused=True)
        if zero_grad is not None:
            assert torch.all(zero_grad == 0), "zero advantages gave a non-zero gradient"

        rows = batch.mask.shape[0]
        split = cut % (rows + 1)
        normalizer = float(aggregation_normalizer(batch.mask, cfg.agg))
        whole = loss_fn(_loss_batch(batch, batch.logprobs, normalizer), cfg).loss
        parts = torch.zeros((), dtype=whole.dtype)
        for part in (slice(0, split), slice(split, rows)):
            if part.start == part.stop:
                continue
            fields = attrs.asdict(batch, recurse=False)
            piece = TokenBatch(**{name: value[part] for name, value in fields.items()})
            parts = parts + loss_fn(_loss_batch(piece, piece.logprobs, normalizer), cfg).loss
        torch.testing.assert_close(
            parts, whole, msg=f"losses of rows [0:{split}] and [{split}:{rows}] do not add up"
        )

    run()


def check_advantage_estimator(
    estimator: AdvantageEstimator,
    config: AdvantageConfig | None = None,
    group_size: int = 2,
    max_examples: int = 50,
    shrink: bool = True,
) -> None:
    """Check the properties every token-level advantage estimator must have.

    1. Advantages and returns have the batch's shape, are finite and carry no
       gradient (they are constants for the loss).
    2. Masked positions hold 0.
    3. Rewards, values and log-probabilities at masked positions change nothing.

    ``shrink=False`` skips hypothesis's search for a minimal failing example.
    """
    cfg = AdvantageConfig() if config is None else config

    def make(batch: TokenBatch, noise: float) -> AdvantageBatch:
        hidden = ~batch.mask
        return AdvantageBatch(
            token_rewards=torch.where(hidden, batch.token_rewards + noise, batch.token_rewards),
            mask=batch.mask,
            group_size=group_size,
            values=torch.where(hidden, batch.values - noise, batch.values),
            logprobs=torch.where(hidden, batch.logprobs + noise, batch.logprobs),
            teacher_logprobs=torch.where(hidden, batch.ref_logprobs - noise, batch.ref_logprobs),
        )

    @_settings(max_examples, shrink)
    @given(
        batch=token_batches(batch_multiple_of=group_size, allow_empty_rows=False),
        noise=st.floats(-5.0, 5.0),
    )
    def run(batch: TokenBatch, noise: float) -> None:
        out = estimator(make(batch, 0.0), cfg)
        for name in ("advantages", "returns"):
            tensor = getattr(out, name)
            assert tensor.shape == batch.mask.shape, (
                f"{name} has shape {tuple(tensor.shape)}, the batch {tuple(batch.mask.shape)}"
            )
            assert torch.isfinite(tensor).all(), f"{name} is not finite"
            assert not tensor.requires_grad, f"{name} requires grad: advantages are constants"
        assert torch.all(out.advantages[~batch.mask] == 0), "masked positions are not 0"
        other = estimator(make(batch, noise), cfg)
        torch.testing.assert_close(
            other.advantages, out.advantages, msg="masked inputs changed the advantages"
        )

    run()
