"""Action distributions of embodied policies: categorical, Gaussian, tanh-Gaussian, flow chains.

Log-probabilities, entropies and samples of the three action distributions
an embodied policy head parameterises, each summed over the action
dimensions so that one row (one env step) gets one number:

- categorical over ``actions`` choices with logits z:  π(a) = softmax(z)ₐ;
- diagonal Gaussian N(μ, diag σ²) with σ = exp(log σ), over ``dim`` dimensions;
- tanh-Gaussian: a = tanh(u), u ~ N(μ, diag σ²), the squashed Gaussian of SAC;
- flow-matching action chains (π0's flow, πRL's Flow-SDE and Flow-Noise): the
  Gaussian steps of a denoising chain over an action chunk ``[*batch, horizon,
  dim]``, each summed over the whole chunk (the section at the end).

Shapes are batch first, the action axis last: logits ``[*batch, actions]``,
Gaussian parameters ``[*batch, dim]``; a state-independent log σ (PPO's
usual parameter) may be given as ``[dim]`` and broadcasts over the batch.
Results are computed in at least float32 (half-precision inputs are upcast).
Samplers draw from torch's default generator unless given ``generator``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from rlcore._checking import typecheck

__all__ = [
    "categorical_entropy",
    "categorical_log_prob",
    "categorical_sample",
    "flow_euler_step",
    "flow_interpolate",
    "flow_matching_loss",
    "flow_sde_sigma",
    "flow_sde_step",
    "flow_step_log_prob",
    "gaussian_entropy",
    "gaussian_log_prob",
    "gaussian_sample",
    "tanh_gaussian_log_prob",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def _at_least_float32(x: Tensor) -> Tensor:
    # A log-softmax or a square in bf16 loses ~3 digits; float32 and float64 pass unchanged.
    return x.to(torch.promote_types(x.dtype, torch.float32))


# ---------------------------------------------------------------------------
# Categorical


@typecheck
def categorical_log_prob(
    logits: Float[Tensor, "*batch actions"], actions: Int[Tensor, "*batch"]
) -> Float[Tensor, "*batch"]:
    """log π(a) of a categorical with logits z:  log π(a) = zₐ − log Σᵥ exp zᵥ.

    Adding a constant to every logit of a row leaves π unchanged. ``actions``
    index the last axis of ``logits``; an index outside it raises.
    """
    log_probs = F.log_softmax(_at_least_float32(logits), dim=-1)
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


@typecheck
def categorical_entropy(logits: Float[Tensor, "*batch actions"]) -> Float[Tensor, "*batch"]:
    """H[π] = −Σᵥ π(v) log π(v),  0 ≤ H ≤ log |actions| (the maximum at uniform logits)."""
    log_probs = F.log_softmax(_at_least_float32(logits), dim=-1)
    return -(log_probs.exp() * log_probs).sum(-1)


@typecheck
def categorical_sample(
    logits: Float[Tensor, "*batch actions"], generator: torch.Generator | None = None
) -> Int[Tensor, "*batch"]:
    """a ~ π = softmax(z) by the exponential race:  a = argmaxᵥ πᵥ / Eᵥ,  Eᵥ ~ Exp(1) i.i.d.

    Eᵥ/πᵥ ~ Exp(πᵥ), and the first of independent exponential clocks to ring
    is clock v with probability πᵥ / Σπ, so P(a = v) = πᵥ. (Taking logs,
    −log Eᵥ is a standard Gumbel: this is the Gumbel-max trick, Gumbel 1954;
    Maddison, Tarlow & Minka 2014, arXiv:1411.0030.)

    The draw ``torch.multinomial(π, 1)`` makes, with the same generator calls
    and so the same actions, without its checks of the probabilities (28 µs
    against 9 µs for 8 rows of 2 actions on one core). Actions are int64.
    Non-finite logits give a meaningless action and a NaN log-probability.
    """
    probs = torch.softmax(_at_least_float32(logits), dim=-1)
    return (probs / torch.empty_like(probs).exponential_(generator=generator)).argmax(-1)


# ---------------------------------------------------------------------------
# Diagonal Gaussian


def _gaussian_log_prob(x: Tensor, mean: Tensor, log_std: Tensor) -> Tensor:
    x, mean, log_std = (_at_least_float32(t) for t in (x, mean, log_std))
    z = (x - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - _HALF_LOG_2PI).sum(-1)


@typecheck
def gaussian_log_prob(
    x: Float[Tensor, "*batch dim"],
    mean: Float[Tensor, "*batch dim"],
    log_std: Float[Tensor, "*#batch dim"],
) -> Float[Tensor, "*batch"]:
    """log N(x; μ, diag σ²) summed over the action dimensions (σᵢ = exp log σᵢ):

    log N(x; μ, σ²) = Σᵢ −(xᵢ − μᵢ)² / (2σᵢ²) − log σᵢ − ½ log 2π

    The Gaussian policy of Williams (1992), PPO's continuous head. ``log_std``
    broadcasts: ``[dim]`` for a state-independent σ.
    """
    return _gaussian_log_prob(x, mean, log_std)


@typecheck
def gaussian_entropy(log_std: Float[Tensor, "*batch dim"]) -> Float[Tensor, "*batch"]:
    """H[N(μ, diag σ²)] = Σᵢ ½ + ½ log 2π + log σᵢ = Σᵢ ½ log(2πe σᵢ²), whatever μ.

    (Cover & Thomas, Elements of Information Theory, §8.4.) Negative once σ
    is small enough: a differential entropy. A state-independent ``[dim]``
    log σ gives one value (a 0-d tensor) for every row.
    """
    return (0.5 + _HALF_LOG_2PI + _at_least_float32(log_std)).sum(-1)


@typecheck
def gaussian_sample(
    mean: Float[Tensor, "*batch dim"],
    log_std: Float[Tensor, "*#batch dim"],
    generator: torch.Generator | None = None,
) -> Float[Tensor, "*batch dim"]:
    """u = μ + σ ⊙ ε, ε ~ N(0, I): a reparameterised sample of N(μ, diag σ²).

    Differentiable in μ and log σ (∂u/∂μ = 1, ∂u/∂log σ = σ ε; Kingma &
    Welling 2014, arXiv:1312.6114), as SAC's actor loss needs. ε is drawn as
    ``torch.randn_like(mean)`` (in ``mean``'s dtype), the draw the policies
    made before this function existed: a seeded run samples the same u.
    """
    return mean + log_std.exp() * torch.randn_like(mean, generator=generator)


# ---------------------------------------------------------------------------
# tanh-Gaussian


@typecheck
def tanh_gaussian_log_prob(
    u: Float[Tensor, "*batch dim"],
    mean: Float[Tensor, "*batch dim"],
    log_std: Float[Tensor, "*#batch dim"],
) -> Float[Tensor, "*batch"]:
    """log π(a) of a = tanh(u), u ~ N(μ, diag σ²) (Haarnoja et al. 2018, arXiv:1801.01290, app. C).

    By the change of variables, with the pre-squash u as the argument:

    log π(a) = log N(u; μ, σ²) − Σᵢ log(1 − tanh² uᵢ)
    log(1 − tanh² u) = 2 (log 2 − u − softplus(−2u))

    The second line is exact and finite for every u; the naive form is −inf
    once tanh u rounds to ±1 (|u| ≳ 9 in float32, 19 in float64). A further
    affine map of a onto [low, high] adds a constant, left out.
    """
    u32 = _at_least_float32(u)
    # softplus as logaddexp(v, 0): F.softplus is the identity above 20, which drops
    # log1p(e^-20) ≈ 2e-9 (nothing in float32, ~1e-10 relative in float64).
    v = -2.0 * u32
    log_det = 2.0 * (_LOG_2 - u32 - torch.logaddexp(v, torch.zeros_like(v)))
    return _gaussian_log_prob(u32, mean, log_std) - log_det.sum(-1)


# ---------------------------------------------------------------------------
# Flow-matching action chains (π0's convention; πRL's Flow-SDE and Flow-Noise)
#
# An action chunk a ∈ R^{horizon×dim} and a noise ε ~ N(0, I) of its shape are joined by
# the straight path x_t = t·ε + (1 − t)·a, t ∈ [0, 1] (t = 1 is noise, t = 0 the action:
# π0's convention, Black et al. 2024, arXiv:2410.24164), whose velocity is v = ε − a. A
# network v_θ(x, t | observation) learns E[ε − a | x_t = x] (flow matching, Lipman et al.
# 2023, arXiv:2210.02747), and an action is sampled by integrating dx/dt = v_θ from t = 1 to
# t = 0 in K steps of δ = 1/K: x_{t−δ} = x_t − δ·v_θ(x_t, t). The chain x_1 (noise), ...,
# x_0 (the action) is deterministic given the noise, so it has no tractable log-likelihood.
#
# πRL (Chen et al. 2025, arXiv:2510.25889) makes some or all of the K steps Gaussian
# transitions x_{t−δ} ~ N(μ_θ, σ²) whose log-likelihood is exact:
# - Flow-SDE: the SDE with the ODE's marginals (Flow-GRPO, Liu et al. 2025,
#   arXiv:2505.05470), one Euler–Maruyama step of it (`flow_sde_step`);
# - Flow-Noise: the ODE step's mean with a σ a network predicts (`flow_euler_step`).
# A chain's log-likelihood is the sum of its Gaussian transitions' (`flow_step_log_prob`):
# the deterministic steps contribute nothing, and the initial N(0, I) nothing that depends
# on θ. Shapes: chunks ``[*batch, horizon, dim]``, times and step sizes ``[*batch]``.


@typecheck
def flow_interpolate(
    actions: Float[Tensor, "*batch horizon dim"],
    noise: Float[Tensor, "*batch horizon dim"],
    t: Float[Tensor, "*batch"],
) -> Float[Tensor, "*batch horizon dim"]:
    """x_t = t·ε + (1 − t)·a, the straight path from the action a (t = 0) to the noise ε (t = 1)."""
    t = t[..., None, None]
    return t * noise + (1.0 - t) * actions


@typecheck
def flow_matching_loss(
    velocity: Float[Tensor, "*batch horizon dim"],
    noise: Float[Tensor, "*batch horizon dim"],
    actions: Float[Tensor, "*batch horizon dim"],
) -> Float[Tensor, ""]:
    """The flow-matching (behaviour-cloning) loss, mean over every element:

    L = mean ‖v_θ(x_t, t) − (ε − a)‖²,  x_t = `flow_interpolate`(a, ε, t)

    ``velocity`` is v_θ at x_t; minimised by v_θ(x, t) = E[ε − a | x_t = x] (Lipman et al.
    2023, arXiv:2210.02747, Thm. 2), the field whose ODE carries N(0, I) to the actions.
    """
    target = _at_least_float32(noise) - _at_least_float32(actions)
    return (_at_least_float32(velocity) - target).square().mean()


@typecheck
def flow_euler_step(
    x: Float[Tensor, "*batch horizon dim"],
    velocity: Float[Tensor, "*batch horizon dim"],
    delta: Float[Tensor, "*batch"],
) -> Float[Tensor, "*batch horizon dim"]:
    """x_{t−δ} = x_t − δ·v: one Euler step of the flow's ODE from t towards the action.

    Also Flow-Noise's transition mean (its σ comes from a network).
    """
    return x - delta[..., None, None] * velocity


@typecheck
def flow_sde_sigma(
    t: Float[Tensor, "*batch"], delta: Float[Tensor, "*batch"], noise_level: float
) -> Float[Tensor, "*batch"]:
    """Flow-SDE's diffusion coefficient σ_t = a·√(t / max(1 − t, δ)), a = ``noise_level``.

    Flow-GRPO's schedule a·√(t/(1 − t)), more noise near the noise end; at t = 1, where it
    is infinite, 1 − t is replaced by the step δ (on the uniform grid, 1 − t of the next
    time, as RLinf's OpenPI policy does).
    """
    return noise_level * torch.sqrt(t / torch.maximum(1.0 - t, delta))


@typecheck
def flow_sde_step(
    x: Float[Tensor, "*batch horizon dim"],
    velocity: Float[Tensor, "*batch horizon dim"],
    t: Float[Tensor, "*batch"],
    delta: Float[Tensor, "*batch"],
    noise_level: float,
) -> tuple[Float[Tensor, "*batch horizon dim"], Float[Tensor, "*batch"]]:
    """Flow-SDE's transition from t to t − δ as (mean μ, log σ_step), x_{t−δ} ~ N(μ, σ_step² I):

    μ = x_t − δ·v − (σ_t² δ / 2t)·(x_t + (1 − t)·v),   σ_step = σ_t √δ,  σ_t = `flow_sde_sigma`

    Why: for the straight path, E[ε | x_t = x] = x + (1 − t)·v(x, t) (solve x = tε + (1 − t)a
    and v = E[ε − a | x] for E[ε | x]), so the score is ∇log p_t(x) = −(x + (1 − t)·v)/t.
    For any σ_t, dx = [v + ½σ_t² ∇log p_t] dt + σ_t dW has the ODE's marginals p_t (the
    extra drift's and the diffusion's terms cancel in the Fokker–Planck equation); its
    reverse in time, run from t to t − δ, is dx = −[v − ½σ_t² ∇log p_t] δ + σ_t √δ ε', whose
    Euler–Maruyama step is the line above. With a = 0 it is `flow_euler_step`. For an exact
    velocity the step keeps the marginal to O(δ²) (tests/core/test_distributions.py).
    """
    sigma = flow_sde_sigma(t, delta, noise_level)
    t_, d_, s_ = t[..., None, None], delta[..., None, None], sigma[..., None, None]
    mean = x - d_ * velocity - (s_.square() * d_ / (2.0 * t_)) * (x + (1.0 - t_) * velocity)
    return mean, torch.log(sigma) + 0.5 * torch.log(delta)


@typecheck
def flow_step_log_prob(
    x_next: Float[Tensor, "*batch horizon dim"],
    mean: Float[Tensor, "*batch horizon dim"],
    log_std: Float[Tensor, "*#batch #horizon #dim"],
) -> Float[Tensor, "*batch"]:
    """log N(x_{t−δ}; μ, diag σ²) of one Gaussian transition, summed over the whole chunk:

    Σ_{h,d} −(x − μ)²/(2σ²) − log σ − ½ log 2π

    ``log_std`` broadcasts: Flow-SDE's one σ per row as ``[*batch, 1, 1]``, Flow-Noise's
    per element. A chain's log-likelihood is the sum of this over its Gaussian steps.
    """
    log_std = log_std.expand(mean.shape)
    return _gaussian_log_prob(x_next.flatten(-2), mean.flatten(-2), log_std.flatten(-2))
