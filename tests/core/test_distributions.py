"""Action distributions: properties against torch.distributions and the maths, then examples.

Properties first: categorical probabilities sum to one over the actions, are
unchanged by a constant added to the logits, and their entropy lies in
[0, log |A|] with the maximum at uniform logits; the Gaussian log-prob and
entropy equal torch.distributions.Normal's summed over dimensions; the
tanh-Gaussian log-prob is the change-of-variables formula where that is
finite and stays finite where it is not; samplers draw the right frequencies
(seeded, so the checks cannot flake) and the categorical one draws exactly
what ``torch.multinomial`` draws; every gradient is finite. Then a few
hand-computed values, dtypes and shape errors.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor
from torch.distributions import Categorical, Normal, TanhTransform, TransformedDistribution

from rlcore.distributions import (
    categorical_entropy,
    categorical_log_prob,
    categorical_sample,
    flow_euler_step,
    flow_interpolate,
    flow_matching_loss,
    flow_sde_sigma,
    flow_sde_step,
    flow_step_log_prob,
    gaussian_entropy,
    gaussian_log_prob,
    gaussian_sample,
    tanh_gaussian_log_prob,
)
from rlcore.testing import (
    CategoricalBatch,
    GaussianBatch,
    categorical_batches,
    gaussian_batches,
)
from tests.core.shape_errors import assert_shape_error

F64 = {"rtol": 1e-10, "atol": 1e-10}


def every_action(logits: Tensor) -> tuple[Tensor, Tensor]:
    """``[batch, actions]`` logits as ``[batch, actions, actions]``, beside each action index."""
    batch, count = logits.shape
    actions = torch.arange(count).expand(batch, count)
    return logits.unsqueeze(-2).expand(batch, count, count), actions


def chi_square_bound(degrees: int, z: float = 4.75) -> float:
    """The χ² quantile at the normal quantile ``z`` (Wilson & Hilferty 1931); z = 4.75: p ≈ 1e-6."""
    k = float(degrees)
    return k * (1.0 - 2.0 / (9.0 * k) + z * math.sqrt(2.0 / (9.0 * k))) ** 3


# ---------------------------------------------------------------------------
# Categorical


@given(batch=categorical_batches())
def test_categorical_probabilities_sum_to_one_and_match_torch(batch: CategoricalBatch) -> None:
    logits, actions = every_action(batch.logits)
    log_probs = categorical_log_prob(logits, actions)
    assert log_probs.shape == batch.logits.shape
    assert torch.all(log_probs <= 0)
    total = log_probs.exp().sum(-1)
    torch.testing.assert_close(total, torch.ones_like(total), **F64)
    expected = Categorical(logits=batch.logits).log_prob(batch.actions)
    torch.testing.assert_close(categorical_log_prob(batch.logits, batch.actions), expected, **F64)


@given(batch=categorical_batches())
def test_categorical_entropy_lies_between_zero_and_log_actions(batch: CategoricalBatch) -> None:
    entropy = categorical_entropy(batch.logits)
    count = batch.logits.shape[-1]
    assert torch.all(entropy >= -1e-12)
    assert torch.all(entropy <= math.log(count) + 1e-12)
    torch.testing.assert_close(entropy, Categorical(logits=batch.logits).entropy(), **F64)


@given(
    rows=st.integers(1, 5),
    count=st.integers(1, 9),
    level=st.floats(-100.0, 100.0),
    other=categorical_batches(max_batch=1),
)
def test_uniform_logits_have_the_maximal_entropy(
    rows: int, count: int, level: float, other: CategoricalBatch
) -> None:
    uniform = torch.full((rows, count), level, dtype=torch.float64)
    entropy = categorical_entropy(uniform)
    torch.testing.assert_close(entropy, torch.full((rows,), math.log(count), dtype=torch.float64))
    # No distribution over as many actions has more.
    assert categorical_entropy(other.logits) <= math.log(other.logits.shape[-1]) + 1e-12


@given(batch=categorical_batches(), shift=st.floats(-100.0, 100.0))
def test_adding_a_constant_to_the_logits_changes_nothing(
    batch: CategoricalBatch, shift: float
) -> None:
    shifted = batch.logits + shift
    torch.testing.assert_close(
        categorical_log_prob(shifted, batch.actions),
        categorical_log_prob(batch.logits, batch.actions),
        rtol=1e-9,
        atol=1e-9,
    )
    torch.testing.assert_close(
        categorical_entropy(shifted), categorical_entropy(batch.logits), rtol=1e-9, atol=1e-9
    )


@given(batch=categorical_batches())
def test_categorical_gradients_are_finite_and_sum_to_zero_over_actions(
    batch: CategoricalBatch,
) -> None:
    logits = batch.logits.clone().requires_grad_(True)
    objective = (
        categorical_log_prob(logits, batch.actions).sum() + categorical_entropy(logits).sum()
    )
    (gradient,) = torch.autograd.grad(objective, logits)
    assert torch.isfinite(gradient).all()
    # Both are invariant to a shift of the logits, so their gradients have no component along it.
    torch.testing.assert_close(gradient.sum(-1), torch.zeros(logits.shape[0], dtype=logits.dtype))


@given(
    batch=st.integers(1, 64),
    actions=st.integers(1, 12),
    scale=st.floats(0.0, 20.0),
    seed=st.integers(0, 2**16),
)
def test_categorical_sample_draws_what_torch_multinomial_draws(
    batch: int, actions: int, scale: float, seed: int
) -> None:
    logits = torch.randn(batch, actions, generator=torch.Generator().manual_seed(seed)) * scale
    torch.manual_seed(seed)
    expected = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)
    torch.manual_seed(seed)
    assert torch.equal(categorical_sample(logits), expected)
    # The same with a generator of its own.
    generator = torch.Generator().manual_seed(seed + 1)
    expected = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
    generator.manual_seed(seed + 1)
    assert torch.equal(categorical_sample(logits, generator), expected.squeeze(-1))


def test_categorical_sample_frequencies_are_the_probabilities() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.6, 0.3]])).expand(60_000, 3)
    torch.manual_seed(0)
    counts = torch.bincount(categorical_sample(logits), minlength=3).double() / 60_000
    # Three standard errors of a frequency estimated from 60,000 draws: ≤ 0.006.
    torch.testing.assert_close(
        counts, torch.tensor([0.1, 0.6, 0.3], dtype=torch.float64), atol=0.006, rtol=0
    )


@given(batch=categorical_batches(max_batch=3, min_actions=2), seed=st.integers(0, 2**16))
def test_categorical_sample_passes_a_chi_square_test(batch: CategoricalBatch, seed: int) -> None:
    draws = 4_000
    generator = torch.Generator().manual_seed(seed)
    logits = batch.logits.unsqueeze(0).expand(draws, *batch.logits.shape)
    samples = categorical_sample(logits, generator)
    assert samples.dtype == torch.int64
    probs = torch.softmax(batch.logits, dim=-1)
    for row in range(batch.logits.shape[0]):
        counts = torch.bincount(samples[:, row], minlength=probs.shape[-1]).double()
        assert torch.all(counts[probs[row] == 0] == 0)
        seen = probs[row] * draws >= 5  # χ² needs ~5 expected draws a cell; pool the rest
        expected = torch.cat([probs[row][seen], probs[row][~seen].sum(0, keepdim=True)]) * draws
        observed = torch.cat([counts[seen], counts[~seen].sum(0, keepdim=True)])
        if expected[-1] < 5:  # the pool too small: merge it into the largest cell
            largest = int(expected[:-1].argmax())
            expected[largest] += expected[-1]
            observed[largest] += observed[-1]
            expected, observed = expected[:-1], observed[:-1]
        if expected.numel() < 2:
            continue  # one action holds all the mass: every draw is it (checked above)
        statistic = float(((observed - expected) ** 2 / expected).sum())
        assert statistic < chi_square_bound(expected.numel() - 1), (statistic, probs[row])


# ---------------------------------------------------------------------------
# Diagonal Gaussian


def normal(batch: GaussianBatch) -> Normal:
    return Normal(batch.mean, batch.log_std.exp())


@given(batch=gaussian_batches())
def test_gaussian_log_prob_is_normals_summed_over_dims(batch: GaussianBatch) -> None:
    expected = normal(batch).log_prob(batch.x).sum(-1)
    torch.testing.assert_close(
        gaussian_log_prob(batch.x, batch.mean, batch.log_std), expected, rtol=1e-10, atol=1e-8
    )


@given(batch=gaussian_batches())
def test_gaussian_entropy_is_normals_summed_over_dims(batch: GaussianBatch) -> None:
    expected = normal(batch).entropy().sum(-1)
    entropy = gaussian_entropy(batch.log_std)
    assert entropy.shape == batch.log_std.shape[:-1]  # one value for a shared σ
    torch.testing.assert_close(entropy.expand_as(expected), expected, **F64)


@given(batch=gaussian_batches(shared_log_std=True))
def test_a_shared_log_std_broadcasts_as_its_expansion(batch: GaussianBatch) -> None:
    expanded = batch.log_std.expand_as(batch.mean)
    for function in (gaussian_log_prob, tanh_gaussian_log_prob):
        assert torch.equal(
            function(batch.x, batch.mean, batch.log_std),
            function(batch.x, batch.mean, expanded),
        )
    torch.manual_seed(3)
    shared = gaussian_sample(batch.mean, batch.log_std)
    torch.manual_seed(3)
    assert torch.equal(shared, gaussian_sample(batch.mean, expanded))


@given(batch=gaussian_batches())
def test_gaussian_gradients_are_finite(batch: GaussianBatch) -> None:
    leaves = [t.clone().requires_grad_(True) for t in (batch.x, batch.mean, batch.log_std)]
    objective = gaussian_log_prob(*leaves).sum() + gaussian_entropy(leaves[2]).sum()
    objective = objective + tanh_gaussian_log_prob(*leaves).sum()
    for gradient in torch.autograd.grad(objective, leaves):
        assert torch.isfinite(gradient).all()


@given(batch=gaussian_batches(), seed=st.integers(0, 2**16))
def test_gaussian_sample_is_the_reparameterised_draw(batch: GaussianBatch, seed: int) -> None:
    mean = batch.mean.clone().requires_grad_(True)
    log_std = batch.log_std.clone().requires_grad_(True)
    u = gaussian_sample(mean, log_std, torch.Generator().manual_seed(seed))
    noise = torch.randn_like(batch.mean, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(u, batch.mean + batch.log_std.exp() * noise, rtol=0, atol=0)
    d_mean, d_log_std = torch.autograd.grad(u.sum(), (mean, log_std))
    torch.testing.assert_close(d_mean, torch.ones_like(mean))
    spread = (u - mean).detach()  # σ ε
    torch.testing.assert_close(d_log_std, spread.sum_to_size(log_std.shape), **F64)


def test_gaussian_sample_moments_are_the_parameters() -> None:
    mean = torch.tensor([[-1.0, 0.0, 3.0]], dtype=torch.float64).expand(40_000, 3)
    log_std = torch.log(torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64))
    draws = gaussian_sample(mean, log_std, torch.Generator().manual_seed(0))
    # Five standard errors of the mean (σ/√n) and of the standard deviation (≈ σ/√(2n)).
    sigma = log_std.exp()
    n = draws.shape[0]
    torch.testing.assert_close(draws.mean(0), mean[0], atol=float(5 * sigma.max() / n**0.5), rtol=0)
    torch.testing.assert_close(draws.std(0), sigma, rtol=5 / (2 * n) ** 0.5, atol=0)


def test_gaussian_sample_draws_what_a_policy_drew_before() -> None:
    """The policies drew μ + σ · randn_like(μ) from the global generator: the same draws."""
    mean = torch.randn(5, 2)
    log_std = torch.tensor([-0.5, 0.3])
    torch.manual_seed(11)
    before = mean + log_std.exp() * torch.randn_like(mean)
    torch.manual_seed(11)
    assert torch.equal(gaussian_sample(mean, log_std), before)


# ---------------------------------------------------------------------------
# tanh-Gaussian


@given(batch=gaussian_batches(max_abs_x=6.0))
def test_tanh_gaussian_log_prob_is_the_change_of_variables(batch: GaussianBatch) -> None:
    """Where log(1 − tanh² u) is computed accurately in float64 (|u| ≤ 6: ~1e-11 relative)."""
    u = batch.x
    naive = normal(batch).log_prob(u).sum(-1) - torch.log(1 - torch.tanh(u) ** 2).sum(-1)
    ours = tanh_gaussian_log_prob(u, batch.mean, batch.log_std)
    accurate = u.abs().amax(-1) <= 6.0
    torch.testing.assert_close(ours[accurate], naive[accurate], rtol=1e-9, atol=1e-8)


@given(
    batch=st.integers(1, 8),
    action_dim=st.integers(1, 4),
    scale=st.floats(0.1, 10.0),
    seed=st.integers(0, 2**16),
)
def test_tanh_gaussian_log_prob_matches_torch_even_where_tanh_saturates(
    batch: int, action_dim: int, scale: float, seed: int
) -> None:
    """|u| up to 10: tanh(u) rounds to ±1 in fp32 and the naive log(1 − tanh²u) is −inf."""
    gen = torch.Generator().manual_seed(seed)
    u = (torch.rand(batch, action_dim, generator=gen) * 2 - 1) * scale
    mean = torch.randn(batch, action_dim, generator=gen)
    log_std = torch.rand(batch, action_dim, generator=gen) * 3 - 2
    tanh = TanhTransform(cache_size=1)
    a = tanh(u)  # cached, so log_prob(a) inverts to u exactly instead of atanh(±1) = ±inf
    dist = TransformedDistribution(Normal(mean, log_std.exp()), [tanh])
    expected = dist.log_prob(a).sum(-1)
    ours = tanh_gaussian_log_prob(u, mean, log_std)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("magnitude", [20.0, 50.0, 1e3])
def test_tanh_gaussian_log_prob_stays_finite_far_out_in_float32(magnitude: float) -> None:
    u = torch.tensor([[magnitude, -magnitude]], requires_grad=True)
    mean = torch.zeros(1, 2, requires_grad=True)
    log_std = torch.zeros(1, 2, requires_grad=True)
    naive = torch.log(1 - torch.tanh(u.detach()) ** 2)
    assert torch.all(naive == -math.inf)  # what the stable form avoids
    log_prob = tanh_gaussian_log_prob(u, mean, log_std)
    assert torch.isfinite(log_prob).all()
    # log(1 − tanh² u) → 2 (log 2 − |u|) as |u| grows (softplus(−2|u|) ≈ e^(−2|u|)).
    correction = 2 * 2 * (math.log(2.0) - magnitude)
    expected = -(magnitude**2) - 2 * 0.5 * math.log(2 * math.pi) - correction
    torch.testing.assert_close(log_prob, torch.tensor([expected]), rtol=1e-6, atol=0)
    for gradient in torch.autograd.grad(log_prob.sum(), (u, mean, log_std)):
        assert torch.isfinite(gradient).all()


# ---------------------------------------------------------------------------
# Hand-computed values


def test_a_two_action_categorical_by_hand() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)  # π = (1/4, 3/4)
    for action, prob in ((0, 0.25), (1, 0.75)):
        got = categorical_log_prob(logits, torch.tensor([action]))
        torch.testing.assert_close(got, torch.tensor([math.log(prob)], dtype=torch.float64))
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623351446188083
    torch.testing.assert_close(
        categorical_entropy(logits), torch.tensor([entropy], dtype=torch.float64)
    )


def test_a_standard_normal_by_hand() -> None:
    zeros = torch.zeros(1, 3, dtype=torch.float64)
    # At x = μ with σ = 1: 3 × −½ log 2π; entropy 3 × ½ log(2πe).
    torch.testing.assert_close(
        gaussian_log_prob(zeros, zeros, zeros),
        torch.tensor([-3 * 0.9189385332046727], dtype=torch.float64),
    )
    torch.testing.assert_close(
        gaussian_entropy(zeros), torch.tensor([3 * 1.4189385332046727], dtype=torch.float64)
    )
    # One σ away in one dimension, σ = e: −½ − 1 − ½ log 2π there.
    x = torch.tensor([[math.e, 0.0, 0.0]], dtype=torch.float64)
    log_std = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(
        gaussian_log_prob(x, zeros, log_std),
        torch.tensor([-0.5 - 1.0 - 3 * 0.9189385332046727], dtype=torch.float64),
    )
    # tanh at u = 0 has Jacobian 1: the Gaussian's log-density.
    torch.testing.assert_close(
        tanh_gaussian_log_prob(zeros, zeros, zeros),
        torch.tensor([-3 * 0.9189385332046727], dtype=torch.float64),
    )


def test_half_precision_inputs_are_computed_in_float32() -> None:
    logits = torch.randn(4, 5).to(torch.bfloat16)
    actions = torch.tensor([0, 1, 2, 3])
    assert categorical_log_prob(logits, actions).dtype == torch.float32
    assert categorical_entropy(logits).dtype == torch.float32
    torch.testing.assert_close(
        categorical_log_prob(logits, actions), categorical_log_prob(logits.float(), actions)
    )
    mean = torch.randn(4, 2).to(torch.bfloat16)
    log_std = torch.zeros(2, dtype=torch.bfloat16)
    for value in (
        gaussian_log_prob(mean, mean, log_std),
        gaussian_entropy(log_std),
        tanh_gaussian_log_prob(mean, mean, log_std),
    ):
        assert value.dtype == torch.float32
    assert gaussian_sample(mean, log_std).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("name", "call", "fragments"),
    [
        (
            "categorical_log_prob",
            lambda: categorical_log_prob(torch.zeros(4, 3), torch.zeros(5, dtype=torch.long)),
            ["'actions' has shape (5,)", "'batch' is (5,) but 'logits' bound it to (4,)"],
        ),
        (
            "categorical_log_prob",
            lambda: categorical_log_prob(torch.zeros(4, 3), torch.zeros(4)),
            ["'actions' has dtype float32"],
        ),
        (
            "gaussian_log_prob",
            lambda: gaussian_log_prob(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(3)),
            ["'log_std' has shape (3,)", "'dim' is 3 but 'mean' bound it to 2"],
        ),
        (
            "tanh_gaussian_log_prob",
            lambda: tanh_gaussian_log_prob(torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(3, 2)),
            ["'log_std' has shape (3, 2)", "does not broadcast to (4,)"],
        ),
        (
            "gaussian_sample",
            lambda: gaussian_sample(torch.zeros(4, 2), torch.zeros(4, 3)),
            ["'log_std' has shape (4, 3)", "'dim' is 3 but 'mean' bound it to 2"],
        ),
    ],
)
def test_wrong_shapes_are_explained(name: str, call: object, fragments: list[str]) -> None:
    assert_shape_error("rlcore.distributions", name, call, fragments)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Flow-matching chains


@st.composite
def flow_chunks(draw: st.DrawFn) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(actions, noise, t, δ) in float64: a batch of chunks, times in (0, 1], steps ≤ t."""
    batch, horizon, dim = draw(st.integers(1, 4)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    actions = torch.randn(batch, horizon, dim, generator=generator, dtype=torch.float64)
    noise = torch.randn(batch, horizon, dim, generator=generator, dtype=torch.float64)
    steps = draw(st.integers(1, 20))
    k = torch.randint(0, steps, (batch,), generator=generator)
    t = 1.0 - k.double() / steps  # a time of the uniform grid, as a sampler visits
    return actions, noise, t, torch.full((batch,), 1.0 / steps, dtype=torch.float64)


@given(chunk=flow_chunks())
def test_the_straight_path_runs_from_the_action_to_the_noise(
    chunk: tuple[Tensor, Tensor, Tensor, Tensor],
) -> None:
    actions, noise, t, _ = chunk
    torch.testing.assert_close(flow_interpolate(actions, noise, torch.zeros_like(t)), actions)
    torch.testing.assert_close(flow_interpolate(actions, noise, torch.ones_like(t)), noise)
    # Its velocity dx/dt is ε − a everywhere (the flow-matching target).
    tangent = torch.func.jvp(
        lambda s: flow_interpolate(actions, noise, s), (t,), (torch.ones_like(t),)
    )
    torch.testing.assert_close(tangent[1], noise - actions, **F64)


@given(chunk=flow_chunks())
def test_an_euler_step_with_the_exact_velocity_stays_on_the_path(
    chunk: tuple[Tensor, Tensor, Tensor, Tensor],
) -> None:
    actions, noise, t, delta = chunk
    x = flow_interpolate(actions, noise, t)
    stepped = flow_euler_step(x, noise - actions, delta)
    torch.testing.assert_close(stepped, flow_interpolate(actions, noise, t - delta), **F64)


@given(chunk=flow_chunks())
def test_flow_matching_loss_is_the_mean_squared_velocity_error_and_zero_when_exact(
    chunk: tuple[Tensor, Tensor, Tensor, Tensor],
) -> None:
    actions, noise, _, _ = chunk
    assert flow_matching_loss(noise - actions, noise, actions) == 0.0
    velocity = noise.flip(0) + 0.5
    expected = ((velocity - (noise - actions)) ** 2).mean()
    torch.testing.assert_close(flow_matching_loss(velocity, noise, actions), expected, **F64)
    velocity.requires_grad_(True)
    (gradient,) = torch.autograd.grad(flow_matching_loss(velocity, noise, actions), velocity)
    torch.testing.assert_close(gradient, 2 * (velocity - (noise - actions)) / velocity.numel())


@given(chunk=flow_chunks(), level=st.floats(0.01, 2.0))
def test_flow_sde_sigma_follows_its_schedule(
    chunk: tuple[Tensor, Tensor, Tensor, Tensor], level: float
) -> None:
    _, _, t, delta = chunk
    sigma = flow_sde_sigma(t, delta, level)
    inside = t < 1.0
    torch.testing.assert_close(
        sigma[inside], level * torch.sqrt(t[inside] / (1.0 - t[inside])), **F64
    )
    torch.testing.assert_close(sigma[~inside], level / torch.sqrt(delta[~inside]), **F64)
    grid = torch.linspace(1.0, 0.1, 10, dtype=torch.float64)
    on_grid = flow_sde_sigma(grid, torch.full_like(grid, 0.1), level)
    assert torch.all(on_grid[1:] < on_grid[:-1])  # less noise towards the action


@given(chunk=flow_chunks())
def test_flow_sde_without_noise_is_the_euler_step(
    chunk: tuple[Tensor, Tensor, Tensor, Tensor],
) -> None:
    actions, noise, t, delta = chunk
    x, velocity = flow_interpolate(actions, noise, t), noise.flip(-1)
    mean, log_std = flow_sde_step(x, velocity, t, delta, 0.0)
    torch.testing.assert_close(mean, flow_euler_step(x, velocity, delta), **F64)
    assert torch.all(log_std == -math.inf)


@given(
    data=st.floats(-3.0, 3.0),
    steps=st.integers(2, 50),
    k=st.integers(0, 49),
    level=st.floats(0.05, 1.5),
)
def test_flow_sde_keeps_the_marginal_to_second_order_in_the_step(
    data: float, steps: int, k: int, level: float
) -> None:
    # One data point a: x_t = tε + (1 − t)a ~ N((1 − t)a, t²), and the exact velocity is
    # v(x, t) = (x − a)/t. The step is affine in ε: x' = c_a·a + c_ε·ε + σ√δ ε'. Its law must
    # be the marginal at t − δ, N((1 − t + δ)a, (t − δ)²): the mean exactly, the variance up
    # to σ²δ²/t + σ⁴δ²/(4t²), which the expansion of the step gives.
    t = torch.tensor([1.0 - (k % steps) / steps], dtype=torch.float64)
    delta = torch.tensor([1.0 / steps], dtype=torch.float64)
    a = torch.full((1, 1, 1), data, dtype=torch.float64)

    def step(eps: float) -> tuple[Tensor, Tensor]:
        x = flow_interpolate(a, torch.full_like(a, eps), t)
        return flow_sde_step(x, (x - a) / t[:, None, None], t, delta, level)

    (at_zero, log_std), (at_one, _) = step(0.0), step(1.0)
    c_eps = (at_one - at_zero).item()
    torch.testing.assert_close(at_zero.flatten(), (1.0 - t + delta) * data, **F64)
    sigma = flow_sde_sigma(t, delta, level).item()
    variance = c_eps**2 + math.exp(2 * log_std.item())
    tt, dd = t.item(), delta.item()
    expected_error = sigma**2 * dd**2 / tt + sigma**4 * dd**2 / (4 * tt**2)
    assert math.isclose(variance - (tt - dd) ** 2, expected_error, rel_tol=1e-9, abs_tol=1e-12)


@given(chunk=flow_chunks(), per_element=st.booleans())
def test_flow_step_log_prob_is_the_gaussian_summed_over_the_chunk(
    chunk: tuple[Tensor, Tensor, Tensor, Tensor], per_element: bool
) -> None:
    actions, noise, t, delta = chunk
    mean, row_log_std = flow_sde_step(actions, noise, t, delta, 0.7)
    log_std = noise.tanh() - 1.0 if per_element else row_log_std[:, None, None]
    x_next = mean + log_std.exp() * noise.flip(-1)
    expected = Normal(mean, log_std.exp().expand_as(mean)).log_prob(x_next).sum((-2, -1))
    torch.testing.assert_close(flow_step_log_prob(x_next, mean, log_std), expected, **F64)
    # The mean is the most likely next point.
    assert torch.all(flow_step_log_prob(mean, mean, log_std) >= expected)


def test_a_flow_sde_step_by_hand() -> None:
    # t = 0.5, δ = 0.25, a = 0.5: σ = 0.5·√(0.5/0.5) = 0.5; x = 1, v = 2:
    # μ = 1 − 0.5 − (0.25·0.25/1)(1 + 0.5·2) = 0.375; log σ_step = log(0.5·0.5) = log 0.25.
    one = torch.ones(1, 1, 1)
    mean, log_std = flow_sde_step(one, 2 * one, torch.tensor([0.5]), torch.tensor([0.25]), 0.5)
    torch.testing.assert_close(mean, torch.full((1, 1, 1), 0.375))
    torch.testing.assert_close(log_std, torch.log(torch.tensor([0.25])))


@pytest.mark.parametrize(
    ("name", "call", "fragments"),
    [
        (
            "flow_sde_step",
            lambda: flow_sde_step(
                torch.zeros(4, 3, 2), torch.zeros(4, 2, 2), torch.ones(4), torch.ones(4), 0.5
            ),
            ["'velocity' has shape (4, 2, 2)", "'horizon' is 2 but 'x' bound it to 3"],
        ),
        (
            "flow_step_log_prob",
            lambda: flow_step_log_prob(torch.zeros(4, 3, 2), torch.zeros(4, 3, 2), torch.zeros(4)),
            ["'log_std' has shape (4,)"],
        ),
    ],
)
def test_wrong_flow_shapes_are_explained(name: str, call: object, fragments: list[str]) -> None:
    assert_shape_error("rlcore.distributions", name, call, fragments)  # type: ignore[arg-type]
