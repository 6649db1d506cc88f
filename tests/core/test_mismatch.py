"""Sampler–trainer mismatch: diagnostics and rollout importance weights, by their properties."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import get_args

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from rlcore import mismatch
from rlcore.mismatch import (
    ROLLOUT_IS_MODES,
    RolloutISMode,
    logprob_mismatch,
    rollout_importance_weights,
)
from rlcore.testing import TokenBatch, token_batches
from tests.core.shape_errors import assert_shape_error

F64 = torch.float64
MODES: list[RolloutISMode] = list(get_args(RolloutISMode))
TRUNCATE: list[RolloutISMode] = ["token_truncate", "sequence_truncate"]
MASK_MODES: list[RolloutISMode] = ["token_mask", "sequence_mask", "geometric_mask"]

modes = st.sampled_from(MODES)
thresholds = st.floats(1.01, 5.0)
lowers = st.none() | st.floats(0.05, 1.0)
fills = st.sampled_from([float("nan"), float("inf"), float("-inf")])


def reference_ratios(batch: TokenBatch, mode: RolloutISMode) -> Tensor:
    """The ratio each token's weight is built from, row by row from the valid tokens only.

    token: ρₜ = exp(clamp(δₜ, ±20));  sequence: exp(clamp(Σ clamp(δₜ), ±20));
    geometric: exp(mean clamp(δₜ)). Masked positions hold NaN: they have no ratio.
    """
    delta = (batch.logprobs - batch.old_logprobs).clamp(-20.0, 20.0)
    ratios = torch.full_like(delta, math.nan)
    for row in range(delta.shape[0]):
        valid = batch.mask[row]
        kept = delta[row][valid]
        if mode.startswith("token"):
            ratios[row][valid] = kept.exp()
        elif mode.startswith("sequence"):
            ratios[row][valid] = kept.sum().clamp(-20.0, 20.0).exp()
        else:
            ratios[row][valid] = kept.mean().exp()
    return ratios


def weights_of(
    batch: TokenBatch, mode: RolloutISMode, threshold: float, lower: float | None = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """Trainer log-probs ``logprobs``, sampler log-probs ``old_logprobs``."""
    return rollout_importance_weights(
        batch.logprobs, batch.old_logprobs, batch.mask, mode, threshold, lower
    )


def padded(batch: TokenBatch, fill: float) -> TokenBatch:
    hidden = ~batch.mask
    return TokenBatch(
        **{
            name: torch.where(hidden, torch.full_like(value, fill), value)
            if value.is_floating_point()
            else value
            for name, value in attrs.asdict(batch, recurse=False).items()
        }
    )


def test_the_modes_are_the_literal_names() -> None:
    names = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "geometric_mask")
    assert names == ROLLOUT_IS_MODES


# --- logprob_mismatch ---------------------------------------------------------------------------


@given(batch=token_batches())
def test_mismatch_metrics_match_their_definitions_on_the_valid_tokens(batch: TokenBatch) -> None:
    """Each metric against its formula over the valid entries; k3 ≥ 0 and mean |δ| ≤ max |δ|."""
    out = logprob_mismatch(batch.logprobs, batch.old_logprobs, batch.mask)
    delta = (batch.logprobs - batch.old_logprobs)[batch.mask]
    rows = [
        (batch.logprobs[i] - batch.old_logprobs[i])[batch.mask[i]].sum().abs()
        for i in range(batch.mask.shape[0])
        if batch.mask[i].any()
    ]
    if delta.numel() == 0:
        assert all(value.item() == 0.0 for value in out.values()), out
        return
    expected = {
        "abs_diff_mean": delta.abs().mean(),
        "abs_diff_max": delta.abs().max(),
        "kl_k1": (-delta).mean(),
        "kl_k3": (delta.exp() - 1 - delta).mean(),
        "seq_log_ratio_abs_mean": torch.stack(rows).mean(),
    }
    assert set(out) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(out[name], value, msg=name)
    assert out["kl_k3"].item() >= 0.0
    assert out["abs_diff_mean"] <= out["abs_diff_max"]


@given(batch=token_batches(), scale=st.floats(1.0, 40.0))
def test_k3_is_non_negative_even_far_off_policy(batch: TokenBatch, scale: float) -> None:
    rollout = batch.logprobs + scale * (batch.old_logprobs - batch.logprobs)
    out = logprob_mismatch(batch.logprobs, rollout, batch.mask)
    assert out["kl_k3"].item() >= 0.0
    assert all(torch.isfinite(value) for value in out.values()), out


@given(batch=token_batches())
def test_identical_logprobs_show_no_mismatch(batch: TokenBatch) -> None:
    out = logprob_mismatch(batch.logprobs, batch.logprobs.clone(), batch.mask)
    assert {name: value.item() for name, value in out.items()} == dict.fromkeys(out, 0.0)


@given(batch=token_batches(), fill=fills)
def test_mismatch_ignores_non_finite_padding(batch: TokenBatch, fill: float) -> None:
    clean = logprob_mismatch(batch.logprobs, batch.old_logprobs, batch.mask)
    dirty_batch = padded(batch, fill)
    dirty = logprob_mismatch(dirty_batch.logprobs, dirty_batch.old_logprobs, batch.mask)
    for name, value in clean.items():
        torch.testing.assert_close(dirty[name], value, msg=name)


def test_mismatch_hand_example() -> None:
    """δ = (0.5, −1) in row 0, (0.25) in row 1, one padded token holding −inf.

    mean |δ| = 1.75/3, max 1, k1 = mean(−δ) = 0.25/3, sequences |−0.5| and 0.25.
    """
    train = torch.tensor([[-1.0, -2.0, 0.0], [-0.75, -1.0, -1.0]], dtype=F64)
    rollout = torch.tensor([[-1.5, -1.0, -math.inf], [-1.0, -1.0, -1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = logprob_mismatch(train, rollout, mask)
    k3 = sum(math.exp(d) - 1 - d for d in (0.5, -1.0, 0.25)) / 3
    assert out["abs_diff_mean"].item() == pytest.approx(1.75 / 3)
    assert out["abs_diff_max"].item() == 1.0
    assert out["kl_k1"].item() == pytest.approx(0.25 / 3)
    assert out["kl_k3"].item() == pytest.approx(k3)
    assert out["seq_log_ratio_abs_mean"].item() == pytest.approx((0.5 + 0.25) / 2)


# --- rollout_importance_weights -----------------------------------------------------------------


@given(batch=token_batches(), mode=modes, threshold=thresholds, lower=lowers)
def test_identical_logprobs_give_weight_one_in_every_mode(
    batch: TokenBatch, mode: RolloutISMode, threshold: float, lower: float | None
) -> None:
    weights, metrics = rollout_importance_weights(
        batch.logprobs, batch.logprobs.clone(), batch.mask, mode, threshold, lower
    )
    assert torch.equal(weights, batch.mask.to(F64)), weights
    assert metrics["truncated_frac"].item() == 0.0
    assert metrics["masked_frac"].item() == 0.0
    assert metrics["weight_mean"].item() == (1.0 if batch.mask.any() else 0.0)


@given(
    batch=token_batches(),
    mode=st.sampled_from(TRUNCATE),
    threshold=thresholds,
    scale=st.floats(0.0, 3.0),
)
def test_truncated_weights_are_the_ratio_capped_at_the_threshold(
    batch: TokenBatch, mode: RolloutISMode, threshold: float, scale: float
) -> None:
    """wₜ = min(ρ, C): ≤ C everywhere, equal to ρ where ρ ≤ C; truncated_frac counts ρ > C."""
    batch = attrs.evolve(
        batch, old_logprobs=batch.logprobs + scale * (batch.old_logprobs - batch.logprobs)
    )
    weights, metrics = weights_of(batch, mode, threshold)
    ratios = reference_ratios(batch, mode)
    valid = batch.mask
    assert torch.all(weights <= threshold)
    below = valid & (ratios <= threshold)
    torch.testing.assert_close(weights[below], ratios[below])
    assert torch.all(weights[valid & (ratios > threshold)] == threshold)
    capped = (valid & (ratios > threshold)).sum().item()
    count = max(int(valid.sum()), 1)
    assert metrics["truncated_frac"].item() == pytest.approx(capped / count)
    assert metrics["masked_frac"].item() == 0.0
    kept = weights[valid]
    assert metrics["weight_mean"].item() == pytest.approx(
        kept.mean().item() if kept.numel() else 0.0
    )
    assert metrics["weight_max"].item() == (kept.max().item() if kept.numel() else 0.0)


@given(
    batch=token_batches(),
    mode=st.sampled_from(MASK_MODES),
    threshold=thresholds,
    lower=lowers,
    scale=st.floats(0.0, 3.0),
)
def test_mask_weights_are_one_exactly_where_the_ratio_lies_in_range(
    batch: TokenBatch, mode: RolloutISMode, threshold: float, lower: float | None, scale: float
) -> None:
    """wₜ ∈ {0, 1}, 1 exactly where L ≤ ρ ≤ C (L = 1/C by default); masked_frac counts the 0s."""
    batch = attrs.evolve(
        batch, old_logprobs=batch.logprobs + scale * (batch.old_logprobs - batch.logprobs)
    )
    weights, metrics = weights_of(batch, mode, threshold, lower)
    ratios = reference_ratios(batch, mode)
    low = 1.0 / threshold if lower is None else lower
    valid = batch.mask
    inside = valid & (ratios >= low) & (ratios <= threshold)
    assert torch.equal(weights, inside.to(F64))
    count = max(int(valid.sum()), 1)
    dropped = int((valid & ~inside).sum())
    assert metrics["masked_frac"].item() == pytest.approx(dropped / count)
    assert metrics["truncated_frac"].item() == 0.0


@given(
    batch=token_batches(),
    mode=st.sampled_from(["sequence_truncate", "sequence_mask", "geometric_mask"]),
    threshold=thresholds,
)
def test_sequence_weights_are_constant_along_each_sequence(
    batch: TokenBatch, mode: RolloutISMode, threshold: float
) -> None:
    weights, _ = weights_of(batch, mode, threshold)
    for row in range(weights.shape[0]):
        kept = weights[row][batch.mask[row]]
        if kept.numel():
            assert torch.all(kept == kept[0]), f"row {row}: {kept}"


@given(batch=token_batches(), mode=modes, threshold=thresholds, lower=lowers, fill=fills)
def test_masked_positions_change_nothing_and_get_weight_zero(
    batch: TokenBatch, mode: RolloutISMode, threshold: float, lower: float | None, fill: float
) -> None:
    clean, clean_metrics = weights_of(batch, mode, threshold, lower)
    dirty, dirty_metrics = weights_of(padded(batch, fill), mode, threshold, lower)
    assert torch.equal(dirty, clean)
    assert torch.all(dirty[~batch.mask] == 0)
    for name, value in clean_metrics.items():
        torch.testing.assert_close(dirty_metrics[name], value, msg=name)


@given(batch=token_batches(), mode=modes, threshold=thresholds)
def test_weights_and_metrics_carry_no_gradient(
    batch: TokenBatch, mode: RolloutISMode, threshold: float
) -> None:
    train = batch.logprobs.clone().requires_grad_(True)
    rollout = batch.old_logprobs.clone().requires_grad_(True)
    weights, metrics = rollout_importance_weights(train, rollout, batch.mask, mode, threshold)
    assert not weights.requires_grad
    assert not any(value.requires_grad for value in metrics.values())
    assert not any(
        value.requires_grad for value in logprob_mismatch(train, rollout, batch.mask).values()
    )


@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64]), mode=modes)
def test_weights_and_metrics_come_back_in_the_inputs_dtype(
    data: st.DataObject, dtype: torch.dtype, mode: RolloutISMode
) -> None:
    """The fractions too (``truncated_frac``, ``masked_frac``), whatever torch's default dtype."""
    batch = data.draw(token_batches(dtype=dtype), label="batch")
    weights, metrics = rollout_importance_weights(
        batch.logprobs, batch.old_logprobs, batch.mask, mode, 2.0
    )
    diagnostics = logprob_mismatch(batch.logprobs, batch.old_logprobs, batch.mask)
    assert weights.dtype == dtype
    found = {key: value.dtype for key, value in {**metrics, **diagnostics}.items()}
    assert found == dict.fromkeys(found, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_a_batch_with_no_valid_token_gives_zeros(mode: RolloutISMode) -> None:
    nan = torch.full((2, 3), math.nan, dtype=F64)
    none = torch.zeros(2, 3, dtype=torch.bool)
    weights, metrics = rollout_importance_weights(nan, nan, none, mode, 2.0)
    assert torch.equal(weights, torch.zeros_like(nan))
    assert {name: value.item() for name, value in metrics.items()} == dict.fromkeys(metrics, 0.0)
    diagnostics = logprob_mismatch(nan, nan, none)
    assert {k: v.item() for k, v in diagnostics.items()} == dict.fromkeys(diagnostics, 0.0)


def test_importance_weights_hand_example() -> None:
    """ρ = (2, 0.5, 1.1 | 0.25, padding): C = 1.5, L = 1/1.5.

    token_truncate (1.5, 0.5, 1.1 | 0.25); token_mask (0, 0, 1 | 0);
    sequence ρ = (1.1 | 0.25): truncate (1.1 ×3 | 0.25), mask (1 ×3 | 0);
    geometric ρ = (1.1^(1/3) | 0.25): mask (1 ×3 | 0).
    """
    rollout = torch.full((2, 3), -2.0, dtype=F64)
    ratios = torch.tensor([[2.0, 0.5, 1.1], [0.25, 1.0, 1.0]], dtype=F64)
    train = rollout + ratios.log()
    mask = torch.tensor([[True, True, True], [True, False, False]])
    expected = {
        "token_truncate": [[1.5, 0.5, 1.1], [0.25, 0.0, 0.0]],
        "token_mask": [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]],
        "sequence_truncate": [[1.1, 1.1, 1.1], [0.25, 0.0, 0.0]],
        "sequence_mask": [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
        "geometric_mask": [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
    }
    for mode in MODES:
        weights, _ = rollout_importance_weights(train, rollout, mask, mode, 1.5)
        torch.testing.assert_close(weights, torch.tensor(expected[mode], dtype=F64), msg=mode)
    _, token = rollout_importance_weights(train, rollout, mask, "token_truncate", 1.5)
    assert token["truncated_frac"].item() == pytest.approx(0.25)
    assert token["weight_mean"].item() == pytest.approx((1.5 + 0.5 + 1.1 + 0.25) / 4)
    assert token["weight_max"].item() == 1.5
    _, masked = rollout_importance_weights(train, rollout, mask, "token_mask", 1.5, lower=0.4)
    assert masked["masked_frac"].item() == pytest.approx(0.5)  # ρ = 2 and 0.25 dropped


def test_sequence_and_geometric_ratios_hand_example() -> None:
    """δ = 0.3 on 4 tokens, C = 1.5: ρ_geo = e^0.3 ≈ 1.35 is kept, ρ_seq = e^1.2 ≈ 3.32 is not;
    a row of δ = −0.3 mirrors it below L = 1/1.5.
    """
    rollout = torch.full((2, 5), -1.0, dtype=F64)
    train = rollout + torch.tensor([[0.3] * 5, [-0.3] * 5], dtype=F64)
    mask = torch.tensor([[True] * 4 + [False]] * 2)
    geometric, _ = rollout_importance_weights(train, rollout, mask, "geometric_mask", 1.5)
    sequence, metrics = rollout_importance_weights(train, rollout, mask, "sequence_mask", 1.5)
    truncated, _ = rollout_importance_weights(train, rollout, mask, "sequence_truncate", 1.5)
    assert geometric.tolist() == [[1.0] * 4 + [0.0]] * 2
    assert sequence.tolist() == [[0.0] * 5] * 2
    assert metrics["masked_frac"].item() == 1.0
    torch.testing.assert_close(
        truncated, torch.tensor([[1.5] * 4 + [0.0], [math.exp(-1.2)] * 4 + [0.0]], dtype=F64)
    )


@pytest.mark.parametrize(
    ("threshold", "lower", "message"),
    [
        (1.0, None, r"threshold must be greater than 1, got 1.0"),
        (0.5, None, r"threshold must be greater than 1, got 0.5"),
        (math.nan, None, r"threshold must be greater than 1, got nan"),
        (2.0, 0.0, r"lower must lie in \(0, 1\], got 0.0"),
        (2.0, -0.1, r"lower must lie in \(0, 1\], got -0.1"),
        (2.0, 1.5, r"lower must lie in \(0, 1\], got 1.5"),
        (2.0, math.nan, r"lower must lie in \(0, 1\], got nan"),
    ],
)
def test_invalid_bounds_raise_value_errors_naming_them(
    threshold: float, lower: float | None, message: str
) -> None:
    ones = torch.zeros(1, 2, dtype=F64)
    for mode in MODES:
        with pytest.raises(ValueError, match=message):
            rollout_importance_weights(ones, ones, ones > -1, mode, threshold, lower)


def test_lower_one_keeps_only_tokens_at_or_above_ratio_one() -> None:
    """L = 1 is allowed: ρ = 1 is kept, ρ slightly below 1 dropped."""
    rollout = torch.zeros(1, 2, dtype=F64)
    train = torch.tensor([[0.0, -1e-3]], dtype=F64)
    weights, _ = rollout_importance_weights(train, rollout, rollout == 0, "token_mask", 2.0, 1.0)
    assert weights.tolist() == [[1.0, 0.0]]


# --- shape errors name the argument and the dimension -----------------------------------------


def shape_error_cases() -> dict[str, tuple[Callable[[], object], list[str]]]:
    good = torch.zeros(2, 3)
    long = torch.zeros(2, 4)
    mask = torch.ones(2, 3, dtype=torch.bool)
    time = "dimension 'time' is 4 but"
    return {
        "logprob_mismatch": (
            lambda: logprob_mismatch(good, long, mask),
            ["argument 'rollout_logprobs'", time],
        ),
        "rollout_importance_weights": (
            lambda: rollout_importance_weights(good, good, long > 0, "token_truncate", 2.0),
            ["argument 'mask'", time],
        ),
    }


def test_every_public_function_has_a_shape_error_case() -> None:
    public = {name for name in mismatch.__all__ if inspect.isfunction(getattr(mismatch, name))}
    assert public == set(shape_error_cases())


@pytest.mark.parametrize("name", sorted(shape_error_cases()))
def test_wrong_shapes_raise_an_error_naming_argument_and_dimension(name: str) -> None:
    call, fragments = shape_error_cases()[name]
    assert_shape_error("rlcore.mismatch", name, call, fragments)
