"""Policy, value, KL, entropy, SFT and SAC losses: formulas, gradients, invariances, errors."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import get_args

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import TypeCheckError
from torch import Tensor

from rlcore import losses
from rlcore.losses import (
    PolicyLossBatch,
    PolicyLossConfig,
    decoupled_ppo_policy_loss,
    entropy_loss,
    gspo_policy_loss,
    kl_estimate,
    ppo_policy_loss,
    sac_actor_loss,
    sac_critic_loss,
    sac_critic_target,
    sac_temperature_loss,
    sft_loss,
    value_loss,
    vanilla_policy_loss,
)
from rlcore.masked import AggregationMode, aggregation_normalizer
from rlcore.registry import POLICY_LOSSES
from rlcore.testing import TokenBatch, check_policy_loss, token_batches
from rlcore.types import LossOutput
from tests.core.shape_errors import assert_shape_error

MODES: list[AggregationMode] = list(get_args(AggregationMode))
F64 = torch.float64

clip_ranges = st.floats(0.05, 0.5)
dual_clips = st.none() | st.floats(1.5, 5.0)
modes = st.sampled_from(MODES)


def grad_of(loss: Tensor, wrt: Tensor) -> Tensor:
    """∂loss/∂wrt, zeros where ``wrt`` does not reach the loss."""
    (grad,) = torch.autograd.grad(loss, wrt, allow_unused=True)
    return torch.zeros_like(wrt) if grad is None else grad


def tensor(rows: list[list[float]]) -> Tensor:
    return torch.tensor(rows, dtype=F64)


def per_token(
    loss_fn: Callable[[Tensor], tuple[float, Tensor]], mask: Tensor
) -> tuple[list[float], list[float]]:
    """Each valid token's loss and d loss/d input, by keeping only that token in the mask.

    ``loss_fn(token_mask)`` must aggregate with ``seq-mean-token-sum`` and normalizer 1,
    so the loss is the plain sum of the kept tokens' losses.
    """
    values: list[float] = []
    slopes: list[float] = []
    for index in mask.flatten().nonzero().flatten().tolist():
        only = torch.zeros_like(mask).flatten()
        only[index] = True
        out, grad = loss_fn(only.view_as(mask))
        values.append(out)
        slopes.append(float(grad.flatten()[index]))
    return values, slopes


# --- every registered policy loss satisfies rlcore.testing.check_policy_loss -------------------


def test_the_built_in_policy_losses_are_registered() -> None:
    assert {"ppo", "gspo", "decoupled_ppo", "vanilla"} <= set(POLICY_LOSSES.names())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["ppo", "gspo", "decoupled_ppo", "vanilla"])
def test_registered_policy_losses_pass_check_policy_loss(name: str, mode: AggregationMode) -> None:
    config = PolicyLossConfig(
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=None if name == "gspo" else 3.0,
        behavior_weight_cap=2.0 if name == "decoupled_ppo" else None,
        agg=mode,
    )
    examples = max(8, settings().max_examples // 4)
    check_policy_loss(POLICY_LOSSES.get(name), config, max_examples=examples)


# --- properties every token-level loss shares ----------------------------------------------


def token_losses(
    batch: TokenBatch, mode: AggregationMode, normalizer: float | None = None
) -> dict[str, Callable[[Tensor, TokenBatch], LossOutput]]:
    """Every token loss as a function of (the differentiated input, the batch)."""
    agg = {"agg": mode, "normalizer": normalizer}
    return {
        "ppo": lambda x, b: ppo_policy_loss(
            x, b.old_logprobs, b.advantages, b.mask, 0.2, 0.28, 3.0, **agg
        ),
        "vanilla": lambda x, b: vanilla_policy_loss(x, b.advantages, b.mask, **agg),
        "gspo": lambda x, b: gspo_policy_loss(
            x, b.old_logprobs, b.advantages, b.mask, 0.1, 0.2, **agg
        ),
        "decoupled_ppo": lambda x, b: decoupled_ppo_policy_loss(
            x, b.ref_logprobs, b.old_logprobs, b.advantages, b.mask, 0.2, 0.28, 3.0, 2.0, **agg
        ),
        "value": lambda x, b: value_loss(x, b.old_values, b.returns, b.mask, **agg),
        "value_clipped_huber": lambda x, b: value_loss(
            x, b.old_values, b.returns, b.mask, clip=0.5, huber_delta=1.0, **agg
        ),
        "entropy": lambda x, b: entropy_loss(x, b.mask, **agg),
        "sft": lambda x, b: sft_loss(x, b.mask, **agg),
    }


def differentiated_input(name: str, batch: TokenBatch) -> Tensor:
    return batch.values if name.startswith("value") else batch.logprobs


@given(batch=token_batches(max_batch=4, max_time=6), mode=modes)
def test_default_normalizer_equals_the_batchs_own(batch: TokenBatch, mode: AggregationMode) -> None:
    """normalizer=None means aggregation_normalizer(mask): what the shell passes for one batch."""
    own = float(aggregation_normalizer(batch.mask, mode))
    implicit = token_losses(batch, mode)
    explicit = token_losses(batch, mode, own)
    for name, loss_fn in implicit.items():
        x = differentiated_input(name, batch)
        torch.testing.assert_close(
            loss_fn(x, batch).loss, explicit[name](x, batch).loss, msg=f"{name} ({mode})"
        )


@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64]), mode=modes)
def test_losses_and_metrics_come_back_in_the_inputs_dtype(
    data: st.DataObject, dtype: torch.dtype, mode: AggregationMode
) -> None:
    """Fractions (``clipfrac``, ``dual_clipfrac``, ``vf_clipfrac``, ...) included: a float64
    batch gives float64 metrics, whatever torch's default dtype."""
    batch = data.draw(token_batches(max_batch=4, max_time=6, dtype=dtype), label="batch")
    for name, loss_fn in token_losses(batch, mode).items():
        out = loss_fn(differentiated_input(name, batch), batch)
        found = {key: value.dtype for key, value in out.metrics.items()}
        assert out.loss.dtype == dtype, name
        assert found == dict.fromkeys(out.metrics, dtype), f"{name}: {found}"


@given(
    batch=token_batches(max_batch=4, max_time=6),
    mode=modes,
    fill=st.sampled_from([float("nan"), float("inf"), float("-inf")]),
)
def test_non_finite_padding_reaches_neither_losses_nor_gradients(
    batch: TokenBatch, mode: AggregationMode, fill: float
) -> None:
    """NaN/±inf in every input at masked positions (a −inf log-prob in padding is common):
    same loss, metrics and gradient as zero padding, and exactly 0 gradient there.
    """
    hidden = ~batch.mask

    def padded(value: float) -> TokenBatch:
        fields = {
            name: torch.where(hidden, torch.full_like(t, value), t) if t.is_floating_point() else t
            for name, t in attrs.asdict(batch, recurse=False).items()
        }
        return TokenBatch(**fields)

    clean, dirty = padded(0.0), padded(fill)
    for name, loss_fn in token_losses(batch, mode).items():
        clean_x = differentiated_input(name, clean).clone().requires_grad_(True)
        dirty_x = differentiated_input(name, dirty).clone().requires_grad_(True)
        expected, result = loss_fn(clean_x, clean), loss_fn(dirty_x, dirty)
        torch.testing.assert_close(result.loss, expected.loss, msg=f"{name}: loss changed")
        for key, value in expected.metrics.items():
            torch.testing.assert_close(result.metrics[key], value, msg=f"{name}: {key} changed")
        grad = grad_of(result.loss, dirty_x)
        assert torch.isfinite(grad).all(), f"{name}: non-finite gradient {grad}"
        assert torch.all(grad[hidden] == 0), f"{name}: masked positions received a gradient"
        torch.testing.assert_close(grad, grad_of(expected.loss, clean_x), msg=f"{name}: gradient")


@given(batch=token_batches(max_batch=3, max_time=5), mode=modes)
def test_float_masks_give_the_same_losses_as_bool_masks(
    batch: TokenBatch, mode: AggregationMode
) -> None:
    as_float = attrs.evolve(batch, mask=batch.mask.to(F64))
    for name, loss_fn in token_losses(batch, mode).items():
        x = differentiated_input(name, batch)
        torch.testing.assert_close(loss_fn(x, as_float).loss, loss_fn(x, batch).loss, msg=name)


def test_non_binary_masks_are_rejected() -> None:
    ones = torch.ones(1, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1, found \[0.5\]"):
        ppo_policy_loss(ones, ones, ones, torch.tensor([[1.0, 0.5]]))


# --- ppo_policy_loss -----------------------------------------------------------------------


def reference_ppo_token(
    ratio: float, advantage: float, low: float, high: float, dual: float | None
) -> tuple[float, float, bool, bool]:
    """One token of PPO, branch by branch: (loss, d loss/d log π, clip active, dual clip active).

    Â ≥ 0: ℓ = −Â min(ρ, 1 + ε_high);   Â < 0: ℓ = |Â| max(ρ, 1 − ε_low), capped at c |Â|.
    """
    if advantage >= 0:
        if ratio > 1 + high:
            return -advantage * (1 + high), 0.0, advantage > 0, False
        return -advantage * ratio, -advantage * ratio, False, False
    size = -advantage
    if ratio < 1 - low:
        loss, slope, clipped = size * (1 - low), 0.0, True
    else:
        loss, slope, clipped = size * ratio, size * ratio, False
    if dual is not None and loss > dual * size:
        return dual * size, 0.0, clipped, True
    return loss, slope, clipped, False


@given(batch=token_batches(), low=clip_ranges, high=clip_ranges, dual=dual_clips)
def test_ppo_matches_the_branchwise_formula_token_by_token(
    batch: TokenBatch, low: float, high: float, dual: float | None
) -> None:
    """Loss, gradient and clip fractions against the per-token case analysis."""
    logprobs = batch.logprobs.clone().requires_grad_(True)
    out = ppo_policy_loss(
        logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        low,
        high,
        dual,
        "seq-mean-token-sum",
        normalizer=1.0,
    )
    grad = grad_of(out.loss, logprobs)
    ratios = torch.exp(batch.logprobs - batch.old_logprobs)
    valid = batch.mask.nonzero().tolist()
    expected = [
        reference_ppo_token(float(ratios[i, t]), float(batch.advantages[i, t]), low, high, dual)
        for i, t in valid
    ]
    assert out.loss.item() == pytest.approx(sum(e[0] for e in expected), rel=1e-9, abs=1e-9)
    expected_grad = torch.zeros_like(grad)
    for (i, t), token in zip(valid, expected, strict=True):
        expected_grad[i, t] = token[1]
    torch.testing.assert_close(grad, expected_grad)
    count = max(len(valid), 1)
    assert out.metrics["clipfrac"].item() == pytest.approx(sum(e[2] for e in expected) / count)
    assert out.metrics["dual_clipfrac"].item() == pytest.approx(sum(e[3] for e in expected) / count)


@given(batch=token_batches(), mode=modes, low=clip_ranges, high=clip_ranges, dual=dual_clips)
def test_ppo_gradient_equals_the_vanilla_policy_gradient_at_ratio_one(
    batch: TokenBatch, mode: AggregationMode, low: float, high: float, dual: float | None
) -> None:
    """With π_old = π (a fresh batch) ∇ PPO = ∇ REINFORCE: ∇ρ = ρ ∇log π = ∇log π at ρ = 1."""
    logprobs = batch.logprobs.clone().requires_grad_(True)
    ppo = ppo_policy_loss(
        logprobs,
        batch.logprobs,
        batch.advantages,
        batch.mask,
        low,
        high,
        dual,
        mode,
    )
    vanilla = vanilla_policy_loss(logprobs, batch.advantages, batch.mask, mode)
    torch.testing.assert_close(grad_of(ppo.loss, logprobs), grad_of(vanilla.loss, logprobs))
    assert ppo.metrics["clipfrac"].item() == 0.0
    assert ppo.metrics["ratio_mean"].item() == (1.0 if batch.mask.any() else 0.0)


@given(batch=token_batches(), mode=modes, low=clip_ranges, high=clip_ranges, dual=dual_clips)
def test_zero_advantage_gives_zero_policy_gradient(
    batch: TokenBatch, mode: AggregationMode, low: float, high: float, dual: float | None
) -> None:
    zero = torch.zeros_like(batch.advantages)
    logprobs = batch.logprobs.clone().requires_grad_(True)
    calls = {
        "ppo": lambda: ppo_policy_loss(
            logprobs, batch.old_logprobs, zero, batch.mask, low, high, dual, mode
        ),
        "vanilla": lambda: vanilla_policy_loss(logprobs, zero, batch.mask, mode),
        "gspo": lambda: gspo_policy_loss(
            logprobs, batch.old_logprobs, zero, batch.mask, low, high, mode
        ),
        "decoupled_ppo": lambda: decoupled_ppo_policy_loss(
            logprobs, batch.ref_logprobs, batch.old_logprobs, zero, batch.mask, low, high, dual
        ),
    }
    for name, call in calls.items():
        out = call()
        assert out.loss.item() == 0.0, name
        assert torch.all(grad_of(out.loss, logprobs) == 0), name


def asymmetric_clip_example() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Six valid tokens (Â, ρ) on both sides of [0.8, 1.28], then one masked token."""
    advantages = tensor([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0]])
    ratios = tensor([[1.5, 0.5, 0.5, 1.5, 1.25, 0.75, math.exp(5.0)]])
    old_logprobs = torch.full_like(ratios, -1.0)
    mask = torch.tensor([[True] * 6 + [False]])
    return old_logprobs + ratios.log(), old_logprobs, advantages, mask


def test_ppo_asymmetric_clip_hand_example() -> None:
    """ε_low = 0.2 bounds ρ from below for Â < 0; ε_high = 0.28 from above for Â > 0.

    (Â, ρ) → ℓ, ∂ℓ/∂log π:  (+1, 1.5) → −1.28, 0 (clipped)   (+1, 0.5) → −0.5, −0.5
    (−1, 0.5) → 0.8, 0 (clipped)   (−1, 1.5) → 1.5, 1.5   (+1, 1.25) → −1.25, −1.25
    (ρ = 1.25 passes: a symmetric 0.2 would clip it)   (−1, 0.75) → 0.8, 0 (clipped)
    """
    logprobs, old_logprobs, advantages, mask = asymmetric_clip_example()

    def loss_of(token_mask: Tensor) -> tuple[float, Tensor]:
        x = logprobs.clone().requires_grad_(True)
        out = ppo_policy_loss(
            x, old_logprobs, advantages, token_mask, 0.2, 0.28, None, "seq-mean-token-sum", 1.0
        )
        return out.loss.item(), grad_of(out.loss, x)

    values, slopes = per_token(loss_of, mask)
    assert values == pytest.approx([-1.28, -0.5, 0.8, 1.5, -1.25, 0.8])
    assert slopes == pytest.approx([0.0, -0.5, 0.0, 1.5, -1.25, 0.0])

    symmetric = ppo_policy_loss(
        logprobs, old_logprobs, advantages, mask, 0.2, None, None, "seq-mean-token-sum", 1.0
    )
    assert symmetric.loss.item() == pytest.approx(-1.2 - 0.5 + 0.8 + 1.5 - 1.2 + 0.8)


def test_ppo_metrics_hand_example() -> None:
    """clipfrac 3/6, no dual clip, approx_kl = mean(−log ρ), ratio_mean = 1; padding ignored."""
    logprobs, old_logprobs, advantages, mask = asymmetric_clip_example()
    out = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, 0.2, 0.28)
    log_ratios = [math.log(r) for r in (1.5, 0.5, 0.5, 1.5, 1.25, 0.75)]
    assert out.metrics["clipfrac"].item() == pytest.approx(0.5)
    assert out.metrics["dual_clipfrac"].item() == 0.0
    assert out.metrics["approx_kl"].item() == pytest.approx(-sum(log_ratios) / 6)
    assert out.metrics["ratio_mean"].item() == pytest.approx(1.0)
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5 - 1.25 + 0.8) / 6)
    assert all(not metric.requires_grad for metric in out.metrics.values())


def test_ppo_dual_clip_hand_example() -> None:
    """c = 3 caps the loss of negative advantages at 3|Â|; positive advantages are untouched.

    (Â, ρ) → ℓ:  (−2, 5) → min(10, 6) = 6 (dual)   (−2, 2) → 4   (+2, 5) → −2.4 (clip)
    (−2, 0.5) → max(1, 1.6) = 1.6 (clip)
    """
    advantages = tensor([[-2.0, -2.0, 2.0, -2.0]])
    ratios = tensor([[5.0, 2.0, 5.0, 0.5]])
    old_logprobs = torch.full_like(ratios, -2.0)
    logprobs = (old_logprobs + ratios.log()).requires_grad_(True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    out = ppo_policy_loss(
        logprobs, old_logprobs, advantages, mask, 0.2, None, 3.0, "seq-mean-token-sum", 1.0
    )
    assert out.loss.item() == pytest.approx(6.0 + 4.0 - 2.4 + 1.6)
    torch.testing.assert_close(grad_of(out.loss, logprobs), tensor([[0.0, 4.0, 0.0, 0.0]]))
    assert out.metrics["dual_clipfrac"].item() == pytest.approx(0.25)
    assert out.metrics["clipfrac"].item() == pytest.approx(0.5)
    without = ppo_policy_loss(
        logprobs, old_logprobs, advantages, mask, 0.2, None, None, "seq-mean-token-sum", 1.0
    )
    assert without.loss.item() == pytest.approx(10.0 + 4.0 - 2.4 + 1.6)


def test_ppo_stays_finite_for_extreme_log_ratios() -> None:
    """The log-ratio is clamped to ±20 before exp, so a far off-policy token cannot overflow."""
    logprobs = tensor([[0.0, -300.0]])
    old_logprobs = tensor([[-300.0, 0.0]])
    out = ppo_policy_loss(logprobs, old_logprobs, tensor([[-1.0, 1.0]]), torch.ones(1, 2) > 0)
    assert torch.isfinite(out.loss)
    assert out.loss.item() == pytest.approx((math.exp(20.0) - math.exp(-20.0)) / 2)


# --- vanilla_policy_loss ---------------------------------------------------------------------


def test_vanilla_policy_loss_hand_example() -> None:
    """ℓ = −Â log π averaged over valid tokens; ∂/∂log π = −Â / n."""
    logprobs = tensor([[-1.0, -2.0, -5.0]]).requires_grad_(True)
    advantages = tensor([[2.0, -1.0, 7.0]])
    mask = torch.tensor([[True, True, False]])
    out = vanilla_policy_loss(logprobs, advantages, mask)
    assert out.loss.item() == pytest.approx((2.0 * 1.0 - 1.0 * 2.0) / 2)
    torch.testing.assert_close(grad_of(out.loss, logprobs), tensor([[-1.0, 0.5, 0.0]]))


# --- gspo_policy_loss ------------------------------------------------------------------------


def gspo_sequence_objective(
    logprobs: Tensor,
    old_logprobs: Tensor,
    sequence_advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
) -> Tensor:
    """GSPO as the paper writes it (arXiv:2507.18071, eq. 5–7), negated to a loss:

    sᵢ = (π(yᵢ)/π_old(yᵢ))^(1/|yᵢ|),   J = (1/G) Σᵢ min(sᵢ Âᵢ, clip(sᵢ, 1 − ε_l, 1 + ε_h) Âᵢ)
    over the G sequences with at least one token.
    """
    lengths = mask.sum(-1)
    has_tokens = lengths > 0
    sequence_log_ratio = ((logprobs - old_logprobs) * mask).sum(-1) / lengths.clamp(min=1)
    s = sequence_log_ratio.exp()
    objective = torch.minimum(
        s * sequence_advantages, s.clamp(1 - clip_low, 1 + clip_high) * sequence_advantages
    )
    return -(objective * has_tokens).sum() / has_tokens.sum().clamp(min=1)


@given(batch=token_batches())
def test_gspo_ratio_is_the_exponentiated_mean_token_log_ratio(batch: TokenBatch) -> None:
    """With a clip range too wide to bind and Â = −1 on row i only, the loss is sᵢ."""
    valid_rows = batch.mask.any(-1).nonzero().flatten().tolist()
    for row in valid_rows:
        advantages = torch.zeros_like(batch.advantages)
        advantages[row] = -1.0
        out = gspo_policy_loss(
            batch.logprobs,
            batch.old_logprobs,
            advantages,
            batch.mask,
            clip_low=0.999,
            clip_high=1e6,
            agg="seq-mean-token-mean",
            normalizer=1.0,
        )
        token_log_ratios = (batch.logprobs - batch.old_logprobs)[row][batch.mask[row]]
        assert out.loss.item() == pytest.approx(math.exp(token_log_ratios.mean().item()))


@given(data=st.data(), batch=token_batches(), low=clip_ranges, high=clip_ranges)
def test_gspo_gradient_equals_the_sequence_level_objectives(
    data: st.DataObject, batch: TokenBatch, low: float, high: float
) -> None:
    """One advantage per sequence: the token form's loss and ∇ equal GSPO's sequence objective."""
    rows = batch.mask.shape[0]
    sequence_advantages = torch.tensor(
        data.draw(st.lists(st.floats(-3.0, 3.0), min_size=rows, max_size=rows)), dtype=F64
    )
    advantages = sequence_advantages.unsqueeze(-1).expand_as(batch.logprobs).contiguous()
    logprobs = batch.logprobs.clone().requires_grad_(True)
    out = gspo_policy_loss(
        logprobs, batch.old_logprobs, advantages, batch.mask, low, high, "seq-mean-token-mean"
    )
    direct_logprobs = batch.logprobs.clone().requires_grad_(True)
    direct = gspo_sequence_objective(
        direct_logprobs, batch.old_logprobs, sequence_advantages, batch.mask, low, high
    )
    torch.testing.assert_close(out.loss, direct)
    torch.testing.assert_close(grad_of(out.loss, logprobs), grad_of(direct, direct_logprobs))


def test_gspo_hand_example() -> None:
    """Row 1: log-ratios (0.2, −0.1) → s = e^0.05, Â = −1: unclipped loss s, ∂/∂log πₜ = s/2.
    Row 2: log-ratio −0.4 → s = e^−0.4, Â = +1: loss −s (above 1 − ε_l is not clipped).
    Row 3: log-ratios (0.1, 0) → s = e^0.05 > 1 + ε_h, Â = +1: loss −(1 + ε_h), no gradient.
    A masked token with log-ratio 3 in row 1 changes nothing. Averaged over the 3 rows.
    """
    old_logprobs = torch.full((3, 3), -1.0, dtype=F64)
    log_ratios = tensor([[0.2, -0.1, 3.0], [-0.4, 0.0, 0.0], [0.1, 0.0, 0.0]])
    logprobs = (old_logprobs + log_ratios).requires_grad_(True)
    advantages = tensor([[-1.0] * 3, [1.0] * 3, [1.0] * 3])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    out = gspo_policy_loss(logprobs, old_logprobs, advantages, mask, 3e-4, 4e-4)
    s1, s2 = math.exp(0.05), math.exp(-0.4)
    assert out.loss.item() == pytest.approx((s1 - s2 - (1 + 4e-4)) / 3)
    expected_grad = tensor([[s1 / 2, s1 / 2, 0.0], [-s2, 0.0, 0.0], [0.0, 0.0, 0.0]]) / 3
    torch.testing.assert_close(grad_of(out.loss, logprobs), expected_grad)
    assert out.metrics["clipfrac"].item() == pytest.approx(2 / 5)
    assert out.metrics["ratio_mean"].item() == pytest.approx((2 * s1 + s2 + 2 * s1) / 5)


# --- decoupled_ppo_policy_loss ---------------------------------------------------------------


@given(batch=token_batches(), mode=modes, low=clip_ranges, high=clip_ranges, dual=dual_clips)
def test_decoupled_ppo_equals_ppo_when_proximal_is_the_behaviour_policy(
    batch: TokenBatch, mode: AggregationMode, low: float, high: float, dual: float | None
) -> None:
    x = batch.logprobs.clone().requires_grad_(True)
    y = batch.logprobs.clone().requires_grad_(True)
    old = batch.old_logprobs
    decoupled = decoupled_ppo_policy_loss(
        x, old, old, batch.advantages, batch.mask, low, high, dual, agg=mode
    )
    ppo = ppo_policy_loss(y, old, batch.advantages, batch.mask, low, high, dual, mode)
    torch.testing.assert_close(decoupled.loss, ppo.loss)
    torch.testing.assert_close(grad_of(decoupled.loss, x), grad_of(ppo.loss, y))
    for key, value in ppo.metrics.items():
        torch.testing.assert_close(decoupled.metrics[key], value, msg=key)


@given(batch=token_batches(), mode=modes, low=clip_ranges, high=clip_ranges, dual=dual_clips)
def test_decoupled_ppo_is_ppo_around_the_proximal_policy_scaled_by_the_behaviour_weight(
    batch: TokenBatch, mode: AggregationMode, low: float, high: float, dual: float | None
) -> None:
    """wₜ ℓₜ(Âₜ) = ℓₜ(wₜ Âₜ) for wₜ = π_prox/μ > 0 (the clipped surrogate is 1-homogeneous in Â)."""
    proximal, behavior = batch.ref_logprobs, batch.old_logprobs
    weight = torch.exp(proximal - behavior)
    x = batch.logprobs.clone().requires_grad_(True)
    y = batch.logprobs.clone().requires_grad_(True)
    decoupled = decoupled_ppo_policy_loss(
        x, proximal, behavior, batch.advantages, batch.mask, low, high, dual, agg=mode
    )
    scaled = ppo_policy_loss(
        y, proximal, weight * batch.advantages, batch.mask, low, high, dual, mode
    )
    torch.testing.assert_close(decoupled.loss, scaled.loss)
    torch.testing.assert_close(grad_of(decoupled.loss, x), grad_of(scaled.loss, y))
    valid_weights = weight[batch.mask]
    expected_mean = valid_weights.mean() if valid_weights.numel() else torch.zeros((), dtype=F64)
    torch.testing.assert_close(decoupled.metrics["behavior_weight_mean"], expected_mean)


@given(batch=token_batches(), mode=modes, cap=st.floats(0.5, 3.0))
def test_behavior_weight_cap_drops_tokens_like_a_zero_advantage(
    batch: TokenBatch, mode: AggregationMode, cap: float
) -> None:
    """A token with π_prox/μ > cap contributes nothing (no loss, no gradient) and still counts
    in the normaliser, so the shell's global normaliser of the mask applies unchanged.
    """
    proximal, behavior = batch.ref_logprobs, batch.old_logprobs
    over_cap = batch.mask & (torch.exp(proximal - behavior) > cap)
    x = batch.logprobs.clone().requires_grad_(True)
    y = batch.logprobs.clone().requires_grad_(True)
    capped = decoupled_ppo_policy_loss(
        x, proximal, behavior, batch.advantages, batch.mask, behavior_weight_cap=cap, agg=mode
    )
    zeroed = decoupled_ppo_policy_loss(
        y,
        proximal,
        behavior,
        torch.where(over_cap, 0.0, batch.advantages),
        batch.mask,
        agg=mode,
    )
    torch.testing.assert_close(capped.loss, zeroed.loss)
    grad = grad_of(capped.loss, x)
    torch.testing.assert_close(grad, grad_of(zeroed.loss, y))
    assert torch.all(grad[over_cap] == 0)
    fraction = over_cap.sum() / batch.mask.sum().clamp(min=1)
    assert capped.metrics["behavior_capped_frac"].item() == pytest.approx(fraction.item())


def test_decoupled_ppo_hand_example() -> None:
    """Token 1: w = 2, r = 1.1, Â = 1 → ℓ = −2.2, ∂ℓ/∂log π = −2.2.
    Token 2: w = 0.5, r = 1.5, Â = 1 → ℓ = 0.5 · (−1.2) = −0.6 (clipped), no gradient.
    With cap 1.5 token 1 is dropped (it still counts in the token mean).
    """
    behavior = tensor([[-2.0, -2.0]])
    proximal = behavior + tensor([[math.log(2.0), math.log(0.5)]])
    logprobs = (proximal + tensor([[math.log(1.1), math.log(1.5)]])).requires_grad_(True)
    advantages = torch.ones(1, 2, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = decoupled_ppo_policy_loss(logprobs, proximal, behavior, advantages, mask)
    assert out.loss.item() == pytest.approx((-2.2 - 0.6) / 2)
    torch.testing.assert_close(grad_of(out.loss, logprobs), tensor([[-1.1, 0.0]]))
    assert out.metrics["behavior_weight_mean"].item() == pytest.approx(1.25)
    assert out.metrics["clipfrac"].item() == pytest.approx(0.5)
    capped = decoupled_ppo_policy_loss(
        logprobs, proximal, behavior, advantages, mask, behavior_weight_cap=1.5
    )
    assert capped.loss.item() == pytest.approx(-0.6 / 2)
    assert torch.all(grad_of(capped.loss, logprobs) == 0)
    assert capped.metrics["behavior_capped_frac"].item() == pytest.approx(0.5)


def test_decoupled_ppo_registry_adapter_needs_proximal_logprobs() -> None:
    ones = torch.zeros(1, 2, dtype=F64)
    batch = losses.PolicyLossBatch(ones, ones, ones, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="proximal_logprobs"):
        POLICY_LOSSES.get("decoupled_ppo")(batch, PolicyLossConfig())


# --- value_loss ------------------------------------------------------------------------------


def reference_value_token(
    value: float, old_value: float, target: float, clip: float | None, delta: float | None
) -> tuple[float, bool]:
    """One token of the (clipped, Huber) value loss and whether clipping raised it."""

    def error(x: float) -> float:
        if delta is None or abs(x) <= delta:
            return 0.5 * x * x
        return delta * (abs(x) - 0.5 * delta)

    unclipped = error(value - target)
    if clip is None:
        return unclipped, False
    clipped_value = old_value + min(max(value - old_value, -clip), clip)
    clipped = error(clipped_value - target)
    return max(unclipped, clipped), abs(value - old_value) > clip and clipped > unclipped


@given(
    batch=token_batches(),
    clip=st.none() | st.floats(0.05, 1.0),
    delta=st.none() | st.floats(0.1, 5.0),
)
def test_value_loss_matches_the_formula_token_by_token(
    batch: TokenBatch, clip: float | None, delta: float | None
) -> None:
    out = value_loss(
        batch.values,
        batch.old_values,
        batch.returns,
        batch.mask,
        clip=clip,
        huber_delta=delta,
        agg="seq-mean-token-sum",
        normalizer=1.0,
    )
    valid = batch.mask.nonzero().tolist()
    expected = [
        reference_value_token(
            float(batch.values[i, t]),
            float(batch.old_values[i, t]),
            float(batch.returns[i, t]),
            clip,
            delta,
        )
        for i, t in valid
    ]
    assert out.loss.item() == pytest.approx(sum(e[0] for e in expected), rel=1e-9, abs=1e-9)
    clipfrac = sum(e[1] for e in expected) / max(len(valid), 1)
    assert out.metrics["vf_clipfrac"].item() == pytest.approx(clipfrac)


def test_value_loss_unclipped_hand_example() -> None:
    """½ (V − G)²: (1 − 0)² / 2 = 0.5 and (3 − 1)² / 2 = 2, mean 1.25; ∂/∂V = (V − G)/n."""
    values = tensor([[1.0, 3.0, 9.0]]).requires_grad_(True)
    returns = tensor([[0.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, False]])
    out = value_loss(values, torch.zeros_like(returns), returns, mask)
    assert out.loss.item() == pytest.approx(1.25)
    torch.testing.assert_close(grad_of(out.loss, values), tensor([[0.5, 1.0, 0.0]]))
    assert out.metrics["value_mean"].item() == pytest.approx(2.0)
    assert out.metrics["vf_clipfrac"].item() == 0.0


def test_value_loss_clipped_hand_example() -> None:
    """c = 0.5, V = 2, V_old = 1 so V_clip = 1.5.
    G = 0: max(½·2², ½·1.5²) = 2, the unclipped branch (gradient V − G = 2).
    G = 3: max(½·1², ½·1.5²) = 1.125, the clipped branch (no gradient): vf_clipfrac = ½.
    """
    values = tensor([[2.0, 2.0]]).requires_grad_(True)
    old_values = tensor([[1.0, 1.0]])
    returns = tensor([[0.0, 3.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = value_loss(values, old_values, returns, mask, clip=0.5)
    assert out.loss.item() == pytest.approx((2.0 + 1.125) / 2)
    torch.testing.assert_close(grad_of(out.loss, values), tensor([[1.0, 0.0]]))
    assert out.metrics["vf_clipfrac"].item() == pytest.approx(0.5)


def test_value_loss_huber_hand_example() -> None:
    """δ = 1: |x| = 3 → δ(|x| − δ/2) = 2.5 with slope sign(x)·δ; |x| = 0.5 → ½x² = 0.125."""
    values = tensor([[3.0, 0.5]]).requires_grad_(True)
    returns = torch.zeros(1, 2, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    out = value_loss(values, values.detach(), returns, mask, huber_delta=1.0)
    assert out.loss.item() == pytest.approx((2.5 + 0.125) / 2)
    torch.testing.assert_close(grad_of(out.loss, values), tensor([[0.5, 0.25]]))
    clipped = value_loss(values, tensor([[0.0, 0.0]]), returns, mask, clip=0.2, huber_delta=1.0)
    # token 1: max(2.5, f(0.2) = 0.02) = 2.5; token 2: max(0.125, 0.02) = 0.125
    assert clipped.loss.item() == pytest.approx((2.5 + 0.125) / 2)
    assert clipped.metrics["vf_clipfrac"].item() == 0.0


def test_vf_clipfrac_ignores_rounding_inside_the_clip_range() -> None:
    """V_old + (V − V_old) can round one ulp away from V; that step was not clipped."""
    values = tensor([[0.3, 0.7, -0.1, 2.5]])
    old_values = tensor([[0.1, -0.6, 0.35, 1.9]])
    returns = tensor([[5.0, -3.0, 2.0, -1.0]])
    out = value_loss(values, old_values, returns, torch.ones(1, 4, dtype=torch.bool), clip=10.0)
    assert out.metrics["vf_clipfrac"].item() == 0.0


# --- kl_estimate -----------------------------------------------------------------------------

log_probabilities = st.floats(-8.0, 0.0)


@given(
    pairs=st.lists(st.tuples(log_probabilities, log_probabilities), min_size=1, max_size=20),
    kind=st.sampled_from(["k2", "k3", "abs", "mse", "low_var_kl"]),
)
def test_k2_k3_and_abs_are_non_negative(pairs: list[tuple[float, float]], kind: str) -> None:
    logprobs, ref_logprobs = tensor([list(p) for p in zip(*pairs, strict=True)])
    assert torch.all(kl_estimate(logprobs, ref_logprobs, kind) >= 0)


@given(pairs=st.lists(st.tuples(log_probabilities, log_probabilities), min_size=1, max_size=20))
def test_kl_estimators_match_their_formulas_and_aliases(pairs: list[tuple[float, float]]) -> None:
    """With log r = log π_ref − log π: k1 = −log r, k2 = ½ (log r)², k3 = r − 1 − log r, |log r|."""
    logprobs, ref_logprobs = tensor([list(p) for p in zip(*pairs, strict=True)])
    log_r = ref_logprobs - logprobs
    expected = {
        "k1": -log_r,
        "k2": 0.5 * log_r**2,
        "k3": torch.exp(log_r) - 1 - log_r,
        "abs": log_r.abs(),
    }
    for kind, value in expected.items():
        torch.testing.assert_close(kl_estimate(logprobs, ref_logprobs, kind), value)
    for alias, kind in {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}.items():
        torch.testing.assert_close(
            kl_estimate(logprobs, ref_logprobs, alias),
            kl_estimate(logprobs, ref_logprobs, kind),
        )


@given(
    pairs=st.lists(st.tuples(st.floats(-40, 0), st.floats(-40, 0)), min_size=1, max_size=20),
    kind=st.sampled_from(["k1", "k2", "k3", "abs"]),
    clamp=st.floats(0.1, 10.0),
)
def test_clamp_bounds_every_estimate(
    pairs: list[tuple[float, float]], kind: str, clamp: float
) -> None:
    logprobs, ref_logprobs = tensor([list(p) for p in zip(*pairs, strict=True)])
    clamped = kl_estimate(logprobs, ref_logprobs, kind, clamp=clamp)
    raw = kl_estimate(logprobs, ref_logprobs, kind)
    assert torch.all(clamped.abs() <= clamp)
    torch.testing.assert_close(clamped, raw.clamp(-clamp, clamp))


STRAIGHT_THROUGH = [kind for kind in get_args(losses.KLKind) if kind.endswith("+")]


@given(
    pairs=st.lists(st.tuples(st.floats(-40, 0), st.floats(-40, 0)), min_size=1, max_size=20),
    kind=st.sampled_from(STRAIGHT_THROUGH),
    clamp=st.none() | st.floats(0.1, 10.0),
)
def test_straight_through_kinds_have_the_named_value_and_k2s_gradient(
    pairs: list[tuple[float, float]], kind: str, clamp: float | None
) -> None:
    """k⁺ = k2 − sg[k2] + sg[k]: the value of k (clamped as k is) to the bit, k2's gradient
    with respect to both arguments (unclamped)."""
    logprobs, ref_logprobs = tensor([list(p) for p in zip(*pairs, strict=True)])
    logprobs.requires_grad_(True)
    ref_logprobs.requires_grad_(True)
    weights = torch.linspace(-1.0, 2.0, logprobs.numel(), dtype=F64)
    plus = kl_estimate(logprobs, ref_logprobs, kind, clamp=clamp)
    named = kl_estimate(logprobs, ref_logprobs, kind[:-1], clamp=clamp)
    k2 = kl_estimate(logprobs, ref_logprobs, "k2")
    assert torch.equal(plus, named)
    expected = torch.autograd.grad((weights * k2).sum(), (logprobs, ref_logprobs))
    found = torch.autograd.grad((weights * plus).sum(), (logprobs, ref_logprobs))
    for grad, k2_grad in zip(found, expected, strict=True):
        torch.testing.assert_close(grad, k2_grad)


def test_straight_through_k3_follows_the_gradient_of_the_kl_it_estimates() -> None:
    """Exactly, over a categorical policy π = softmax(z): E_{y∼π}[∇_z k(y)] with the sampling
    distribution held fixed (what a loss on sampled tokens backpropagates) is ∇_z KL(π ‖ π_ref)
    for ``k3+`` and ``k2``, and ∇_z KL(π_ref ‖ π) for plain ``k3``."""
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):
        logits = torch.randn(6, generator=generator, dtype=F64, requires_grad=True)
        log_ref = torch.log_softmax(torch.randn(6, generator=generator, dtype=F64), -1)
        sampling = torch.softmax(logits.detach(), -1)

        def expected_gradient(
            kind: str,
            logits: Tensor = logits,
            log_ref: Tensor = log_ref,
            weights: Tensor = sampling,
        ) -> Tensor:
            estimate = kl_estimate(torch.log_softmax(logits, -1), log_ref, kind)
            return grad_of((weights * estimate).sum(), logits)

        def kl_gradient(
            forward: bool, logits: Tensor = logits, log_ref: Tensor = log_ref
        ) -> Tensor:
            log_policy = torch.log_softmax(logits, -1)
            log_p, log_q = (log_policy, log_ref) if forward else (log_ref, log_policy)
            return grad_of((log_p.exp() * (log_p - log_q)).sum(), logits)

        torch.testing.assert_close(expected_gradient("k3+"), kl_gradient(forward=True))
        torch.testing.assert_close(expected_gradient("k2"), kl_gradient(forward=True))
        torch.testing.assert_close(expected_gradient("k3"), kl_gradient(forward=False))
        assert not torch.allclose(kl_gradient(True), kl_gradient(False), atol=1e-3)


def test_kl_estimate_hand_example() -> None:
    """π(y) = ½, π_ref(y) = ¼: log r = −log 2; k1 = log 2, k2 = ½ log² 2, k3 = log 2 − ½."""
    logprobs, ref_logprobs = tensor([[math.log(0.5)]]), tensor([[math.log(0.25)]])
    log2 = math.log(2.0)
    expected = {"k1": log2, "k2": 0.5 * log2**2, "k3": log2 - 0.5, "abs": log2}
    for kind, value in expected.items():
        assert kl_estimate(logprobs, ref_logprobs, kind).item() == pytest.approx(value)
    far = kl_estimate(tensor([[0.0, -30.0]]), tensor([[-30.0, 0.0]]), "k1", clamp=10.0)
    torch.testing.assert_close(far, tensor([[10.0, -10.0]]))


def test_kl_estimate_accepts_any_leading_batch_shape() -> None:
    logprobs = torch.full((2, 3, 4), -1.0, dtype=F64)
    assert kl_estimate(logprobs, logprobs - 1.0, "k1").shape == (2, 3, 4)
    assert kl_estimate(logprobs[0, 0], logprobs[0, 0], "k3").shape == (4,)


SAMPLES = 200_000


def sampled_categorical_pairs() -> list[tuple[Tensor, Tensor, Tensor]]:
    """Three (log π, log π_ref, samples y ~ π) over 8 categories, from a fixed seed."""
    generator = torch.Generator().manual_seed(1234)
    pairs = []
    for scale in (0.5, 1.0, 2.0):
        log_policy = torch.log_softmax(scale * torch.randn(8, generator=generator, dtype=F64), -1)
        log_ref = torch.log_softmax(scale * torch.randn(8, generator=generator, dtype=F64), -1)
        samples = torch.multinomial(log_policy.exp(), SAMPLES, True, generator=generator)
        pairs.append((log_policy, log_ref, samples))
    return pairs


def exact_kl(log_p: Tensor, log_q: Tensor) -> float:
    return float((log_p.exp() * (log_p - log_q)).sum())


def mean_and_standard_error(estimates: Tensor) -> tuple[float, float]:
    return float(estimates.mean()), float(estimates.std() / math.sqrt(estimates.numel()))


def test_k1_and_k3_are_unbiased_for_kl_of_the_policy_from_the_reference() -> None:
    """E_{y∼π}[k(log π(y), log π_ref(y))] = KL(π‖π_ref) for k1 and k3 (within 4 standard errors)."""
    for log_policy, log_ref, samples in sampled_categorical_pairs():
        exact = exact_kl(log_policy, log_ref)
        for kind in ("k1", "k3"):
            estimates = kl_estimate(log_policy[samples], log_ref[samples], kind)
            mean, error = mean_and_standard_error(estimates)
            assert error < 0.05 * exact, "too few samples to test anything"
            assert abs(mean - exact) < 4 * error, f"{kind}: {mean} vs KL {exact} (se {error})"


def test_swapping_the_arguments_estimates_something_else() -> None:
    """kl_estimate(log π_ref, log π) on y ∼ π is biased for KL(π‖π_ref):
    E[k1] = −KL(π‖π_ref) and E[k3] = Σ π²/π_ref − 1 − KL(π‖π_ref), far from KL.
    """
    assert "Argument order matters" in (kl_estimate.__doc__ or "")
    for log_policy, log_ref, samples in sampled_categorical_pairs():
        exact = exact_kl(log_policy, log_ref)
        chi_square = float((torch.exp(2 * log_policy - log_ref)).sum() - 1)
        swapped_expectations = {"k1": -exact, "k3": chi_square - exact}
        for kind, expectation in swapped_expectations.items():
            swapped = kl_estimate(log_ref[samples], log_policy[samples], kind)
            mean, error = mean_and_standard_error(swapped)
            assert abs(mean - expectation) < 4 * error
            assert abs(mean - exact) > 10 * error, f"{kind}: swapping went unnoticed"


def test_unknown_kl_kind_suggests_the_closest() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(TypeCheckError, match=r"argument 'kind' is 'k4'"):
        kl_estimate(x, x, "k4")
    unchecked = kl_estimate.__wrapped__  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"unknown KL estimator kind 'low_var'"):
        unchecked(x, x, "low_var")
    with pytest.raises(ValueError, match=r"unknown KL estimator kind 'k4\+'; expected one of"):
        unchecked(x, x, "k4+")


# --- entropy and SFT -------------------------------------------------------------------------


def test_entropy_loss_hand_example() -> None:
    """−mean(H) over valid tokens: the bonus is a loss to minimise."""
    entropy = tensor([[1.0, 3.0, 100.0]]).requires_grad_(True)
    mask = torch.tensor([[True, True, False]])
    out = entropy_loss(entropy, mask)
    assert out.loss.item() == pytest.approx(-2.0)
    assert out.metrics["entropy"].item() == pytest.approx(2.0)
    torch.testing.assert_close(grad_of(out.loss, entropy), tensor([[-0.5, -0.5, 0.0]]))


def test_sft_loss_hand_example() -> None:
    """Negative log-likelihood: rows (−1, −3) and (−2) with seq-mean-token-mean → (2 + 2)/2."""
    logprobs = tensor([[-1.0, -3.0], [-2.0, -50.0]]).requires_grad_(True)
    mask = torch.tensor([[True, True], [True, False]])
    out = sft_loss(logprobs, mask, agg="seq-mean-token-mean")
    assert out.loss.item() == pytest.approx(2.0)
    assert out.metrics["nll"].item() == pytest.approx(2.0)
    torch.testing.assert_close(grad_of(out.loss, logprobs), tensor([[-0.25, -0.25], [-0.5, 0.0]]))


# --- SAC -------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha_as_tensor", [False, True])
def test_sac_critic_target_hand_example(alpha_as_tensor: bool) -> None:
    """y = r + γ (1 − term)(minᵢ Q'ᵢ − α log π'): row 1 bootstraps from min(3, 5) = 3,
    1 + 0.9 (3 − 0.5·(−1)) = 4.15; row 2 is terminated: y = r = 2.
    """
    rewards = tensor([1.0, 2.0]).requires_grad_(True)
    next_q = tensor([[3.0, 5.0], [4.0, 2.0]]).requires_grad_(True)
    next_logprobs = tensor([-1.0, -2.0]).requires_grad_(True)
    alpha: float | Tensor = tensor(0.5).requires_grad_(True) if alpha_as_tensor else 0.5
    for terminated in (torch.tensor([False, True]), torch.tensor([0.0, 1.0])):
        target = sac_critic_target(rewards, next_q, next_logprobs, terminated, 0.9, alpha)
        torch.testing.assert_close(target, tensor([4.15, 2.0]))
        assert not target.requires_grad
    alive = sac_critic_target(
        rewards, next_q, next_logprobs, torch.tensor([False, False]), 0.9, 0.5
    )
    torch.testing.assert_close(alive, tensor([4.15, 2.0 + 0.9 * (2.0 + 1.0)]))


def test_sac_critic_target_keeps_leading_batch_dimensions() -> None:
    rewards = torch.zeros(2, 3, dtype=F64)
    next_q = torch.arange(12, dtype=F64).reshape(2, 3, 2)
    target = sac_critic_target(rewards, next_q, rewards, rewards > 0, 1.0, 0.0)
    torch.testing.assert_close(target, next_q[..., 0])


def test_sac_critic_loss_hand_example() -> None:
    """Σᵢ ½ mean (Qᵢ − y)²: critic 1 gives ½·mean(1, 1) = 0.5, critic 2 ½·mean(0, 4) = 1."""
    q_values = tensor([[1.0, 2.0], [3.0, 4.0]]).requires_grad_(True)
    target = tensor([2.0, 2.0]).requires_grad_(True)
    out = sac_critic_loss(q_values, target)
    assert out.loss.item() == pytest.approx(1.5)
    torch.testing.assert_close(grad_of(out.loss, q_values), tensor([[-0.5, 0.0], [0.5, 1.0]]))
    assert torch.all(grad_of(out.loss, target) == 0), "the target must be held fixed"
    assert out.metrics["q_mean"].item() == pytest.approx(2.5)


@pytest.mark.parametrize("alpha_as_tensor", [False, True])
def test_sac_actor_loss_hand_example(alpha_as_tensor: bool) -> None:
    """mean(α log π − minᵢ Qᵢ) = mean(0.5·(−1) − 3, 0.5·(−2) − 2) = −3.25;
    ∂/∂log π = α/n, ∂/∂Q = −1/n on the smaller critic only; α receives no gradient.
    """
    logprobs = tensor([-1.0, -2.0]).requires_grad_(True)
    q_values = tensor([[3.0, 5.0], [4.0, 2.0]]).requires_grad_(True)
    alpha: float | Tensor = tensor(0.5).requires_grad_(True) if alpha_as_tensor else 0.5
    out = sac_actor_loss(logprobs, q_values, alpha)
    assert out.loss.item() == pytest.approx(-3.25)
    out.loss.backward()
    torch.testing.assert_close(logprobs.grad, tensor([0.25, 0.25]))
    torch.testing.assert_close(q_values.grad, tensor([[-0.5, 0.0], [0.0, -0.5]]))
    if isinstance(alpha, Tensor):
        assert alpha.grad is None
    assert out.metrics["entropy"].item() == pytest.approx(1.5)


@pytest.mark.parametrize(("entropy", "alpha_rises"), [(0.5, True), (3.0, False)])
def test_sac_temperature_rises_when_entropy_is_below_target(
    entropy: float, alpha_rises: bool
) -> None:
    """One SGD step on log α raises α when −E[log π] < H̄ = 2 and lowers it when above."""
    log_alpha = torch.tensor(0.0, dtype=F64, requires_grad=True)
    logprobs = tensor([-entropy - 0.5, -entropy + 0.5]).requires_grad_(True)
    out = sac_temperature_loss(log_alpha, logprobs, target_entropy=2.0)
    assert out.loss.item() == 0.0  # log α = 0
    (grad,) = torch.autograd.grad(out.loss, log_alpha)
    assert grad.item() == pytest.approx(entropy - 2.0)
    stepped = log_alpha - 0.1 * grad
    assert (stepped.exp() > out.metrics["alpha"]).item() is alpha_rises
    assert out.metrics["alpha"].item() == pytest.approx(1.0)
    shifted = sac_temperature_loss(torch.tensor(math.log(2.0), dtype=F64), logprobs, 2.0)
    assert shifted.loss.item() == pytest.approx(-math.log(2.0) * (2.0 - entropy))


def test_sac_temperature_loss_holds_the_log_probabilities_fixed() -> None:
    logprobs = tensor([-1.0, -2.0]).requires_grad_(True)
    out = sac_temperature_loss(tensor(0.3).requires_grad_(True), logprobs, 1.0)
    assert torch.all(grad_of(out.loss, logprobs) == 0)


# --- gradients against finite differences (float64, inputs away from every kink) -------------

# lp − old ∈ {±0.05 (inside [0.8, 1.28]), ±0.5 (outside), 1.5 (beyond a dual clip of 3)};
# advantages away from 0; one masked token.
LOGPROBS = tensor([[-1.0, -0.5, -2.0, -0.3], [-1.5, -0.7, -0.2, -3.0]])
OFFSETS = tensor([[0.05, -0.5, 0.5, 1.5], [-0.05, 0.5, -0.5, 1.5]])
ADVANTAGES = tensor([[1.0, -0.7, 0.4, -1.2], [-0.5, 2.0, -1.0, 0.3]])
MASK = torch.tensor([[True, True, True, True], [True, True, True, False]])
SEQUENCE_ADVANTAGES = tensor([[1.5] * 4, [-0.8] * 4])
# Sequence log-ratio means 0.05 (inside ±0.2) and 0.6 (outside, on the unclipped side for Â < 0).
GSPO_OFFSETS = tensor([[0.1, 0.0, 0.05, 0.05], [0.6, 0.5, 0.7, 9.0]])
# |V − V_old| ∈ {0.1, 1.0, 0.8, 0.3} against c = 0.5; residuals avoid the Huber corner δ = 1.
VALUES = tensor([[1.0, 2.0, -1.0, 0.2]])
OLD_VALUES = tensor([[0.9, 1.0, -0.2, 0.5]])
RETURNS = tensor([[0.1, 2.8, 1.5, 0.25]])


def gradient_cases() -> dict[str, tuple[Callable[..., Tensor], tuple[Tensor, ...]]]:
    """Each loss as a function of the inputs it is differentiable in."""
    old = LOGPROBS - OFFSETS
    value_mask = torch.ones(1, 4, dtype=torch.bool)
    cases: dict[str, tuple[Callable[..., Tensor], tuple[Tensor, ...]]] = {}
    for mode in MODES:
        cases[f"ppo[{mode}]"] = (
            lambda lp, o, a, mode=mode: ppo_policy_loss(lp, o, a, MASK, 0.2, 0.28, agg=mode).loss,
            (LOGPROBS, old, ADVANTAGES),
        )
    cases["ppo_dual_clip"] = (
        lambda lp, o, a: ppo_policy_loss(lp, o, a, MASK, 0.2, 0.28, 3.0).loss,
        (LOGPROBS, old, ADVANTAGES),
    )
    cases["vanilla"] = (
        lambda lp, a: vanilla_policy_loss(lp, a, MASK, "seq-mean-token-mean").loss,
        (LOGPROBS, ADVANTAGES),
    )
    for mode in MODES:
        cases[f"gspo[{mode}]"] = (
            lambda lp, mode=mode: (
                gspo_policy_loss(
                    lp, LOGPROBS - GSPO_OFFSETS, SEQUENCE_ADVANTAGES, MASK, 0.2, 0.2, agg=mode
                ).loss
            ),
            (LOGPROBS,),
        )
    cases["decoupled_ppo"] = (
        lambda lp: (
            decoupled_ppo_policy_loss(
                lp, old, old - 0.3 * OFFSETS, ADVANTAGES, MASK, 0.2, 0.28, 3.0, 1.4
            ).loss
        ),
        (LOGPROBS,),
    )
    cases["value"] = (
        lambda v, vo, r: value_loss(v, vo, r, value_mask).loss,
        (VALUES, OLD_VALUES, RETURNS),
    )
    cases["value_clipped"] = (
        lambda v, vo, r: value_loss(v, vo, r, value_mask, clip=0.5).loss,
        (VALUES, OLD_VALUES, RETURNS),
    )
    cases["value_clipped_huber"] = (
        lambda v, vo, r: value_loss(v, vo, r, value_mask, clip=0.5, huber_delta=1.0).loss,
        (VALUES, OLD_VALUES, RETURNS),
    )
    cases["entropy"] = (lambda h: entropy_loss(h, MASK, "seq-mean-token-sum").loss, (LOGPROBS,))
    cases["sft"] = (lambda lp: sft_loss(lp, MASK, "seq-mean-token-sum-norm").loss, (LOGPROBS,))
    for kind in ("k1", "k2", "k3", "abs"):
        cases[f"kl[{kind}]"] = (
            lambda lp, ref, kind=kind: kl_estimate(lp, ref, kind),
            (LOGPROBS, old),
        )
    # lp − ref spans ±0.5 and ±1.5; a clamp of 1 cuts k1 at 1.5 and leaves 0.5.
    cases["kl[k1, clamped]"] = (
        lambda lp, ref: kl_estimate(lp, ref, "k1", clamp=1.0),
        (LOGPROBS, old),
    )
    q_values = tensor([[1.0, 2.0], [3.5, 0.5], [0.2, -0.4]])
    cases["sac_critic"] = (lambda q: sac_critic_loss(q, tensor([1.5, 0.0, 1.0])).loss, (q_values,))
    cases["sac_actor"] = (
        lambda lp, q: sac_actor_loss(lp, q, 0.2).loss,
        (tensor([-1.0, -0.5, -2.0]), q_values),
    )
    cases["sac_temperature"] = (
        lambda log_alpha: sac_temperature_loss(log_alpha, tensor([-1.0, -0.5, -2.0]), -2.0).loss,
        (tensor(0.3),),
    )
    return cases


@pytest.mark.parametrize("name", sorted(gradient_cases()))
def test_gradients_match_finite_differences(name: str) -> None:
    function, inputs = gradient_cases()[name]
    leaves = tuple(x.clone().requires_grad_(True) for x in inputs)
    assert torch.autograd.gradcheck(function, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


# --- invalid hyperparameters -----------------------------------------------------------------

ONES = torch.zeros(1, 2, dtype=F64)
ALL = torch.ones(1, 2, dtype=torch.bool)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ppo_policy_loss(ONES, ONES, ONES, ALL, clip_low=1.0), r"clip_low .*got 1.0"),
        (lambda: ppo_policy_loss(ONES, ONES, ONES, ALL, clip_low=-0.1), r"clip_low .*got -0.1"),
        (lambda: ppo_policy_loss(ONES, ONES, ONES, ALL, clip_high=-0.2), r"clip_high .*got -0.2"),
        (lambda: ppo_policy_loss(ONES, ONES, ONES, ALL, dual_clip=1.0), r"dual_clip .*got 1.0"),
        (lambda: ppo_policy_loss(ONES, ONES, ONES, ALL, dual_clip=0.5), r"dual_clip .*got 0.5"),
        (lambda: gspo_policy_loss(ONES, ONES, ONES, ALL, clip_low=1.5), r"clip_low .*got 1.5"),
        (lambda: gspo_policy_loss(ONES, ONES, ONES, ALL, clip_high=-1.0), r"clip_high .*got -1"),
        (
            lambda: decoupled_ppo_policy_loss(ONES, ONES, ONES, ONES, ALL, clip_low=1.0),
            r"clip_low .*got 1.0",
        ),
        (
            lambda: decoupled_ppo_policy_loss(ONES, ONES, ONES, ONES, ALL, dual_clip=0.9),
            r"dual_clip .*got 0.9",
        ),
        (lambda: value_loss(ONES, ONES, ONES, ALL, clip=-0.2), r"clip must be positive, got -0.2"),
        (lambda: value_loss(ONES, ONES, ONES, ALL, clip=0.0), r"clip must be positive, got 0.0"),
        (lambda: value_loss(ONES, ONES, ONES, ALL, huber_delta=-1.0), r"huber_delta .*got -1.0"),
        (lambda: kl_estimate(ONES, ONES, "k3", clamp=-10.0), r"clamp must be positive, got -10"),
    ],
)
def test_invalid_hyperparameters_raise_value_errors_naming_them(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# --- shape errors name the argument and the dimension ----------------------------------------


def shape_error_cases() -> dict[str, tuple[Callable[[], object], list[str]]]:
    """A wrong-shaped call for every public function and what its message must contain."""
    good = torch.zeros(2, 3)
    long = torch.zeros(2, 4)
    mask = torch.ones(2, 3, dtype=torch.bool)
    time = "dimension 'time' is 4 but"
    return {
        "ppo_policy_loss": (
            lambda: ppo_policy_loss(good, long, good, mask),
            ["argument 'old_logprobs'", time],
        ),
        "vanilla_policy_loss": (
            lambda: vanilla_policy_loss(good, long, mask),
            ["argument 'advantages'", time],
        ),
        "gspo_policy_loss": (
            lambda: gspo_policy_loss(good, good, long, mask),
            ["argument 'advantages'", time],
        ),
        "decoupled_ppo_policy_loss": (
            lambda: decoupled_ppo_policy_loss(good, long, good, good, mask),
            ["argument 'proximal_logprobs'", time],
        ),
        "value_loss": (
            lambda: value_loss(good, good, torch.zeros(3, 3), mask),
            ["argument 'returns'", "dimension 'batch' is 3 but", "bound it to 2"],
        ),
        "kl_estimate": (
            lambda: kl_estimate(good, long),
            ["argument 'ref_logprobs'", time],
        ),
        "entropy_loss": (
            lambda: entropy_loss(good, torch.ones(2, 4, dtype=torch.bool)),
            ["argument 'mask'", "dimension 'time' is 4 but 'entropy' bound it to 3"],
        ),
        "sft_loss": (
            lambda: sft_loss(good, torch.ones(2, 4, dtype=torch.bool)),
            ["argument 'mask'", time],
        ),
        "sac_critic_target": (
            lambda: sac_critic_target(
                torch.zeros(4), torch.zeros(5, 2), torch.zeros(4), torch.zeros(4) > 0, 0.9, 0.1
            ),
            [
                "argument 'next_q_values'",
                "dimension 'batch' is (5,) but 'rewards' bound it to (4,)",
            ],
        ),
        "sac_critic_loss": (
            lambda: sac_critic_loss(torch.zeros(4, 2), torch.zeros(5)),
            ["argument 'target'", "dimension 'batch' is (5,) but 'q_values' bound it to (4,)"],
        ),
        "sac_actor_loss": (
            lambda: sac_actor_loss(torch.zeros(4), torch.zeros(3, 2), 0.1),
            ["argument 'q_values'", "dimension 'batch' is (3,) but 'logprobs' bound it to (4,)"],
        ),
        "sac_temperature_loss": (
            lambda: sac_temperature_loss(torch.zeros(1), torch.zeros(4), -1.0),
            ["argument 'log_alpha'", "shape (1,)", "needs 0 dims"],
        ),
    }


def test_every_public_function_has_a_shape_error_case() -> None:
    public = {name for name in losses.__all__ if inspect.isfunction(getattr(losses, name))}
    assert public == set(shape_error_cases())


@pytest.mark.parametrize("name", sorted(shape_error_cases()))
def test_wrong_shapes_raise_an_error_naming_argument_and_dimension(name: str) -> None:
    call, fragments = shape_error_cases()[name]
    assert_shape_error("rlcore.losses", name, call, fragments)


# --- registry defaults and far-off KL ----------------------------------------------------------


def test_unset_clip_bounds_take_each_losss_own_defaults() -> None:
    assert PolicyLossConfig().clip_range(0.2) == (0.2, 0.2)
    assert PolicyLossConfig().clip_range(3e-4, 4e-4) == (3e-4, 4e-4)
    assert PolicyLossConfig(clip_low=0.1).clip_range(3e-4, 4e-4) == (0.1, 0.1)
    assert PolicyLossConfig(clip_high=0.28).clip_range(0.2) == (0.2, 0.28)
    generator = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(3, 5, generator=generator, dtype=torch.float64)
    old = logprobs + 0.01 * torch.randn(3, 5, generator=generator, dtype=torch.float64)
    advantages = torch.randn(3, 5, generator=generator, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    batch = PolicyLossBatch(logprobs, old, advantages, mask)
    gspo = POLICY_LOSSES.get("gspo")(batch, PolicyLossConfig())
    expected = gspo_policy_loss(logprobs, old, advantages, mask, 3e-4, 4e-4, "token-mean")
    torch.testing.assert_close(gspo.loss, expected.loss)
    ppo = POLICY_LOSSES.get("ppo")(batch, PolicyLossConfig())
    torch.testing.assert_close(
        ppo.loss, ppo_policy_loss(logprobs, old, advantages, mask, 0.2, 0.2).loss
    )


def test_k3_stays_finite_for_a_far_off_reference() -> None:
    logprobs = torch.tensor([[-0.1, -0.1]], dtype=torch.float64)
    reference = torch.tensor([[-900.0, 800.0]], dtype=torch.float64)
    estimate = kl_estimate(logprobs, reference, "k3")
    assert torch.isfinite(estimate).all()
    assert torch.all(estimate > 0)


# --- per-token weights (rlcore.mismatch.rollout_importance_weights) ----------------------------

POLICY_LOSS_NAMES = ["ppo", "vanilla", "gspo", "decoupled_ppo"]
weight_values = st.floats(0.0, 3.0)


def weighted_policy_losses(
    batch: TokenBatch, mode: AggregationMode, normalizer: float | None = None
) -> dict[str, Callable[[Tensor, TokenBatch, Tensor | None], LossOutput]]:
    """Every policy loss as a function of (log π, the batch, the per-token weights)."""
    agg = {"agg": mode, "normalizer": normalizer}
    return {
        "ppo": lambda x, b, w: ppo_policy_loss(
            x, b.old_logprobs, b.advantages, b.mask, 0.2, 0.28, 3.0, **agg, weights=w
        ),
        "vanilla": lambda x, b, w: vanilla_policy_loss(x, b.advantages, b.mask, **agg, weights=w),
        "gspo": lambda x, b, w: gspo_policy_loss(
            x, b.old_logprobs, b.advantages, b.mask, 0.1, 0.2, **agg, weights=w
        ),
        "decoupled_ppo": lambda x, b, w: decoupled_ppo_policy_loss(
            x,
            b.ref_logprobs,
            b.old_logprobs,
            b.advantages,
            b.mask,
            0.2,
            0.28,
            3.0,
            2.0,
            **agg,
            weights=w,
        ),
    }


def draw_weights(data: st.DataObject, like: Tensor) -> Tensor:
    values = data.draw(st.lists(weight_values, min_size=like.numel(), max_size=like.numel()))
    return torch.tensor(values, dtype=like.dtype).view_as(like)


@given(batch=token_batches(), mode=modes)
def test_no_weights_equal_weights_of_one_exactly(batch: TokenBatch, mode: AggregationMode) -> None:
    for name, loss_fn in weighted_policy_losses(batch, mode).items():
        plain_x = batch.logprobs.clone().requires_grad_(True)
        ones_x = batch.logprobs.clone().requires_grad_(True)
        plain = loss_fn(plain_x, batch, None)
        ones = loss_fn(ones_x, batch, torch.ones_like(batch.logprobs))
        assert torch.equal(ones.loss, plain.loss), name
        assert torch.equal(grad_of(ones.loss, ones_x), grad_of(plain.loss, plain_x)), name
        for key, value in plain.metrics.items():
            assert torch.equal(ones.metrics[key], value), f"{name}: {key}"


@given(batch=token_batches(), mode=modes, data=st.data(), a=weight_values, b=weight_values)
def test_the_loss_is_linear_in_the_weights(
    batch: TokenBatch, mode: AggregationMode, data: st.DataObject, a: float, b: float
) -> None:
    """L(a·w₁ + b·w₂) = a·L(w₁) + b·L(w₂), and a constant weight c scales the loss by c."""
    w1, w2 = draw_weights(data, batch.logprobs), draw_weights(data, batch.logprobs)
    constant = torch.full_like(batch.logprobs, a)
    for name, loss_fn in weighted_policy_losses(batch, mode).items():
        x = batch.logprobs
        combined = loss_fn(x, batch, a * w1 + b * w2).loss
        separate = a * loss_fn(x, batch, w1).loss + b * loss_fn(x, batch, w2).loss
        torch.testing.assert_close(combined, separate, msg=name)
        scaled = loss_fn(x, batch, constant).loss
        torch.testing.assert_close(scaled, a * loss_fn(x, batch, None).loss, msg=name)


@given(batch=token_batches(), mode=modes, data=st.data())
def test_a_zero_weight_removes_exactly_that_tokens_gradient(
    batch: TokenBatch, mode: AggregationMode, data: st.DataObject
) -> None:
    """wₖ = 0: ∂L/∂log πₖ = 0 exactly; every other token's gradient is that of wₖ = 1."""
    weights = draw_weights(data, batch.logprobs)
    token = data.draw(st.integers(0, batch.logprobs.numel() - 1))
    dropped = weights.flatten().clone()
    dropped[token] = 0.0
    kept = weights.flatten().clone()
    kept[token] = 1.0
    others = torch.ones(batch.logprobs.numel(), dtype=torch.bool)
    others[token] = False
    for name, loss_fn in weighted_policy_losses(batch, mode).items():
        x_dropped = batch.logprobs.clone().requires_grad_(True)
        x_kept = batch.logprobs.clone().requires_grad_(True)
        grad_dropped = grad_of(loss_fn(x_dropped, batch, dropped.view_as(weights)).loss, x_dropped)
        grad_kept = grad_of(loss_fn(x_kept, batch, kept.view_as(weights)).loss, x_kept)
        assert grad_dropped.flatten()[token].item() == 0.0, name
        torch.testing.assert_close(
            grad_dropped.flatten()[others], grad_kept.flatten()[others], msg=name
        )


@given(
    batch=token_batches(), mode=modes, data=st.data(), fill=st.sampled_from([math.nan, math.inf])
)
def test_weights_at_masked_positions_are_ignored_and_carry_no_gradient(
    batch: TokenBatch, mode: AggregationMode, data: st.DataObject, fill: float
) -> None:
    """NaN/inf weights in padding change neither loss nor gradient; the weights are constants."""
    weights = draw_weights(data, batch.logprobs)
    dirty = torch.where(batch.mask, weights, fill).requires_grad_(True)
    for name, loss_fn in weighted_policy_losses(batch, mode).items():
        clean_x = batch.logprobs.clone().requires_grad_(True)
        dirty_x = batch.logprobs.clone().requires_grad_(True)
        clean = loss_fn(clean_x, batch, torch.where(batch.mask, weights, 0.0))
        result = loss_fn(dirty_x, batch, dirty)
        torch.testing.assert_close(result.loss, clean.loss, msg=name)
        grad = grad_of(result.loss, dirty_x)
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, grad_of(clean.loss, clean_x), msg=name)
        (weight_grad,) = torch.autograd.grad(result.loss, dirty, allow_unused=True)
        assert weight_grad is None, f"{name}: the weights received a gradient"


@given(batch=token_batches(), mode=modes, data=st.data(), cut=st.integers(0, 64))
def test_weighted_micro_batch_losses_add_up_to_the_whole_batchs(
    batch: TokenBatch, mode: AggregationMode, data: st.DataObject, cut: int
) -> None:
    """With the global normaliser the weighted losses of rows [0:k] and [k:n] sum to the whole's."""
    weights = draw_weights(data, batch.logprobs)
    rows = batch.mask.shape[0]
    split = cut % (rows + 1)
    normalizer = float(aggregation_normalizer(batch.mask, mode))
    fields = attrs.asdict(batch, recurse=False)
    for name, loss_fn in weighted_policy_losses(batch, mode, normalizer).items():
        whole = loss_fn(batch.logprobs, batch, weights).loss
        parts = torch.zeros((), dtype=whole.dtype)
        for part in (slice(0, split), slice(split, rows)):
            if part.start == part.stop:
                continue
            piece = TokenBatch(**{key: value[part] for key, value in fields.items()})
            parts = parts + loss_fn(piece.logprobs, piece, weights[part]).loss
        torch.testing.assert_close(parts, whole, msg=f"{name}: rows split at {split}")


def test_weights_hand_example() -> None:
    """REINFORCE, seq-mean-token-sum, Z = 1: L = −Σ wₜ Âₜ log πₜ = −(2·1·(−1) + 0.5·2·(−2)) = 4."""
    logprobs = tensor([[-1.0, -2.0, -3.0]]).requires_grad_(True)
    advantages = tensor([[1.0, 2.0, 5.0]])
    weights = tensor([[2.0, 0.5, 0.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = vanilla_policy_loss(logprobs, advantages, mask, "seq-mean-token-sum", 1.0, weights)
    assert out.loss.item() == pytest.approx(4.0)
    torch.testing.assert_close(grad_of(out.loss, logprobs), tensor([[-2.0, -1.0, 0.0]]))


@pytest.mark.parametrize("name", POLICY_LOSS_NAMES)
def test_registry_adapters_pass_the_weights_through(name: str) -> None:
    """PolicyLossBatch.weights reach the loss: weights of 3 triple it, weights of 0 zero it."""
    generator = torch.Generator().manual_seed(1)
    logprobs = -torch.rand(3, 5, generator=generator, dtype=F64)
    old = logprobs + 0.1 * torch.randn(3, 5, generator=generator, dtype=F64)
    advantages = torch.randn(3, 5, generator=generator, dtype=F64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    batch = PolicyLossBatch(logprobs, old, advantages, mask, proximal_logprobs=old)
    assert batch.weights is None
    loss_fn, config = POLICY_LOSSES.get(name), PolicyLossConfig()
    plain = loss_fn(batch, config).loss
    assert plain.item() != 0.0
    tripled = loss_fn(attrs.evolve(batch, weights=torch.full_like(old, 3.0)), config).loss
    torch.testing.assert_close(tripled, 3 * plain)
    zeroed = loss_fn(attrs.evolve(batch, weights=torch.zeros_like(old)), config).loss
    assert zeroed.item() == 0.0
