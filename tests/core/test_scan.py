"""The reverse linear recurrence yₜ = xₜ + dₜ · yₜ₊₁ agrees with a plain loop over time."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlcore._scan import CHUNK, reverse_linear_recurrence, solve_

# T around every level of the two-level solver: empty, single step, the sequential cut-off
# (2·CHUNK), multiples of CHUNK and not, one and two levels of recursion, beyond CHUNK³.
INTERESTING_LENGTHS = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 23, 24, 63, 64, 65, 129, 200, 513, 600]


def reference_recurrence(
    x: torch.Tensor, decay: torch.Tensor, carry: torch.Tensor | None = None
) -> torch.Tensor:
    """yₜ = xₜ + dₜ · yₜ₊₁ by a reverse loop over time, one step at a time."""
    shape = torch.broadcast_shapes(x.shape, decay.shape)  # type: ignore[no-untyped-call]
    x, decay = x.expand(shape), decay.expand(shape)
    y = torch.empty_like(x)
    following = torch.zeros(x.shape[:-1], dtype=x.dtype) if carry is None else carry
    for t in range(x.shape[-1] - 1, -1, -1):
        following = x[..., t] + decay[..., t] * following
        y[..., t] = following
    return y


@st.composite
def recurrences(
    draw: st.DrawFn, max_leading_dims: int = 2, lengths: list[int] = INTERESTING_LENGTHS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(x, decay, carry) in float64 with decays in [0, 1], exact zeros and exact ones."""
    leading = tuple(draw(st.lists(st.integers(1, 3), max_size=max_leading_dims)))
    steps = draw(st.sampled_from(lengths) | st.integers(0, 40))
    shape = (*leading, steps)
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    x = torch.randn(shape, dtype=torch.float64, generator=generator)
    regime = draw(st.sampled_from(["uniform", "near_one", "ones"]))
    if regime == "uniform":
        decay = torch.rand(shape, dtype=torch.float64, generator=generator)
    elif regime == "near_one":
        decay = 1 - 0.05 * torch.rand(shape, dtype=torch.float64, generator=generator)
    else:
        decay = torch.ones(shape, dtype=torch.float64)
    zero_fraction = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    zeros = torch.rand(shape, dtype=torch.float64, generator=generator) < zero_fraction
    decay = decay.masked_fill(zeros, 0.0)
    carry = None
    if draw(st.booleans()):
        carry = torch.randn(leading, dtype=torch.float64, generator=generator)
    return x, decay, carry


@given(problem=recurrences())
def test_matches_the_reference_loop_in_float64(
    problem: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> None:
    """Any shape, carry or not, zero decays anywhere: agreement to ~1e-12."""
    x, decay, carry = problem
    expected = reference_recurrence(x, decay, carry)
    torch.testing.assert_close(
        reverse_linear_recurrence(x, decay, carry), expected, rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("steps", INTERESTING_LENGTHS)
@pytest.mark.parametrize("with_carry", [False, True])
def test_every_interesting_length_matches_the_reference(steps: int, with_carry: bool) -> None:
    """Each length, deterministically, with leading batch dims [2, 3]."""
    generator = torch.Generator().manual_seed(steps)
    x = torch.randn(2, 3, steps, dtype=torch.float64, generator=generator)
    decay = torch.rand(2, 3, steps, dtype=torch.float64, generator=generator)
    decay[..., ::5] = 0.0
    carry = torch.randn(2, 3, dtype=torch.float64, generator=generator) if with_carry else None
    torch.testing.assert_close(
        reverse_linear_recurrence(x, decay, carry),
        reference_recurrence(x, decay, carry),
        rtol=1e-12,
        atol=1e-12,
    )


def test_long_sequence_beyond_three_levels_of_chunks() -> None:
    """T = 8³ + 8² + 3 exercises three recursion levels and a ragged tail at each."""
    steps = CHUNK**3 + CHUNK**2 + 3
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, steps, dtype=torch.float64, generator=generator)
    decay = 0.99 + 0.01 * torch.rand(4, steps, dtype=torch.float64, generator=generator)
    decay[1, ::97] = 0.0
    carry = torch.randn(4, dtype=torch.float64, generator=generator)
    torch.testing.assert_close(
        reverse_linear_recurrence(x, decay, carry),
        reference_recurrence(x, decay, carry),
        rtol=1e-12,
        atol=1e-12,
    )


@given(problem=recurrences(lengths=[1, 17, 100]))
def test_float32_agrees_with_the_float64_reference(
    problem: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> None:
    """In float32 the re-association at chunk boundaries costs only float32 rounding."""
    x, decay, carry = problem
    single = None if carry is None else carry.float()
    actual = reverse_linear_recurrence(x.float(), decay.float(), single)
    assert actual.dtype == torch.float32
    expected = reference_recurrence(x.float().double(), decay.float().double(), carry)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-4, atol=1e-4)


@given(problem=recurrences())
def test_unit_decays_give_the_reverse_cumulative_sum(
    problem: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> None:
    """With dₜ = 1 everywhere, yₜ = Σₖ≥ₜ xₖ."""
    x, _, _ = problem
    expected = x.flip(-1).cumsum(-1).flip(-1)
    actual = reverse_linear_recurrence(x, torch.ones_like(x))
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-11)


@given(problem=recurrences())
def test_zero_decays_return_x_unchanged(
    problem: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> None:
    """With dₜ = 0 nothing flows backwards, the carry included: y = x exactly."""
    x, _, carry = problem
    assert torch.equal(reverse_linear_recurrence(x, torch.zeros_like(x), carry), x)


@given(problem=recurrences())
def test_a_zero_decay_cuts_the_sequence_into_independent_pieces(
    problem: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> None:
    """Before a zero decay at step k, y depends on nothing after k."""
    x, decay, carry = problem
    steps = x.shape[-1]
    if steps < 2:
        return
    cut = steps // 2
    decay = decay.clone()
    decay[..., cut] = 0.0
    y = reverse_linear_recurrence(x, decay, carry)
    changed = x.clone()
    changed[..., cut + 1 :] += 100.0
    y_changed = reverse_linear_recurrence(changed, decay, None)
    assert torch.equal(y[..., : cut + 1], y_changed[..., : cut + 1])


@given(problem=recurrences())
def test_solve_in_place_equals_the_functional_form(
    problem: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> None:
    """`solve_` overwrites x with y and returns nothing; the functional form leaves x alone."""
    x, decay, carry = problem
    original = x.clone()
    expected = reverse_linear_recurrence(x, decay, carry)
    assert torch.equal(x, original)
    buffer = x.clone()
    assert solve_(buffer, decay, carry) is None  # type: ignore[func-returns-value]
    assert torch.equal(buffer, expected)


def test_decay_and_carry_broadcast_over_leading_dims() -> None:
    """A decay of shape [time] and a carry of shape [] apply to every row."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 2, 50, dtype=torch.float64, generator=generator)
    decay = torch.rand(50, dtype=torch.float64, generator=generator)
    carry = torch.tensor(2.5, dtype=torch.float64)
    expected = reference_recurrence(x, decay.expand_as(x), carry.expand(3, 2))
    torch.testing.assert_close(
        reverse_linear_recurrence(x, decay, carry), expected, rtol=1e-12, atol=1e-12
    )


def test_broadcast_x_gives_a_fresh_full_sized_result() -> None:
    """x of shape [time] against decays [rows, time] solves every row separately."""
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    decay = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([[1.0, 2.0, 3.0], [6.0, 5.0, 3.0]], dtype=torch.float64)
    assert torch.equal(reverse_linear_recurrence(x, decay), expected)


def test_hand_computed_example_with_a_carry() -> None:
    """y₂ = 3 + ½·4 = 5, y₁ = 2 + ½·5 = 4.5, y₀ = 1 + ½·4.5 = 3.25."""
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    decay = torch.full_like(x, 0.5)
    y = reverse_linear_recurrence(x, decay, torch.tensor([4.0], dtype=torch.float64))
    assert y.tolist() == [[3.25, 4.5, 5.0]]


def test_hand_computed_example_across_a_chunk_boundary() -> None:
    """T = 20 > 2·CHUNK takes the chunked path: yₜ = Σₖ≥ₜ 2^(t−k) with x = 1, d = ½."""
    x = torch.ones(1, 20, dtype=torch.float64)
    y = reverse_linear_recurrence(x, torch.full_like(x, 0.5))
    expected = [2.0 - 0.5 ** (19 - t) for t in range(20)]
    torch.testing.assert_close(y[0], torch.tensor(expected, dtype=torch.float64))


def test_empty_inputs_are_returned_empty() -> None:
    assert reverse_linear_recurrence(torch.zeros(3, 0), torch.zeros(3, 0)).shape == (3, 0)
    assert reverse_linear_recurrence(torch.zeros(0, 5), torch.zeros(0, 5)).shape == (0, 5)


def test_solve_refuses_a_non_contiguous_buffer() -> None:
    """Working in place needs one contiguous buffer; a transposed view is refused, not garbled."""
    buffer = torch.zeros(5, 3).t()
    with pytest.raises(ValueError, match="contiguous"):
        solve_(buffer, torch.ones(3, 5))
