"""Advantage estimators against reference loops, cross identities, registry adapters, errors."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from jaxtyping import TypeCheckError

from rlcore.advantages import (
    AdvantageBatch,
    AdvantageConfig,
    discounted_returns,
    gae,
    group_normalized,
    on_policy_distillation,
    reinforce_pp,
    rloo,
    token_gae,
)
from rlcore.masked import masked_whiten
from rlcore.registry import ADVANTAGES
from rlcore.testing import (
    TokenBatch,
    Trajectory,
    check_advantage_estimator,
    group_scores,
    masks,
    token_batches,
    trajectories,
)
from rlcore.tokens import broadcast_to_tokens, place_on_last_token
from rlcore.types import Advantages

UNIT = st.floats(0.0, 1.0)
# γ and λ at the edges of [0, 1] and inside: 0 and 1 switch whole terms off.
DISCOUNTS = st.sampled_from([0.0, 1.0]) | UNIT


def assert_tight(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to float64 rounding of differently associated sums (1e-10)."""
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


@st.composite
def dense_token_batches(
    draw: st.DrawFn, max_batch: int = 4, max_time: int = 40
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token_rewards, values, mask): seeded Gaussian tensors, masks full of holes."""
    shape = (draw(st.integers(1, max_batch)), draw(st.integers(1, max_time)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    rewards, values = (torch.randn(shape, dtype=torch.float64, generator=generator) for _ in "rv")
    density = draw(st.sampled_from([0.2, 0.5, 0.8]))
    return rewards, values, torch.rand(shape, generator=generator) < density


# Edge cases from rlcore.testing (empty rows, zeros, huge values) and dense random holes.
TOKEN_DATA = (
    token_batches().map(lambda batch: (batch.token_rewards, batch.values, batch.mask))
    | dense_token_batches()
)


def as_float(mask: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return mask.to(dtype)


# --- reference implementations, written from the docstrings' formulas -----------------------


def reference_gae(trajectory: Trajectory, gamma: float, lam: float) -> torch.Tensor:
    """δₜ = rₜ + γ(1 − termₜ)V'ₜ − Vₜ,  Aₜ = δₜ + γλ(1 − termₜ)(1 − truncₜ)Aₜ₊₁, step by step."""
    rewards, values, next_values = trajectory.rewards, trajectory.values, trajectory.next_values
    alive = as_float(~trajectory.terminated)
    continues = alive * as_float(~trajectory.truncated)
    advantages = torch.zeros_like(rewards)
    following = torch.zeros(rewards.shape[:-1], dtype=rewards.dtype)
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[..., t] + gamma * alive[..., t] * next_values[..., t] - values[..., t]
        following = delta + gamma * lam * continues[..., t] * following
        advantages[..., t] = following
    return advantages


def reference_discounted_returns(
    trajectory: Trajectory, gamma: float, bootstrap: bool = True
) -> torch.Tensor:
    """Gₜ = rₜ + γ(1 − termₜ)·(V'ₜ if truncₜ or t is last else Gₜ₊₁), V' = 0 without bootstrap."""
    rewards = trajectory.rewards.tolist()
    next_values = trajectory.next_values.tolist()
    terminated = trajectory.terminated.tolist()
    truncated = trajectory.truncated.tolist()
    returns = []
    for row in range(len(rewards)):
        steps = len(rewards[row])
        row_returns = [0.0] * steps
        following = 0.0
        for t in reversed(range(steps)):
            if truncated[row][t] or t == steps - 1:
                following = next_values[row][t] if bootstrap else 0.0
            if terminated[row][t]:
                following = 0.0
            following = rewards[row][t] + gamma * following
            row_returns[t] = following
        returns.append(row_returns)
    return torch.tensor(returns, dtype=torch.float64)


def reference_token_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over valid tokens only: at a masked token the next value and the GAE carry pass
    through unchanged and its reward is ignored; outputs there are 0."""
    advantages = torch.zeros_like(token_rewards)
    returns = torch.zeros_like(token_rewards)
    for row in range(token_rewards.shape[0]):
        next_value, carry = 0.0, 0.0
        for t in reversed(range(token_rewards.shape[1])):
            if not mask[row, t]:
                continue
            value = float(values[row, t])
            delta = float(token_rewards[row, t]) + gamma * next_value - value
            carry = delta + gamma * lam * carry
            next_value = value
            advantages[row, t] = carry
            returns[row, t] = carry + value
    return advantages, returns


def reference_token_returns(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Gₜ = rₜ + γ G at the next valid token, over valid tokens only (0 at masked ones)."""
    returns = torch.zeros_like(token_rewards)
    for row in range(token_rewards.shape[0]):
        following = 0.0
        for t in reversed(range(token_rewards.shape[1])):
            if mask[row, t]:
                following = float(token_rewards[row, t]) + gamma * following
                returns[row, t] = following
    return returns


def reference_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float) -> torch.Tensor:
    """(x − μ)/√(σ² + ε) over valid entries, σ² Bessel-corrected (0 below two entries)."""
    entries = values[mask].tolist()
    mean = statistics.fmean(entries) if entries else 0.0
    variance = statistics.variance(entries) if len(entries) >= 2 else 0.0
    whitened = (values - mean) / math.sqrt(variance + eps)
    return torch.where(mask, whitened, 0.0)


def reference_group_normalized(scores: torch.Tensor, eps: float, unbiased: bool) -> torch.Tensor:
    rows = []
    for group in scores.tolist():
        mean = statistics.fmean(group)
        spread = statistics.stdev(group) if unbiased else statistics.pstdev(group)
        rows.append([(s - mean) / (spread + eps) for s in group])
    return torch.tensor(rows, dtype=torch.float64)


def reference_leave_one_out(scores: torch.Tensor) -> torch.Tensor:
    rows = []
    for group in scores.tolist():
        others = [statistics.fmean(group[:i] + group[i + 1 :]) for i in range(len(group))]
        rows.append([s - o for s, o in zip(group, others, strict=True)])
    return torch.tensor(rows, dtype=torch.float64)


def run_gae(trajectory: Trajectory, gamma: float, lam: float) -> Advantages:
    return gae(
        trajectory.rewards,
        trajectory.values,
        trajectory.next_values,
        trajectory.terminated,
        trajectory.truncated,
        gamma,
        lam,
    )


def one_row(*rows: list[float]) -> list[torch.Tensor]:
    return [torch.tensor([row], dtype=torch.float64) for row in rows]


# --- gae ------------------------------------------------------------------------------------


@given(trajectory=trajectories(), gamma=DISCOUNTS, lam=DISCOUNTS)
def test_gae_matches_the_reference_loop(trajectory: Trajectory, gamma: float, lam: float) -> None:
    """Advantages follow the docstring's recursion; returns are Aₜ + Vₜ."""
    out = run_gae(trajectory, gamma, lam)
    expected = reference_gae(trajectory, gamma, lam)
    assert_tight(out.advantages, expected)
    assert_tight(out.returns, expected + trajectory.values)


@settings(max_examples=10)
@given(trajectory=trajectories(max_batch=2, max_time=300), gamma=UNIT, lam=UNIT)
def test_gae_matches_the_reference_loop_on_long_windows(
    trajectory: Trajectory, gamma: float, lam: float
) -> None:
    """Windows long enough for the chunked solver, episodes ending anywhere inside them."""
    assert_tight(run_gae(trajectory, gamma, lam).advantages, reference_gae(trajectory, gamma, lam))


@given(trajectory=trajectories(consistent_values=True), gamma=DISCOUNTS)
def test_gae_with_lambda_one_is_discounted_returns_minus_values(
    trajectory: Trajectory, gamma: float
) -> None:
    """With V'ₜ = Vₜ₊₁ inside episodes the TD errors telescope: A(λ=1) = G − V."""
    returns = discounted_returns(
        trajectory.rewards,
        trajectory.terminated,
        trajectory.truncated,
        gamma,
        trajectory.next_values,
    )
    assert_tight(run_gae(trajectory, gamma, 1.0).advantages, returns - trajectory.values)


@given(trajectory=trajectories(), gamma=DISCOUNTS)
def test_gae_with_lambda_zero_is_the_one_step_td_error(
    trajectory: Trajectory, gamma: float
) -> None:
    """A(λ=0) = δₜ = rₜ + γ(1 − termₜ)V'ₜ − Vₜ."""
    alive = as_float(~trajectory.terminated)
    td_error = trajectory.rewards + gamma * alive * trajectory.next_values - trajectory.values
    assert_tight(run_gae(trajectory, gamma, 0.0).advantages, td_error)


@given(trajectory=trajectories(), gamma=UNIT, lam=UNIT)
def test_gae_accepts_float_zero_one_masks(trajectory: Trajectory, gamma: float, lam: float) -> None:
    """terminated/truncated as float 0/1 tensors give exactly the bool result."""
    expected = run_gae(trajectory, gamma, lam)
    floats = attrs.evolve(
        trajectory,
        terminated=as_float(trajectory.terminated, torch.float32),
        truncated=as_float(trajectory.truncated),
    )
    out = run_gae(floats, gamma, lam)
    assert torch.equal(out.advantages, expected.advantages)
    assert torch.equal(out.returns, expected.returns)


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_gae_rejects_float_masks_that_are_not_zero_one(flag: str) -> None:
    rewards = torch.zeros(2, 3)
    flags = {"terminated": torch.zeros(2, 3), "truncated": torch.zeros(2, 3)}
    flags[flag] = torch.tensor([[0.0, 0.5, 1.0], [0.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=rf"{flag}: a torch.float32 mask must hold only 0 and 1"):
        gae(rewards, rewards, rewards, flags["terminated"], flags["truncated"], 0.9, 0.9)


def test_gae_terminated_and_truncated_differ_hand_example() -> None:
    """Step 1 ends the episode; γ = 0.9, λ = 0.8, so γλ = 0.72.

    r = [1, 2, 3], V = [0.5, 1, 1.5], V' = [1, 4, 2] (4 = value of step 1's final observation).
    δ₀ = 1 + 0.9·1 − 0.5 = 1.4 and δ₂ = 3 + 0.9·2 − 1.5 = 3.3 in every case.
    terminated: δ₁ = 2 − 1 = 1 (no bootstrap),  A = [1.4 + 0.72·1, 1, 3.3]
    truncated:  δ₁ = 2 + 3.6 − 1 = 4.6,          A = [1.4 + 0.72·4.6, 4.6, 3.3] (trace cut)
    neither:    A₁ = 4.6 + 0.72·3.3 = 6.976,     A₀ = 1.4 + 0.72·6.976
    """
    rewards, values, next_values = one_row([1.0, 2.0, 3.0], [0.5, 1.0, 1.5], [1.0, 4.0, 2.0])
    ended = torch.tensor([[False, True, False]])
    never = torch.zeros_like(ended)

    def advantages(terminated: torch.Tensor, truncated: torch.Tensor) -> list[float]:
        out = gae(rewards, values, next_values, terminated, truncated, gamma=0.9, lam=0.8)
        torch.testing.assert_close(out.returns, out.advantages + values)
        return out.advantages[0].tolist()

    assert advantages(ended, never) == pytest.approx([2.12, 1.0, 3.3], abs=1e-12)
    assert advantages(never, ended) == pytest.approx([4.712, 4.6, 3.3], abs=1e-12)
    assert advantages(never, never) == pytest.approx([6.42272, 6.976, 3.3], abs=1e-12)


def test_gae_last_step_bootstraps_like_a_truncation() -> None:
    """At the window's end A = r + γV' − V whether or not truncated is set there."""
    rewards, values, next_values = one_row([0.0, 1.0], [0.0, 0.25], [0.0, 2.0])
    flags = torch.tensor([[False, False]])
    truncated_last = torch.tensor([[False, True]])
    plain = gae(rewards, values, next_values, flags, flags, 0.5, 1.0).advantages
    cut = gae(rewards, values, next_values, flags, truncated_last, 0.5, 1.0).advantages
    assert plain[0, 1].item() == cut[0, 1].item() == 1.0 + 0.5 * 2.0 - 0.25


def test_gae_supports_leading_batch_dims() -> None:
    """[*batch, time] with two batch dims equals the reference on the same layout."""
    generator = torch.Generator().manual_seed(3)
    shape = (2, 3, 37)
    rewards, values, next_values = (
        torch.randn(shape, dtype=torch.float64, generator=generator) for _ in range(3)
    )
    terminated = torch.rand(shape, generator=generator) < 0.1
    truncated = (torch.rand(shape, generator=generator) < 0.1) & ~terminated
    trajectory = Trajectory(rewards, values, next_values, terminated, truncated)
    out = run_gae(trajectory, 0.97, 0.9)
    assert out.advantages.shape == shape
    assert_tight(out.advantages, reference_gae(trajectory, 0.97, 0.9))


def test_gae_handles_an_empty_window() -> None:
    empty = torch.zeros(2, 0, dtype=torch.float64)
    flags = torch.zeros(2, 0, dtype=torch.bool)
    out = gae(empty, empty, empty, flags, flags, 0.9, 0.9)
    assert out.advantages.shape == out.returns.shape == (2, 0)


@given(trajectory=trajectories(max_time=40), gamma=UNIT, lam=UNIT)
def test_time_major_buffers_transposed_give_the_same_result(
    trajectory: Trajectory, gamma: float, lam: float
) -> None:
    """Inputs that are transposed views of [time, batch] buffers (not contiguous) work."""

    def transposed_view(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.t().contiguous().t()

    fields = attrs.asdict(trajectory, recurse=False)
    strided = Trajectory(**{name: transposed_view(value) for name, value in fields.items()})
    torch.testing.assert_close(
        run_gae(strided, gamma, lam).advantages, run_gae(trajectory, gamma, lam).advantages
    )
    expected = discounted_returns(
        trajectory.rewards, trajectory.terminated, trajectory.truncated, gamma
    )
    actual = discounted_returns(strided.rewards, strided.terminated, strided.truncated, gamma)
    torch.testing.assert_close(actual, expected)
    mask = ~trajectory.terminated
    dense = token_gae(trajectory.rewards, trajectory.values, mask, gamma, lam)
    strided_mask = transposed_view(mask)
    sparse = token_gae(strided.rewards, strided.values, strided_mask, gamma, lam)
    torch.testing.assert_close(sparse.advantages, dense.advantages)
    dense = reinforce_pp(trajectory.rewards, mask, gamma)
    sparse = reinforce_pp(strided.rewards, strided_mask, gamma)
    torch.testing.assert_close(sparse.advantages, dense.advantages)


# --- discounted_returns ---------------------------------------------------------------------


@given(trajectory=trajectories(), gamma=DISCOUNTS)
def test_discounted_returns_match_the_reference_loop(trajectory: Trajectory, gamma: float) -> None:
    """With and without bootstrapping at truncations and the window's end."""
    flags = (trajectory.terminated, trajectory.truncated)
    with_values = discounted_returns(trajectory.rewards, *flags, gamma, trajectory.next_values)
    assert_tight(with_values, reference_discounted_returns(trajectory, gamma))
    without = discounted_returns(trajectory.rewards, *flags, gamma)
    expected = reference_discounted_returns(trajectory, gamma, bootstrap=False)
    assert_tight(without, expected)


def test_discounted_returns_hand_example() -> None:
    """γ = 0.5, r = [1, 1, 1, 1], step 1 truncated (V' = 8), step 3 last (V' = 4).

    G₃ = 1 + 0.5·4 = 3,  G₂ = 1 + 0.5·3 = 2.5,  G₁ = 1 + 0.5·8 = 5,  G₀ = 1 + 0.5·5 = 3.5;
    terminating step 3 instead drops its bootstrap: G₃ = 1, G₂ = 1.5.
    """
    rewards, next_values = one_row([1.0, 1.0, 1.0, 1.0], [0.0, 8.0, 0.0, 4.0])
    truncated = torch.tensor([[False, True, False, False]])
    terminated = torch.tensor([[False, False, False, True]])
    none = torch.zeros_like(truncated)
    returns = discounted_returns(rewards, none, truncated, 0.5, next_values)
    assert returns[0].tolist() == [3.5, 5.0, 2.5, 3.0]
    returns = discounted_returns(rewards, terminated, truncated, 0.5, next_values)
    assert returns[0].tolist() == [3.5, 5.0, 1.5, 1.0]


def test_discounted_returns_handle_an_empty_window() -> None:
    empty = torch.zeros(3, 0, dtype=torch.float64)
    flags = torch.zeros(3, 0, dtype=torch.bool)
    assert discounted_returns(empty, flags, flags, 0.9, empty).shape == (3, 0)
    assert discounted_returns(empty, flags, flags, 0.9).shape == (3, 0)


# --- token_gae ------------------------------------------------------------------------------


@given(data=TOKEN_DATA, gamma=DISCOUNTS, lam=DISCOUNTS)
def test_token_gae_matches_the_reference_loop(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], gamma: float, lam: float
) -> None:
    """Masks with holes and empty rows: masked tokens are passed over, outputs 0 there."""
    rewards, values, mask = data
    out = token_gae(rewards, values, mask, gamma, lam)
    advantages, returns = reference_token_gae(rewards, values, mask, gamma, lam)
    assert_tight(out.advantages, advantages)
    assert_tight(out.returns, returns)
    assert torch.all(out.advantages[~mask] == 0)
    assert torch.all(out.returns[~mask] == 0)


@settings(max_examples=10)
@given(
    mask=masks((2, 150)),
    seed=st.integers(0, 2**16),
    gamma=UNIT,
    lam=UNIT,
)
def test_token_gae_matches_the_reference_loop_on_long_rows(
    mask: torch.Tensor, seed: int, gamma: float, lam: float
) -> None:
    generator = torch.Generator().manual_seed(seed)
    rewards, values = (torch.randn(2, 150, dtype=torch.float64, generator=generator) for _ in "rv")
    out = token_gae(rewards, values, mask, gamma, lam)
    advantages, _ = reference_token_gae(rewards, values, mask, gamma, lam)
    assert_tight(out.advantages, advantages)


@given(data=TOKEN_DATA, gamma=UNIT, lam=UNIT)
def test_token_gae_on_a_holey_row_equals_token_gae_on_its_valid_tokens_alone(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor], gamma: float, lam: float
) -> None:
    """Multi-turn: tool/observation tokens between turns change nothing for the turns' tokens."""
    rewards, values, mask = data
    out = token_gae(rewards, values, mask, gamma, lam)
    for row in range(mask.shape[0]):
        valid = mask[row]
        if not valid.any():
            continue
        compact_rewards = rewards[row][valid].unsqueeze(0)
        compact_values = values[row][valid].unsqueeze(0)
        full = torch.ones_like(compact_rewards, dtype=torch.bool)
        compact = token_gae(compact_rewards, compact_values, full, gamma, lam)
        assert_tight(out.advantages[row][valid], compact.advantages[0])


@given(
    rewards_values=st.integers(1, 4)
    .flatmap(lambda rows: st.integers(1, 12).map(lambda steps: (rows, steps)))
    .flatmap(lambda shape: token_batches(max_batch=shape[0], max_time=shape[1])),
    gamma=UNIT,
    lam=UNIT,
)
def test_token_gae_with_a_full_mask_equals_gae_with_shifted_values(
    rewards_values: TokenBatch, gamma: float, lam: float
) -> None:
    """All tokens valid, no episode ends: V'ₜ = Vₜ₊₁ and V' = 0 after the last token."""
    rewards, values = rewards_values.token_rewards, rewards_values.values
    full = torch.ones_like(rewards, dtype=torch.bool)
    next_values = torch.nn.functional.pad(values[:, 1:], (0, 1))
    never = torch.zeros_like(full)
    expected = gae(rewards, values, next_values, never, never, gamma, lam)
    out = token_gae(rewards, values, full, gamma, lam)
    assert_tight(out.advantages, expected.advantages)
    assert_tight(out.returns, expected.returns)


@given(batch=token_batches(), gamma=UNIT, lam=UNIT, poison=st.sampled_from([math.nan, math.inf]))
def test_token_gae_ignores_anything_at_masked_positions(
    batch: TokenBatch, gamma: float, lam: float, poison: float
) -> None:
    """Rewards and values at masked positions, even NaN or inf, never reach the result."""
    expected = token_gae(batch.token_rewards, batch.values, batch.mask, gamma, lam)
    hidden = ~batch.mask
    rewards = batch.token_rewards.masked_fill(hidden, poison)
    values = batch.values.masked_fill(hidden, -poison)
    out = token_gae(rewards, values, batch.mask, gamma, lam)
    assert torch.equal(out.advantages, expected.advantages)
    assert torch.equal(out.returns, expected.returns)


def test_token_gae_hand_example_with_a_hole_and_an_empty_row() -> None:
    """γ = λ = 0.5, mask [1, 0, 1]: the hole's reward 5 and value 9 are passed over.

    t = 2: δ = 1 + 0 − 0.25 = 0.75 = A₂;  t = 0: δ = 0 + 0.5·0.25 − 0.5 = −0.375,
    A₀ = −0.375 + 0.25·0.75 = −0.1875;  returns A + V = [0.3125, 0, 1].
    """
    rewards = torch.tensor([[0.0, 5.0, 1.0], [1.0, 2.0, 3.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 9.0, 0.25], [1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    out = token_gae(rewards, values, mask, gamma=0.5, lam=0.5)
    assert out.advantages.tolist() == [[-0.1875, 0.0, 0.75], [0.0, 0.0, 0.0]]
    assert out.returns.tolist() == [[0.3125, 0.0, 1.0], [0.0, 0.0, 0.0]]


def test_token_gae_rejects_a_mask_that_is_not_zero_one() -> None:
    with pytest.raises(ValueError, match="must hold only 0 and 1"):
        token_gae(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 2.0]]))


# --- group_normalized and rloo --------------------------------------------------------------


@given(scores=group_scores(), eps=st.sampled_from([1e-6, 1e-4, 0.5]), unbiased=st.booleans())
def test_group_normalized_matches_the_reference(
    scores: torch.Tensor, eps: float, unbiased: bool
) -> None:
    """(s − mean)/(std + ε) per group, Bessel-corrected or not; equal groups give 0."""
    out = group_normalized(scores, eps=eps, unbiased=unbiased)
    varies = (scores != scores[:, :1]).any(dim=-1)
    if varies.any():
        expected = reference_group_normalized(scores[varies], eps, unbiased)
        assert_tight(out[varies], expected)
    assert torch.all(out[~varies] == 0)


@given(scores=group_scores())
def test_dr_grpo_only_centres_each_group(scores: torch.Tensor) -> None:
    """Dr. GRPO: Âᵢ = sᵢ − mean(s), so each group's advantages sum to 0."""
    out = group_normalized(scores, std_normalize=False)
    assert_tight(out, scores - scores.mean(dim=-1, keepdim=True))
    torch.testing.assert_close(out.sum(dim=-1), torch.zeros(scores.shape[0], dtype=scores.dtype))


@given(scores=group_scores())
def test_rloo_subtracts_the_mean_of_the_other_responses(scores: torch.Tensor) -> None:
    assert_tight(rloo(scores), reference_leave_one_out(scores))


@given(scores=group_scores())
def test_rloo_is_dr_grpo_scaled_by_n_over_n_minus_one(scores: torch.Tensor) -> None:
    n = scores.shape[-1]
    scaled = group_normalized(scores, std_normalize=False) * n / (n - 1)
    assert_tight(rloo(scores), scaled)


@given(
    value=st.floats(-1e6, 1e6) | st.sampled_from([0.1, 1 / 3, 0.7]),
    size=st.integers(2, 9),
    eps=st.sampled_from([0.0, 1e-6]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_groups_of_equal_scores_have_exactly_zero_advantage(
    value: float, size: int, eps: float, dtype: torch.dtype
) -> None:
    """All right or all wrong: no signal, so GRPO, Dr. GRPO and RLOO give exactly 0."""
    scores = torch.full((3, size), value, dtype=dtype)
    scores[1] = 1.0
    for advantages in (
        group_normalized(scores, eps=eps),
        group_normalized(scores, std_normalize=False),
        rloo(scores),
    ):
        assert torch.all(advantages == 0), advantages


def test_group_normalized_hand_example() -> None:
    """[1, 0, 0, 1]: mean ½, Bessel std √(1/3), so Â = ±½·√3; the biased std ½ gives ±1."""
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    half_root_three = 0.5 * math.sqrt(3.0)
    out = group_normalized(scores, eps=0.0)
    expected = [[half_root_three, -half_root_three, -half_root_three, half_root_three], [0.0] * 4]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64))
    out = group_normalized(scores, eps=0.0, unbiased=False)
    assert out.tolist() == [[1.0, -1.0, -1.0, 1.0], [0.0] * 4]
    out = group_normalized(scores)  # ε = 1e-6 added to the std
    assert out[0, 0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-6), rel=1e-12)
    assert group_normalized(scores, std_normalize=False)[0].tolist() == [0.5, -0.5, -0.5, 0.5]


def test_rloo_hand_example() -> None:
    """[1, 2, 6]: 1 − (2+6)/2 = −3, 2 − (1+6)/2 = −1.5, 6 − (1+2)/2 = 4.5."""
    scores = torch.tensor([[1.0, 2.0, 6.0]], dtype=torch.float64)
    assert rloo(scores).tolist() == [[-3.0, -1.5, 4.5]]


@pytest.mark.parametrize(
    "estimator",
    [group_normalized, lambda s: group_normalized(s, std_normalize=False), rloo],
    ids=["grpo", "dr_grpo", "rloo"],
)
@pytest.mark.parametrize("size", [0, 1])
def test_groups_smaller_than_two_are_refused(
    estimator: Callable[[torch.Tensor], torch.Tensor], size: int
) -> None:
    with pytest.raises(ValueError, match=r"shape \(3, \d\).*group_size >= 2"):
        estimator(torch.zeros(3, size))


# --- reinforce_pp ---------------------------------------------------------------------------


@given(
    data=TOKEN_DATA,
    gamma=DISCOUNTS,
    use_baseline=st.booleans(),
    eps=st.sampled_from([1e-8, 1e-2]),
)
def test_reinforce_pp_matches_the_reference(
    data: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    gamma: float,
    use_baseline: bool,
    eps: float,
) -> None:
    """Returns over valid tokens, minus a per-row baseline, whitened over all valid tokens."""
    rewards, _, mask = data
    rows = mask.shape[0]
    baseline = torch.linspace(-2.0, 3.0, rows, dtype=torch.float64) if use_baseline else None
    out = reinforce_pp(rewards, mask, gamma, baseline, eps=eps)
    returns = reference_token_returns(rewards, mask, gamma)
    assert_tight(out.returns, returns)
    centred = returns if baseline is None else returns - baseline.unsqueeze(-1)
    expected = reference_whiten(centred, mask, eps)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-9, atol=1e-9)


@given(batch=token_batches(), gamma=UNIT, use_baseline=st.booleans())
def test_reinforce_pp_advantages_are_whitened(
    batch: TokenBatch, gamma: float, use_baseline: bool
) -> None:
    """Over the valid tokens: mean 0, and (Bessel) variance 1 when there is spread."""
    rows = batch.mask.shape[0]
    baseline = torch.arange(rows, dtype=torch.float64) if use_baseline else None
    out = reinforce_pp(batch.token_rewards, batch.mask, gamma, baseline)
    valid = out.advantages[batch.mask]
    assert torch.all(out.advantages[~batch.mask] == 0)
    if valid.numel() == 0:
        return
    assert abs(valid.mean().item()) < 1e-9
    centred = out.returns[batch.mask]
    if baseline is not None:
        centred = centred - baseline.unsqueeze(-1).expand_as(out.returns)[batch.mask]
    if valid.numel() >= 2 and centred.var().item() > 1e-3:
        assert valid.var().item() == pytest.approx(1.0, rel=1e-4)


def test_reinforce_pp_hand_example() -> None:
    """γ = ½, rewards [[1, 0, 2], [0, 4, ·]] with the last token of row 1 masked.

    Returns [[1.5, 1, 2], [2, 4, 0]]. Valid returns 1.5, 1, 2, 2, 4: mean 2.1, Bessel
    variance 5.2/4 = 1.3. With baseline b = [1, 3]: 0.5, 0, 1, −1, 1: mean 0.3, variance 0.7.
    """
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 4.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    out = reinforce_pp(rewards, mask, gamma=0.5, eps=0.0)
    assert out.returns.tolist() == [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]]
    expected = torch.tensor([[-0.6, -1.1, -0.1], [-0.1, 1.9, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected / math.sqrt(1.3))
    baseline = torch.tensor([1.0, 3.0], dtype=torch.float64)
    out = reinforce_pp(rewards, mask, gamma=0.5, baseline=baseline, eps=0.0)
    assert out.returns.tolist() == [[1.5, 1.0, 2.0], [2.0, 4.0, 0.0]]
    expected = torch.tensor([[0.2, -0.3, 0.7], [-1.3, 0.7, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected / math.sqrt(0.7))


def test_reinforce_pp_passes_returns_over_holes() -> None:
    """γ = ½, mask [1, 0, 1]: G₀ = 1 + ½·G₂ with G₂ = 4; the hole's reward 100 is ignored."""
    rewards = torch.tensor([[1.0, 100.0, 4.0]], dtype=torch.float64)
    out = reinforce_pp(rewards, torch.tensor([[1, 0, 1]]), gamma=0.5)
    assert out.returns.tolist() == [[3.0, 0.0, 4.0]]


# --- on_policy_distillation -----------------------------------------------------------------


@given(batch=token_batches())
def test_on_policy_distillation_is_teacher_minus_student_logprob(batch: TokenBatch) -> None:
    """Âₜ = log π_teacher − log π_student at valid tokens, 0 at masked ones."""
    difference = batch.ref_logprobs - batch.logprobs
    unmasked = on_policy_distillation(batch.logprobs, batch.ref_logprobs)
    assert torch.equal(unmasked, difference)
    masked = on_policy_distillation(batch.logprobs, batch.ref_logprobs, batch.mask)
    assert torch.equal(masked, torch.where(batch.mask, difference, 0.0))


def test_on_policy_distillation_hand_example() -> None:
    """The student is over-confident on token 0 (−0.1 vs −2.0) and under on token 1."""
    student = torch.tensor([[-0.1, -3.0, -1.0]])
    teacher = torch.tensor([[-2.0, -0.5, -1.0]])
    out = on_policy_distillation(student, teacher, torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[-1.9, 2.5, 0.0]]))


# --- discount errors ------------------------------------------------------------------------

BAD_DISCOUNTS = [(-0.1, 0.9, "gamma"), (1.5, 0.9, "gamma"), (0.9, -0.01, "lam"), (0.9, 1.01, "lam")]


@pytest.mark.parametrize(("gamma", "lam", "name"), BAD_DISCOUNTS)
def test_discounts_outside_the_unit_interval_are_refused(
    gamma: float, lam: float, name: str
) -> None:
    x = torch.zeros(1, 3)
    flags = torch.zeros(1, 3, dtype=torch.bool)
    message = rf"{name} must lie in \[0, 1\], got {gamma if name == 'gamma' else lam}"
    with pytest.raises(ValueError, match=message):
        gae(x, x, x, flags, flags, gamma, lam)
    with pytest.raises(ValueError, match=message):
        token_gae(x, x, ~flags, gamma, lam)
    if name == "gamma":
        with pytest.raises(ValueError, match=message):
            discounted_returns(x, flags, flags, gamma)
        with pytest.raises(ValueError, match=message):
            reinforce_pp(x, ~flags, gamma)


# --- advantages carry no gradient -----------------------------------------------------------


def test_outputs_carry_no_gradient_even_from_inputs_that_require_it() -> None:
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    flags = torch.zeros(2, 5, dtype=torch.bool)
    mask = torch.ones(2, 5, dtype=torch.bool)
    scores = torch.randn(2, 4, requires_grad=True)
    baseline = torch.randn(2, dtype=torch.float64, requires_grad=True)
    outputs: list[torch.Tensor] = [
        *attrs.astuple(gae(x, x, x, flags, flags, 0.9, 0.9), recurse=False),
        *attrs.astuple(token_gae(x, x, mask, 0.9, 0.9), recurse=False),
        *attrs.astuple(reinforce_pp(x, mask, 0.9, baseline), recurse=False),
        discounted_returns(x, flags, flags, 0.9, x),
        group_normalized(scores),
        group_normalized(scores, std_normalize=False),
        rloo(scores),
        on_policy_distillation(x, x * 2, mask),
    ]
    for output in outputs:
        assert not output.requires_grad
        assert output.grad_fn is None


# --- wrong shapes name the argument and the dimension ---------------------------------------


def _zeros(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float64)


def _flags(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bool)


WRONG_SHAPES: list[tuple[str, Callable[[], object], str]] = [
    (
        "gae",
        lambda: gae(_zeros(2, 5), _zeros(2, 4), _zeros(2, 5), _flags(2, 5), _flags(2, 5), 1, 1),
        r"gae: argument 'values' has shape \(2, 4\): dimension 'time' is 4",
    ),
    (
        "gae_batch",
        lambda: gae(_zeros(2, 5), _zeros(2, 5), _zeros(2, 5), _flags(2, 5), _flags(3, 5), 1, 1),
        r"gae: argument 'truncated' has shape \(3, 5\): dimension 'batch' is \(3,\)",
    ),
    (
        "token_gae",
        lambda: token_gae(_zeros(2, 5), _zeros(2, 5), _flags(2, 4)),
        r"token_gae: argument 'mask' has shape \(2, 4\): dimension 'time' is 4",
    ),
    (
        "token_gae_rank",
        lambda: token_gae(_zeros(2, 3, 5), _zeros(2, 3, 5), _flags(2, 3, 5)),
        r"token_gae: argument 'token_rewards' has shape \(2, 3, 5\) \(3 dims\)",
    ),
    (
        "discounted_returns",
        lambda: discounted_returns(_zeros(2, 5), _flags(2, 5), _flags(2, 5), 1, _zeros(2, 6)),
        r"discounted_returns: argument 'next_values' has shape \(2, 6\): dimension 'time' is 6",
    ),
    (
        "group_normalized",
        lambda: group_normalized(_zeros(8)),
        r"group_normalized: argument 'scores' has shape \(8,\) \(1 dims\)",
    ),
    (
        "rloo",
        lambda: rloo(_zeros(2, 4, 1)),
        r"rloo: argument 'scores' has shape \(2, 4, 1\) \(3 dims\)",
    ),
    (
        "reinforce_pp",
        lambda: reinforce_pp(_zeros(2, 5), _flags(2, 5), 1.0, _zeros(3)),
        r"reinforce_pp: argument 'baseline' has shape \(3,\): dimension 'batch' is 3",
    ),
    (
        "on_policy_distillation",
        lambda: on_policy_distillation(_zeros(2, 5), _zeros(2, 6)),
        r"on_policy_distillation: argument 'teacher_logprobs' has shape \(2, 6\): "
        r"dimension 'time' is 6",
    ),
    (
        "on_policy_distillation_mask",
        lambda: on_policy_distillation(_zeros(2, 5), _zeros(2, 5), _flags(1, 5)),
        r"on_policy_distillation: argument 'mask' has shape \(1, 5\): dimension 'batch' is 1",
    ),
]


@pytest.mark.parametrize(
    ("call", "message"), [case[1:] for case in WRONG_SHAPES], ids=[c[0] for c in WRONG_SHAPES]
)
def test_wrong_shapes_raise_a_type_check_error_naming_argument_and_dimension(
    call: Callable[[], object], message: str
) -> None:
    with pytest.raises(TypeCheckError, match=message):
        call()


def test_float_scores_are_required() -> None:
    with pytest.raises(TypeCheckError, match=r"argument 'scores' has dtype int64"):
        rloo(torch.zeros(2, 3, dtype=torch.long))


# --- registry adapters ----------------------------------------------------------------------

ESTIMATOR_CASES = [
    ("gae", AdvantageConfig(gamma=0.99, lam=0.95)),
    ("gae", AdvantageConfig(gamma=1.0, lam=1.0, whiten=False)),
    ("grpo", AdvantageConfig()),
    ("dr_grpo", AdvantageConfig()),
    ("rloo", AdvantageConfig()),
    ("reinforce_pp", AdvantageConfig(gamma=0.9)),
    ("reinforce_pp_baseline", AdvantageConfig()),
    ("reinforce_pp_baseline", AdvantageConfig(gamma=0.9)),
    ("reinforce_pp_baseline", AdvantageConfig(baseline_form="score")),
    ("opd", AdvantageConfig()),
]


def test_every_built_in_estimator_is_registered() -> None:
    expected = {"gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "opd"}
    assert expected <= set(ADVANTAGES.names())
    assert {name for name, _ in ESTIMATOR_CASES} == expected


@pytest.mark.parametrize(("name", "config"), ESTIMATOR_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("group_size", [2, 3])
def test_every_registered_estimator_passes_the_public_property_check(
    name: str, config: AdvantageConfig, group_size: int
) -> None:
    check_advantage_estimator(
        ADVANTAGES.get(name), config, group_size=group_size, max_examples=12, shrink=False
    )


def _advantage_batch(batch: TokenBatch, group_size: int) -> AdvantageBatch:
    return AdvantageBatch(
        token_rewards=batch.token_rewards,
        mask=batch.mask,
        group_size=group_size,
        values=batch.values,
        logprobs=batch.logprobs,
        teacher_logprobs=batch.ref_logprobs,
    )


@given(
    group_size=st.integers(2, 3).flatmap(
        lambda n: st.tuples(st.just(n), token_batches(batch_multiple_of=n))
    ),
    gamma=UNIT,
    lam=UNIT,
)
def test_registry_adapters_compute_what_the_functions_compute(
    group_size: tuple[int, TokenBatch], gamma: float, lam: float
) -> None:
    """Each adapter is its function applied to the batch's outcome scores or tokens."""
    n, batch = group_size
    data = _advantage_batch(batch, n)
    config = AdvantageConfig(gamma=gamma, lam=lam, eps=1e-4)
    scores = torch.where(batch.mask, batch.token_rewards, 0.0).sum(-1).view(-1, n)

    def on_tokens(per_sequence: torch.Tensor) -> torch.Tensor:
        return broadcast_to_tokens(per_sequence.reshape(-1), batch.mask)

    def run(name: str) -> torch.Tensor:
        return ADVANTAGES.get(name)(data, config).advantages

    torch.testing.assert_close(run("grpo"), on_tokens(group_normalized(scores, eps=1e-4)))
    dr_grpo = on_tokens(group_normalized(scores, std_normalize=False))
    torch.testing.assert_close(run("dr_grpo"), dr_grpo)
    torch.testing.assert_close(run("rloo"), on_tokens(rloo(scores)))
    plain = reinforce_pp(batch.token_rewards, batch.mask, gamma)
    torch.testing.assert_close(run("reinforce_pp"), plain.advantages)
    group_mean = scores.mean(-1, keepdim=True).expand_as(scores).reshape(-1)
    baseline = reinforce_pp(batch.token_rewards, batch.mask, gamma, baseline=group_mean)
    torch.testing.assert_close(run("reinforce_pp_baseline"), baseline.advantages)
    score_form = ADVANTAGES.get("reinforce_pp_baseline")(
        data, AdvantageConfig(baseline_form="score")
    )
    centred = on_tokens(scores - scores.mean(-1, keepdim=True))
    torch.testing.assert_close(score_form.advantages, masked_whiten(centred, batch.mask))
    torch.testing.assert_close(score_form.returns, on_tokens(scores))
    token = token_gae(batch.token_rewards, batch.values, batch.mask, gamma, lam)
    torch.testing.assert_close(run("gae"), masked_whiten(token.advantages, batch.mask))
    unwhitened = ADVANTAGES.get("gae")(data, attrs.evolve(config, whiten=False))
    torch.testing.assert_close(unwhitened.advantages, token.advantages)
    torch.testing.assert_close(unwhitened.returns, token.returns)
    opd = on_policy_distillation(batch.logprobs, batch.ref_logprobs, batch.mask)
    torch.testing.assert_close(run("opd"), opd)


@pytest.mark.parametrize(
    ("name", "field"),
    [("gae", "values"), ("opd", "logprobs"), ("opd", "teacher_logprobs")],
)
def test_estimators_name_the_missing_field_they_need(name: str, field: str) -> None:
    tensors = {"values": _zeros(2, 3), "logprobs": _zeros(2, 3), "teacher_logprobs": _zeros(2, 3)}
    tensors[field] = None  # type: ignore[assignment]
    batch = AdvantageBatch(_zeros(2, 3), _flags(2, 3), 2, **tensors)
    with pytest.raises(ValueError, match=rf"estimator '{name}' needs AdvantageBatch.{field}$"):
        ADVANTAGES.get(name)(batch, AdvantageConfig())


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
@pytest.mark.parametrize(("rows", "group_size"), [(4, 1), (4, 3), (5, 2)])
def test_group_estimators_refuse_a_group_size_that_does_not_divide_the_batch(
    name: str, rows: int, group_size: int
) -> None:
    batch = AdvantageBatch(_zeros(rows, 3), ~_flags(rows, 3), group_size=group_size)
    message = (
        rf"estimator '{name}' needs group_size >= 2 dividing the batch of {rows} rows, "
        rf"got group_size={group_size}"
    )
    with pytest.raises(ValueError, match=message):
        ADVANTAGES.get(name)(batch, AdvantageConfig())


def test_grouped_scores_sum_the_valid_token_rewards_per_row() -> None:
    rewards = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    mask = torch.tensor([[True, False], [True, True], [False, False], [False, True]])
    scores = AdvantageBatch(rewards, mask, group_size=2).grouped_scores("grpo")
    assert scores.tolist() == [[1.0, 7.0], [0.0, 8.0]]


# --- REINFORCE++-baseline: the reward-to-go form and verl's score form ---------------------


@given(
    group_size=st.integers(2, 3).flatmap(
        lambda n: st.tuples(st.just(n), token_batches(batch_multiple_of=n, allow_empty_rows=False))
    )
)
def test_reinforce_pp_baseline_forms_agree_for_outcome_rewards_without_discount(
    group_size: tuple[int, TokenBatch],
) -> None:
    """With γ = 1 and each row's reward on its last valid token, Gₜ = sᵢ on every valid token
    (holes are passed over), so whiten(Gₜ − b) = whiten(sᵢ − b): the two forms are one."""
    n, batch = group_size
    outcome = place_on_last_token(
        torch.where(batch.mask, batch.token_rewards, 0.0).sum(-1), batch.mask
    )
    data = AdvantageBatch(outcome, batch.mask, group_size=n)
    estimator = ADVANTAGES.get("reinforce_pp_baseline")
    to_go = estimator(data, AdvantageConfig())
    score = estimator(data, AdvantageConfig(baseline_form="score"))
    torch.testing.assert_close(to_go.advantages, score.advantages)
    torch.testing.assert_close(to_go.returns, score.returns)


def test_reinforce_pp_baseline_forms_hand_example() -> None:
    """One group of 2, rewards [[0, 1], [0, 0]], γ = 0.9: b = ½. Reward-to-go: G = [[0.9, 1],
    [0, 0]], G − b = [[0.4, 0.5], [−0.5, −0.5]], whitened (mean −0.025, std 0.5188):
    [[0.7727, 0.9545], [−0.8636, −0.8636]]. Score form (γ unused, so 1): s − b = ±½ on every
    token, whitened ±0.8660 (std of ±½ over 4 tokens, Bessel: 0.5774)."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    data = AdvantageBatch(rewards, torch.ones(2, 2, dtype=torch.bool), group_size=2)
    estimator = ADVANTAGES.get("reinforce_pp_baseline")
    to_go = estimator(data, AdvantageConfig(gamma=0.9)).advantages
    score = estimator(data, AdvantageConfig(baseline_form="score")).advantages
    expected = torch.tensor([[0.7727, 0.9545], [-0.8636, -0.8636]], dtype=torch.float64)
    torch.testing.assert_close(to_go, expected, atol=1e-4, rtol=0)
    half = 0.5 / math.sqrt(1 / 3)
    torch.testing.assert_close(
        score, torch.tensor([[half, half], [-half, -half]], dtype=torch.float64)
    )


def test_reinforce_pp_baselines_score_form_refuses_a_discount_it_would_ignore() -> None:
    data = AdvantageBatch(_zeros(2, 3), ~_flags(2, 3), group_size=2)
    message = (
        r"'reinforce_pp_baseline' with baseline_form='score' centres the undiscounted score of "
        r"each row, so it does not use gamma \(got 0.9\); leave gamma at 1.0"
    )
    with pytest.raises(ValueError, match=message):
        ADVANTAGES.get("reinforce_pp_baseline")(
            data, AdvantageConfig(gamma=0.9, baseline_form="score")
        )
    with pytest.raises(
        ValueError, match=r"baseline_form must be 'reward_to_go' or 'score', got 'sum'"
    ):
        AdvantageConfig(baseline_form="sum")  # type: ignore[arg-type]
