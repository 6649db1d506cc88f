"""Masked reductions and aggregation: plain torch on the valid entries, whatever the padding."""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jaxtyping import TypeCheckError
from torch import Tensor

from rlcore import masked
from rlcore.masked import (
    AggregationMode,
    aggregate,
    aggregation_normalizer,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from rlcore.testing import TokenBatch, masks, token_batches
from tests.core.shape_errors import assert_shape_error

MODES: list[AggregationMode] = list(get_args(AggregationMode))
NON_FINITE = [float("nan"), float("inf"), float("-inf")]


@st.composite
def masked_arrays(draw: st.DrawFn, max_dims: int = 3) -> tuple[Tensor, Tensor]:
    """float64 values of 1 to ``max_dims`` dims and a bool mask of the same shape."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=max_dims, min_side=1, max_side=5))
    values = draw(hnp.arrays(np.float64, shape, elements=st.floats(-100.0, 100.0)))
    mask = draw(hnp.arrays(np.bool_, shape))
    return torch.from_numpy(values), torch.from_numpy(mask)


def with_padding(values: Tensor, mask: Tensor, fill: float) -> Tensor:
    """``values`` with every masked position replaced by ``fill``."""
    return torch.where(mask, values, torch.full_like(values, fill))


def reference_aggregate(
    values: Tensor, mask: Tensor, mode: AggregationMode, horizon: int | None = None
) -> Tensor:
    """Each mode's formula, row by row, on the selected entries only."""
    every_row = [row[row_mask] for row, row_mask in zip(values, mask, strict=True)]
    rows = [row for row in every_row if row.numel() > 0]
    zero = torch.zeros((), dtype=values.dtype)
    if not rows:
        return zero
    total = torch.stack([row.sum() for row in rows]).sum()
    if mode == "token-mean":
        return torch.cat(rows).mean()
    if mode == "token-sum":
        return total
    if mode == "seq-mean-token-mean":
        return torch.stack([row.mean() for row in rows]).sum() / len(rows)
    if mode == "seq-mean-token-sum":
        return total / len(rows)
    # Dr. GRPO: every row counts, a fully masked one too.
    length = values.shape[-1] if horizon is None else horizon
    return total / (len(every_row) * length)


# --- masked_sum / masked_mean / masked_var / masked_whiten against plain torch ---------------


@given(data=masked_arrays())
def test_masked_sum_and_mean_equal_torch_on_the_selected_entries(
    data: tuple[Tensor, Tensor],
) -> None:
    values, mask = data
    selected = values[mask]
    torch.testing.assert_close(masked_sum(values, mask), selected.sum())
    expected_mean = selected.mean() if selected.numel() else torch.zeros((), dtype=values.dtype)
    torch.testing.assert_close(masked_mean(values, mask), expected_mean)


@given(data=masked_arrays(max_dims=3), axis_index=st.integers(0, 2))
def test_masked_sum_and_mean_along_an_axis_reduce_each_slice(
    data: tuple[Tensor, Tensor], axis_index: int
) -> None:
    """Reducing along one axis equals reducing each slice along it separately."""
    values, mask = data
    axis = axis_index % values.ndim
    sums = masked_sum(values, mask, axis=axis)
    means = masked_mean(values, mask, axis=axis)
    moved_values = values.movedim(axis, -1).reshape(-1, values.shape[axis])
    moved_mask = mask.movedim(axis, -1).reshape(-1, values.shape[axis])
    expected_sums = torch.stack(
        [row[keep].sum() for row, keep in zip(moved_values, moved_mask, strict=True)]
    )
    expected_means = torch.stack(
        [
            row[keep].mean() if keep.any() else torch.zeros((), dtype=values.dtype)
            for row, keep in zip(moved_values, moved_mask, strict=True)
        ]
    )
    torch.testing.assert_close(sums.reshape(-1), expected_sums)
    torch.testing.assert_close(means.reshape(-1), expected_means)


@given(data=masked_arrays())
def test_masked_var_equals_torch_var_of_the_selected_entries(data: tuple[Tensor, Tensor]) -> None:
    """Bessel-corrected by default; 0 when there are too few entries to have a spread."""
    values, mask = data
    selected = values[mask]
    zero = torch.zeros((), dtype=values.dtype)
    unbiased = selected.var(correction=1) if selected.numel() >= 2 else zero
    biased = selected.var(correction=0) if selected.numel() >= 1 else zero
    torch.testing.assert_close(masked_var(values, mask), unbiased)
    torch.testing.assert_close(masked_var(values, mask, unbiased=False), biased)


@given(data=masked_arrays(), shift_mean=st.booleans())
def test_masked_whiten_standardises_the_selected_entries_and_zeros_the_rest(
    data: tuple[Tensor, Tensor], shift_mean: bool
) -> None:
    values, mask = data
    eps = 1e-8
    selected = values[mask]
    whitened = masked_whiten(values, mask, shift_mean=shift_mean, eps=eps)
    assert torch.all(whitened[~mask] == 0)
    if selected.numel() == 0:
        return
    spread = selected.var(correction=1) if selected.numel() >= 2 else torch.zeros(())
    expected = (selected - selected.mean()) / torch.sqrt(spread + eps)
    if not shift_mean:
        expected = expected + selected.mean()
    torch.testing.assert_close(whitened[mask], expected)
    if shift_mean and selected.numel() >= 2 and spread > 1e-3:
        torch.testing.assert_close(masked_mean(whitened, mask), torch.zeros((), dtype=values.dtype))
        torch.testing.assert_close(masked_var(whitened, mask), torch.ones((), dtype=values.dtype))


# --- padding never leaks ---------------------------------------------------------------------


def reductions(mask: Tensor) -> dict[str, Callable[[Tensor], Tensor]]:
    """Every masked reduction as a scalar function of the values (whiten weighted, to be scalar)."""
    weights = torch.linspace(-1.0, 2.0, mask.numel(), dtype=torch.float64).reshape(mask.shape)
    found: dict[str, Callable[[Tensor], Tensor]] = {
        "masked_sum": lambda v: masked_sum(v, mask),
        "masked_mean": lambda v: masked_mean(v, mask),
        "masked_mean_axis": lambda v: masked_mean(v, mask, axis=-1).sum(),
        "masked_var": lambda v: masked_var(v, mask),
        "masked_var_biased": lambda v: masked_var(v, mask, unbiased=False),
        "masked_whiten": lambda v: (masked_whiten(v, mask) * weights).sum(),
        "masked_whiten_unshifted": lambda v: (
            masked_whiten(v, mask, shift_mean=False) * weights
        ).sum(),
    }
    if mask.ndim == 2:
        for mode in MODES:
            found[f"aggregate[{mode}]"] = lambda v, mode=mode: aggregate(v, mask, mode)
    return found


@given(data=masked_arrays(max_dims=2), fill=st.sampled_from(NON_FINITE))
def test_non_finite_padding_reaches_neither_results_nor_gradients(
    data: tuple[Tensor, Tensor], fill: float
) -> None:
    """NaN or ±inf at masked positions: results and gradients as with zero padding, 0 grad there."""
    values, mask = data
    clean = with_padding(values, mask, 0.0)
    dirty = with_padding(values, mask, fill)
    for name, reduce in reductions(mask).items():
        clean_input = clean.clone().requires_grad_(True)
        dirty_input = dirty.clone().requires_grad_(True)
        expected = reduce(clean_input)
        result = reduce(dirty_input)
        torch.testing.assert_close(result, expected, msg=f"{name}: padding changed the result")
        (expected_grad,) = torch.autograd.grad(expected, clean_input)
        (grad,) = torch.autograd.grad(result, dirty_input)
        assert torch.isfinite(grad).all(), f"{name}: non-finite gradient {grad}"
        assert torch.all(grad[~mask] == 0), f"{name}: masked positions received a gradient"
        torch.testing.assert_close(grad, expected_grad, msg=f"{name}: padding changed the gradient")


@pytest.mark.parametrize("shape", [(3,), (2, 4), (2, 3, 2)])
def test_all_masked_inputs_give_zero_not_nan(shape: tuple[int, ...]) -> None:
    mask = torch.zeros(shape, dtype=torch.bool)
    values = torch.full(shape, float("nan"), dtype=torch.float64, requires_grad=True)
    for name, reduce in reductions(mask).items():
        result = reduce(values)
        assert result.item() == 0.0, f"{name} gave {result.item()} on an all-masked input"
        (grad,) = torch.autograd.grad(result, values)
        assert torch.all(grad == 0), f"{name} gave gradient {grad} on an all-masked input"
    assert torch.all(masked_whiten(values, mask) == 0)
    if len(shape) == 2:
        rows, length = shape
        constants = {"token-sum": 1.0, "seq-mean-token-sum-norm": float(rows * length)}
        for mode in MODES:
            assert aggregation_normalizer(mask, mode).item() == constants.get(mode, 0.0), mode


# --- mask dtypes -----------------------------------------------------------------------------


@given(
    data=masked_arrays(max_dims=2),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64, torch.uint8]),
)
def test_numeric_zero_one_masks_act_like_bool_masks(
    data: tuple[Tensor, Tensor], dtype: torch.dtype
) -> None:
    values, mask = data
    numeric = mask.to(dtype)
    for name, reduce in reductions(mask).items():
        with_numeric = reductions(numeric)[name]
        torch.testing.assert_close(with_numeric(values), reduce(values), msg=name)
    if mask.ndim == 2:
        for mode in MODES:
            torch.testing.assert_close(
                aggregation_normalizer(numeric, mode), aggregation_normalizer(mask, mode)
            )


@pytest.mark.parametrize(
    ("bad", "shown"),
    [(0.5, "[0.5]"), (2.0, "[2.0]"), (-1.0, "[-1.0]"), (float("nan"), "[nan]")],
)
def test_masks_holding_other_values_than_zero_and_one_are_rejected(bad: float, shown: str) -> None:
    values = torch.ones(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, bad], [1.0, 1.0, 0.0]])
    message = rf"mask: a torch.float32 mask must hold only 0 and 1, found \{shown[:-1]}\]"
    calls: list[Callable[[], object]] = [
        lambda: masked_sum(values, mask),
        lambda: masked_mean(values, mask),
        lambda: masked_var(values, mask),
        lambda: masked_whiten(values, mask),
        lambda: aggregate(values, mask),
        lambda: aggregation_normalizer(mask, "token-mean"),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()


# --- aggregate -------------------------------------------------------------------------------


@given(
    batch=token_batches(max_batch=5, max_time=8),
    mode=st.sampled_from(MODES),
    horizon=st.none() | st.integers(1, 16),
)
def test_aggregate_equals_each_modes_formula_row_by_row(
    batch: TokenBatch, mode: AggregationMode, horizon: int | None
) -> None:
    values, mask = batch.advantages, batch.mask
    expected = reference_aggregate(values, mask, mode, horizon)
    torch.testing.assert_close(aggregate(values, mask, mode, horizon=horizon), expected)


@given(data=st.data(), batch=token_batches(max_batch=6, max_time=8), mode=st.sampled_from(MODES))
def test_parts_of_any_row_partition_add_up_to_the_whole_with_the_global_normalizer(
    data: st.DataObject, batch: TokenBatch, mode: AggregationMode
) -> None:
    """Split the rows k ways (k random, rows assigned at random, parts may be empty):
    Σ_parts aggregate(part, normalizer=Z_whole) = aggregate(whole), values and gradients.
    """
    rows = batch.mask.shape[0]
    parts = data.draw(st.integers(1, rows), label="parts")
    owner = torch.tensor(
        data.draw(st.lists(st.integers(0, parts - 1), min_size=rows, max_size=rows), label="owner")
    )
    values = batch.advantages.clone().requires_grad_(True)
    whole = aggregate(values, batch.mask, mode)
    normalizer = aggregation_normalizer(batch.mask, mode)
    total = torch.zeros((), dtype=values.dtype)
    for part in range(parts):
        rows_of_part = (owner == part).nonzero().flatten()
        total = total + aggregate(
            values[rows_of_part],
            batch.mask[rows_of_part],
            mode,
            normalizer=normalizer,
        )
    torch.testing.assert_close(total, whole)
    (whole_grad,) = torch.autograd.grad(whole, values)
    (parts_grad,) = torch.autograd.grad(total, values)
    torch.testing.assert_close(parts_grad, whole_grad)


COUNTED_MODES = [mode for mode in MODES if mode != "token-sum"]


@given(data=st.data(), mode=st.sampled_from(COUNTED_MODES), horizon=st.none() | st.integers(1, 16))
def test_normalizers_are_additive_over_row_partitions(
    data: st.DataObject, mode: AggregationMode, horizon: int | None
) -> None:
    """Every normaliser that is a count: Z(whole) = Σ Z(part), parts empty or not."""
    rows = data.draw(st.integers(1, 8), label="rows")
    mask = data.draw(masks((rows, data.draw(st.integers(1, 8), label="time"))), label="mask")
    owner = torch.tensor(
        data.draw(st.lists(st.integers(0, 2), min_size=rows, max_size=rows), label="owner")
    )
    parts = [aggregation_normalizer(mask[owner == part], mode, horizon) for part in range(3)]
    torch.testing.assert_close(sum(parts), aggregation_normalizer(mask, mode, horizon))


def draw_mask(data: st.DataObject, label: str) -> Tensor:
    """A mask of 0 to 6 rows (holes and fully masked rows allowed) and 1 to 8 steps."""
    shape = (data.draw(st.integers(0, 6), label="rows"), data.draw(st.integers(1, 8), label="time"))
    return data.draw(masks(shape), label=label)


@given(data=st.data())
def test_token_sums_normalizer_is_one_whatever_the_mask(data: st.DataObject) -> None:
    """The plain token sum: Z = 1 for any batch or part of one, so it is not summed over parts."""
    assert aggregation_normalizer(draw_mask(data, "mask"), "token-sum").item() == 1.0


@given(data=st.data(), horizon=st.none() | st.integers(1, 16))
def test_dr_grpos_normalizer_counts_every_row_whatever_its_tokens(
    data: st.DataObject, horizon: int | None
) -> None:
    """Z = B · L: the same for any two masks of one shape, fully masked rows included."""
    first = draw_mask(data, "first")
    rows, length = first.shape
    second = data.draw(masks((rows, length)), label="second")
    expected = float(rows * (length if horizon is None else horizon))
    for mask in (first, second, torch.zeros_like(first), torch.ones_like(first)):
        assert aggregation_normalizer(mask, "seq-mean-token-sum-norm", horizon).item() == expected


@given(batch=token_batches(max_batch=5, max_time=8), empty=st.integers(1, 3))
def test_fully_masked_rows_dilute_dr_grpos_loss_as_more_samples_would(
    batch: TokenBatch, empty: int
) -> None:
    """Appending k fully masked rows to B rows scales the loss by B / (B + k) (TRL's dr_grpo
    counts every sampled completion); the other modes ignore such rows."""
    values, mask = batch.advantages, batch.mask
    rows = values.shape[0]
    padded_values = torch.cat(
        [values, torch.full((empty, values.shape[1]), 5.0, dtype=values.dtype)]
    )
    padded_mask = torch.cat([mask, torch.zeros(empty, mask.shape[1], dtype=torch.bool)])
    for mode in MODES:
        expected = aggregate(values, mask, mode)
        if mode == "seq-mean-token-sum-norm":
            expected = expected * rows / (rows + empty)
        torch.testing.assert_close(aggregate(padded_values, padded_mask, mode), expected, msg=mode)


@given(batch=token_batches(max_batch=5, max_time=8), mode=st.sampled_from(MODES))
def test_default_normalizer_is_the_batchs_own(batch: TokenBatch, mode: AggregationMode) -> None:
    normalizer = aggregation_normalizer(batch.mask, mode)
    torch.testing.assert_close(
        aggregate(batch.advantages, batch.mask, mode),
        aggregate(batch.advantages, batch.mask, mode, normalizer=float(normalizer)),
    )


# Rows: two valid tokens, one valid token, none (an empty row is no sequence of the
# seq-mean modes, but one of Dr. GRPO's B rows).
HAND_VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
HAND_MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected", "normalizer"),
    [
        ("token-mean", (1 + 2 + 4) / 3, 3.0),
        ("token-sum", 1 + 2 + 4, 1.0),
        ("seq-mean-token-sum", ((1 + 2) + 4) / 2, 2.0),
        ("seq-mean-token-mean", ((1 + 2) / 2 + 4) / 2, 2.0),
        ("seq-mean-token-sum-norm", ((1 + 2) + 4) / (3 * 3), 9.0),
    ],
)
def test_aggregate_hand_examples(mode: AggregationMode, expected: float, normalizer: float) -> None:
    result = aggregate(HAND_VALUES, HAND_MASK, mode)
    assert result.item() == pytest.approx(expected)
    assert aggregation_normalizer(HAND_MASK, mode).item() == normalizer


def test_seq_mean_token_sum_norm_divides_by_the_given_horizon() -> None:
    """Dr. GRPO's constant: the generation budget L, not this batch's padded length."""
    result = aggregate(HAND_VALUES, HAND_MASK, "seq-mean-token-sum-norm", horizon=4)
    assert result.item() == pytest.approx(7 / (3 * 4))
    with pytest.raises(ValueError, match="horizon must be positive, got 0"):
        aggregate(HAND_VALUES, HAND_MASK, "seq-mean-token-sum-norm", horizon=0)


def test_explicit_normalizer_replaces_the_batchs_own() -> None:
    result = aggregate(HAND_VALUES, HAND_MASK, "token-mean", normalizer=torch.tensor(14.0))
    assert result.item() == pytest.approx(7 / 14)
    mean_of_rows = aggregate(HAND_VALUES, HAND_MASK, "seq-mean-token-mean", normalizer=5)
    assert mean_of_rows.item() == pytest.approx((1.5 + 4) / 5)


def test_unknown_mode_suggests_the_closest() -> None:
    with pytest.raises(TypeCheckError, match=r"argument 'mode' is 'token_mean' \(did you mean"):
        aggregate(HAND_VALUES, HAND_MASK, "token_mean")
    # Without run-time checking the function's own check gives the same hint.
    unchecked_aggregate = masked.aggregate.__wrapped__  # type: ignore[attr-defined]
    unchecked_normalizer = masked.aggregation_normalizer.__wrapped__  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"unknown aggregation mode 'seq-mean-tokn-sum' \(did you"):
        unchecked_aggregate(HAND_VALUES, HAND_MASK, "seq-mean-tokn-sum")
    with pytest.raises(ValueError, match=r"did you mean 'seq-mean-token-sum-norm'\?"):
        unchecked_normalizer(HAND_MASK, "seq-mean-token-sum-nrm")


# --- hand examples for the reductions --------------------------------------------------------


def test_masked_var_hand_example() -> None:
    values = torch.tensor([1.0, 2.0, 4.0, 1000.0], dtype=torch.float64)
    mask = torch.tensor([True, True, True, False])
    # μ = 7/3; Σ(x − μ)² = (16 + 1 + 25)/9 = 14/3
    assert masked_var(values, mask).item() == pytest.approx(14 / 3 / 2)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(14 / 3 / 3)
    single = torch.tensor([False, True, False, False])
    assert masked_var(values, single).item() == 0.0
    assert masked_var(values, single, unbiased=False).item() == 0.0


def test_masked_whiten_hand_example() -> None:
    values = torch.tensor([[1.0, 3.0, 1000.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    # μ = 2, σ² = 2 (Bessel): (∓1)/√2
    half = 1 / 2**0.5
    expected = torch.tensor([[-half, half, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(masked_whiten(values, mask, eps=0.0), expected)
    unshifted = torch.tensor([[2 - half, 2 + half, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(masked_whiten(values, mask, shift_mean=False, eps=0.0), unshifted)


def test_masked_mean_along_rows_hand_example() -> None:
    values = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(masked_mean(values, mask, axis=-1), torch.tensor([1.5, 4.0, 0.0]))
    torch.testing.assert_close(masked_sum(values, mask, axis=0), torch.tensor([5.0, 2.0, 0.0]))


# --- shape errors name the argument and the dimension ----------------------------------------


def shape_error_cases() -> dict[str, tuple[Callable[[], object], list[str]]]:
    """A wrong-shaped call for every public function and what its message must contain."""
    values = torch.zeros(3, 4)
    short = torch.ones(3, 5, dtype=torch.bool)
    return {
        "masked_sum": (lambda: masked_sum(values, short), ["'mask'", "dimension 'shape'"]),
        "masked_mean": (lambda: masked_mean(values, short), ["'mask'", "dimension 'shape'"]),
        "masked_var": (lambda: masked_var(values, short), ["'mask'", "dimension 'shape'"]),
        "masked_whiten": (lambda: masked_whiten(values, short), ["'mask'", "dimension 'shape'"]),
        "aggregate": (lambda: aggregate(values, short), ["'mask'", "dimension 'time'"]),
        "aggregation_normalizer": (
            lambda: aggregation_normalizer(torch.ones(4, dtype=torch.bool), "token-mean"),
            ["'mask'", "shape (4,)", "'batch time' needs 2 dims"],
        ),
    }


def test_every_public_function_has_a_shape_error_case() -> None:
    public = {name for name in masked.__all__ if callable(getattr(masked, name))}
    public -= {"AggregationMode"}
    assert public == set(shape_error_cases())


@pytest.mark.parametrize("name", sorted(shape_error_cases()))
def test_wrong_shapes_raise_an_error_naming_argument_and_dimension(name: str) -> None:
    call, fragments = shape_error_cases()[name]
    assert_shape_error("rlcore.masked", name, call, fragments)
