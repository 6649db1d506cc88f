"""Running statistics: update matches torch, merge is exact, order-free and has init as identity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jaxtyping import TypeCheckError

from rlcore import normalize
from rlcore.normalize import RunningStats

FEATURE_SHAPES = st.sampled_from([(), (1,), (3,), (2, 2)])
# Several orders of magnitude and a common offset: where a naive Σx² − n·μ² formula fails.
ELEMENTS = st.floats(-1e3, 1e3, allow_nan=False) | st.sampled_from([0.0, 1e3 + 0.5, 1e3 - 0.5])


@st.composite
def sample_batches(draw: st.DrawFn, min_samples: int = 0, max_samples: int = 12) -> torch.Tensor:
    """float64 samples ``[samples, *feature]``."""
    feature = draw(FEATURE_SHAPES)
    samples = draw(st.integers(min_samples, max_samples))
    array = draw(hnp.arrays(np.float64, (samples, *feature), elements=ELEMENTS))
    return torch.from_numpy(array)


def stats_of(samples: torch.Tensor) -> RunningStats:
    return normalize.update(normalize.init(tuple(samples.shape[1:])), samples)


def assert_same_stats(actual: RunningStats, expected: RunningStats) -> None:
    assert torch.equal(actual.count, expected.count)
    torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(actual.m2, expected.m2, rtol=1e-9, atol=1e-6)


# --- update ---------------------------------------------------------------------------------


@given(samples=sample_batches(min_samples=1))
def test_update_from_init_equals_torch_mean_and_variance(samples: torch.Tensor) -> None:
    """n, μ, σ² (biased and Bessel), σ: exactly what torch computes on the batch."""
    state = stats_of(samples)
    count = samples.shape[0]
    assert state.count.item() == count
    torch.testing.assert_close(state.mean, samples.mean(dim=0), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(
        normalize.variance(state), samples.var(dim=0, unbiased=False), rtol=1e-9, atol=1e-8
    )
    torch.testing.assert_close(
        normalize.std(state), samples.std(dim=0, unbiased=False), rtol=1e-9, atol=1e-6
    )
    unbiased = normalize.variance(state, unbiased=True)
    if count >= 2:
        torch.testing.assert_close(unbiased, samples.var(dim=0), rtol=1e-9, atol=1e-8)
    else:
        assert torch.all(unbiased == 0)


@given(samples=sample_batches(max_samples=20), cuts=st.lists(st.integers(0, 20), max_size=4))
def test_folding_batches_one_after_another_equals_one_update(
    samples: torch.Tensor, cuts: list[int]
) -> None:
    """Streaming: updating with consecutive pieces gives the statistics of the whole."""
    bounds = sorted({0, samples.shape[0], *(min(c, samples.shape[0]) for c in cuts)})
    state = normalize.init(tuple(samples.shape[1:]))
    for start, stop in itertools.pairwise(bounds):
        state = normalize.update(state, samples[start:stop])
    assert_same_stats(state, stats_of(samples))


def test_update_with_no_samples_returns_the_state_unchanged() -> None:
    state = stats_of(torch.tensor([[1.0, 2.0], [3.0, 5.0]], dtype=torch.float64))
    assert normalize.update(state, torch.zeros(0, 2)) is state


def test_update_is_pure_and_converts_to_the_state_dtype() -> None:
    """A float32 batch is folded into float64 state; the old state is left untouched."""
    state = normalize.init((2,))
    new = normalize.update(state, torch.tensor([[1.0, 2.0], [3.0, 6.0]]))
    assert new is not state
    assert state.count.item() == 0
    assert torch.all(state.mean == 0)
    assert torch.all(state.m2 == 0)
    assert new.mean.dtype == new.m2.dtype == new.count.dtype == torch.float64
    assert new.mean.tolist() == [2.0, 4.0]
    assert new.m2.tolist() == [2.0, 8.0]


def test_init_has_no_samples_and_zero_variance() -> None:
    state = normalize.init((3, 2))
    assert state.count.shape == ()
    assert state.count.item() == 0
    assert state.mean.shape == state.m2.shape == (3, 2)
    assert state.mean.dtype == torch.float64
    assert torch.all(normalize.variance(state) == 0)
    assert torch.all(normalize.variance(state, unbiased=True) == 0)
    assert normalize.init(dtype=torch.float32).mean.dtype == torch.float32


# --- merge ----------------------------------------------------------------------------------


@given(samples=sample_batches(), cut=st.integers(0, 12))
def test_merge_of_two_halves_equals_the_statistics_of_the_whole(
    samples: torch.Tensor, cut: int
) -> None:
    """Chan et al.'s parallel formula is exact: any split, empty parts included."""
    cut = min(cut, samples.shape[0])
    merged = normalize.merge(stats_of(samples[:cut]), stats_of(samples[cut:]))
    assert_same_stats(merged, stats_of(samples))


@given(first=sample_batches(), data=st.data())
def test_merge_is_commutative_and_associative(first: torch.Tensor, data: st.DataObject) -> None:
    """Worker statistics combine in any order."""
    feature = tuple(first.shape[1:])

    def more() -> RunningStats:
        count = data.draw(st.integers(0, 8))
        array = data.draw(hnp.arrays(np.float64, (count, *feature), elements=ELEMENTS))
        return stats_of(torch.from_numpy(array))

    a, b, c = stats_of(first), more(), more()
    assert_same_stats(normalize.merge(a, b), normalize.merge(b, a))
    left = normalize.merge(normalize.merge(a, b), c)
    right = normalize.merge(a, normalize.merge(b, c))
    assert_same_stats(left, right)


@given(samples=sample_batches())
def test_init_is_the_identity_of_merge(samples: torch.Tensor) -> None:
    """merge(init, s) = merge(s, init) = s, exactly."""
    state = stats_of(samples)
    empty = normalize.init(tuple(samples.shape[1:]))
    for merged in (normalize.merge(empty, state), normalize.merge(state, empty)):
        assert torch.equal(merged.count, state.count)
        assert torch.equal(merged.mean, state.mean)
        assert torch.equal(merged.m2, state.m2)


def test_merge_hand_example() -> None:
    """[1, 2] (μ 1.5, M₂ 0.5) with [3, 4] (μ 3.5, M₂ 0.5): δ = 2, M₂ = 1 + 4·2·2/4 = 5.

    The union [1, 2, 3, 4] has μ = 2.5, σ² = 5/4 and Bessel σ² = 5/3.
    """
    low = stats_of(torch.tensor([[1.0], [2.0]], dtype=torch.float64))
    high = stats_of(torch.tensor([[3.0], [4.0]], dtype=torch.float64))
    merged = normalize.merge(low, high)
    assert (merged.count.item(), merged.mean.item(), merged.m2.item()) == (4.0, 2.5, 5.0)
    assert normalize.variance(merged).item() == 1.25
    assert normalize.variance(merged, unbiased=True).item() == pytest.approx(5 / 3, rel=1e-15)


# --- normalize ------------------------------------------------------------------------------


@given(
    samples=sample_batches(min_samples=1),
    leading=st.lists(st.integers(1, 3), max_size=2),
    eps=st.sampled_from([1e-8, 1e-2]),
    data=st.data(),
)
def test_normalize_standardises_with_the_running_statistics(
    samples: torch.Tensor, leading: list[int], eps: float, data: st.DataObject
) -> None:
    """(x − μ)/√(σ² + ε) over any leading batch dims of x; clipping bounds it to ±clip."""
    state = stats_of(samples)
    feature = tuple(samples.shape[1:])
    x = torch.from_numpy(data.draw(hnp.arrays(np.float64, (*leading, *feature), elements=ELEMENTS)))
    expected = (x - samples.mean(dim=0)) / torch.sqrt(samples.var(dim=0, unbiased=False) + eps)
    out = normalize.normalize(state, x, eps=eps)
    torch.testing.assert_close(out, expected, rtol=1e-7, atol=1e-7)
    clip = data.draw(st.floats(0.1, 10.0))
    clipped = normalize.normalize(state, x, eps=eps, clip=clip)
    assert torch.all(clipped.abs() <= clip)
    torch.testing.assert_close(clipped, out.clamp(-clip, clip))


def test_normalize_hand_example_and_dtype() -> None:
    """From [1, 2, 3, 4]: μ = 2.5, σ² = 1.25, so 5 ↦ 2.5/√1.25 = √5, clipped to 2."""
    state = stats_of(torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=torch.float64))
    x = torch.tensor([[5.0], [2.5], [0.0]])
    out = normalize.normalize(state, x, eps=0.0)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[5**0.5], [0.0], [-(5**0.5)]]))
    clipped = normalize.normalize(state, x, eps=0.0, clip=2.0)
    torch.testing.assert_close(clipped, torch.tensor([[2.0], [0.0], [-2.0]]))


def test_normalize_before_any_sample_only_centres_by_zero() -> None:
    """With no samples σ² = 0 and μ = 0: x / √ε, never NaN."""
    out = normalize.normalize(normalize.init((2,)), torch.tensor([1.0, -2.0]), eps=1.0)
    assert out.tolist() == [1.0, -2.0]


@pytest.mark.parametrize("clip", [0.0, -1.0])
def test_normalize_refuses_a_clip_that_is_not_positive(clip: float) -> None:
    with pytest.raises(ValueError, match="clip must be positive"):
        normalize.normalize(normalize.init(), torch.zeros(3), clip=clip)


# --- wrong shapes and types -----------------------------------------------------------------


def test_update_with_a_wrong_feature_shape_names_batch_and_state() -> None:
    with pytest.raises(
        TypeCheckError,
        match=r"update: argument 'batch' has shape \(5, 4\): feature dimensions \(4,\) "
        r"after 'samples' but 'state' tracks \(3,\)",
    ):
        normalize.update(normalize.init((3,)), torch.zeros(5, 4))


def test_update_needs_a_samples_axis() -> None:
    with pytest.raises(TypeCheckError, match=r"argument 'batch' has shape \(\) \(0 dims\)"):
        normalize.update(normalize.init(), torch.zeros(()))


def test_merge_of_different_feature_shapes_names_both_arguments() -> None:
    with pytest.raises(
        TypeCheckError,
        match=r"merge: argument 'b' tracks feature shape \(2,\) but 'a' tracks \(3,\)",
    ):
        normalize.merge(normalize.init((3,)), normalize.init((2,)))


@pytest.mark.parametrize(
    ("shape", "trailing"), [((4, 2), r"\(2,\)"), ((3, 1), r"\(1,\)"), ((), r"\(\)")]
)
def test_normalize_with_a_wrong_trailing_shape_names_x_and_state(
    shape: tuple[int, ...], trailing: str
) -> None:
    with pytest.raises(
        TypeCheckError,
        match=rf"normalize: argument 'x' has shape .*: trailing dimensions {trailing} "
        r"but 'state' tracks \(3,\)",
    ):
        normalize.normalize(normalize.init((3,)), torch.zeros(shape))


def test_integer_samples_and_inputs_are_refused_by_name() -> None:
    with pytest.raises(TypeCheckError, match=r"argument 'batch' has dtype int64"):
        normalize.update(normalize.init((2,)), torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(TypeCheckError, match=r"argument 'x' has dtype int64"):
        normalize.normalize(normalize.init((2,)), torch.zeros(3, 2, dtype=torch.long))


def test_arguments_of_the_wrong_type_are_refused_by_name() -> None:
    with pytest.raises(TypeCheckError, match="parameter 'b'"):
        normalize.merge(normalize.init(), torch.zeros(()))  # type: ignore[arg-type]
    with pytest.raises(TypeCheckError, match="parameter 'state'"):
        normalize.variance(torch.zeros(()))  # type: ignore[arg-type]
    with pytest.raises(TypeCheckError, match="parameter 'state'"):
        normalize.std(torch.zeros(()))  # type: ignore[arg-type]
    with pytest.raises(TypeCheckError, match="parameter 'shape'"):
        normalize.init(shape=3)  # type: ignore[arg-type]
