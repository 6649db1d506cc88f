"""A linear Gaussian policy on running-normalised states, with an MLP critic.

Not the built-in ``mlp_policy``: the actor is one linear map, and the states
are standardised by running statistics that the policy keeps in buffers
(saved and restored with its checkpoints):

    z = clip((s − μ̂) / √(σ̂² + ε), −5, 5)     μ̂, σ̂²: every state seen in training rollouts
    u ~ N(W z + b, diag(σ²))                   σ = exp(log_std), a learned parameter
    V(s) = MLP(z)

The statistics are `rlcore.normalize`'s pure running mean and variance,
folded in at each ``"train"`` rollout step. They move on after a rollout, so
``forward_inputs`` cache ``z`` itself beside the raw action u: the update
recomputes log π(u | z) on exactly what the rollout saw. The env receives
clip(u, low, high); the log-probabilities are those of the unclipped u.
With several ranks each rank keeps statistics of its own envs. The Gaussian's
sampling, log-density and entropy are `rlcore.distributions`' functions.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn

from rlcore import normalize
from rlcore.distributions import gaussian_entropy, gaussian_log_prob, gaussian_sample
from rlshell.config import ModelConfig
from rlshell.models.base import ActionInfo, BasePolicy
from rlshell.models.model_kwargs import KwargsReader

__all__ = ["LinearGaussianPolicy", "build_linear_gaussian_policy"]

CLIP = 5.0


class LinearGaussianPolicy(BasePolicy):
    """``predict_action_batch`` samples u ~ N(W z + b, σ²); ``default_forward`` rescores u."""

    obs_count: Tensor
    obs_mean: Tensor
    obs_m2: Tensor

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: int = 64,
        init_log_std: float = -0.5,
        action_bound: float = 1.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.action_bound = action_bound
        self.mean = nn.Linear(obs_dim, action_dim)
        nn.init.zeros_(self.mean.weight)  # start as a random walk: μ = 0 everywhere
        nn.init.zeros_(self.mean.bias)
        self.log_std = nn.Parameter(torch.full((action_dim,), init_log_std))
        self.critic = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, 1),
        )
        self.to(dtype)
        # Running statistics in float64 whatever the weights' dtype (registered after the cast).
        stats = normalize.init((obs_dim,))
        self.register_buffer("obs_count", stats.count)
        self.register_buffer("obs_mean", stats.mean)
        self.register_buffer("obs_m2", stats.m2)

    @property
    def stats(self) -> normalize.RunningStats:
        """The running statistics of the states seen so far."""
        return normalize.RunningStats(self.obs_count, self.obs_mean, self.obs_m2)

    def observe(self, states: Tensor) -> None:
        """Fold a batch of states into the running statistics."""
        updated = normalize.update(self.stats, states.detach())
        self.obs_count.copy_(updated.count)
        self.obs_mean.copy_(updated.mean)
        self.obs_m2.copy_(updated.m2)

    def normalized(self, states: Tensor) -> Tensor:
        """z: the states standardised by the running statistics (as they are before any)."""
        if float(self.obs_count) == 0.0:
            return states.float().clamp(-CLIP, CLIP)
        return normalize.normalize(self.stats, states.double(), clip=CLIP).float()

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[Tensor, ActionInfo]:
        """Sample (``"train"``, which also updates the statistics) or take the mean (``"eval"``)."""
        states = self.require_input(env_obs, "states", source="env_obs")
        with torch.no_grad():
            if mode == "train":
                self.observe(states)
            z = self.normalized(states)
            mean, log_std = self._gaussian(z)
            action = gaussian_sample(mean, log_std) if mode == "train" else mean
            info: ActionInfo = {
                "prev_logprobs": gaussian_log_prob(action, mean, log_std),
                "forward_inputs": {"normalized_states": z, "action": action},
            }
            if compute_values:
                info["prev_values"] = self._value(z)
        return action.clamp(-self.action_bound, self.action_bound), info

    def default_forward(
        self,
        forward_inputs: dict[str, Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, Tensor]:
        """log π(u | z), the entropy and V (each ``[batch]``) from the rollout's cache."""
        z = self.require_input(forward_inputs, "normalized_states")
        out: dict[str, Tensor] = {}
        if compute_logprobs or compute_entropy:
            mean, log_std = self._gaussian(z)
            if compute_logprobs:
                action = self.require_input(forward_inputs, "action")
                out["logprobs"] = gaussian_log_prob(action.float(), mean, log_std)
            if compute_entropy:
                out["entropy"] = gaussian_entropy(log_std)  # the same for every row
        if compute_values:
            out["values"] = self._value(z)
        return out

    def _gaussian(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """(μ, log σ) of π(·|z), each ``[batch, action_dim]``, in fp32."""
        mean = self.mean(z.to(self.mean.weight.dtype)).float()
        return mean, self.log_std.float().expand_as(mean)

    def _value(self, z: Tensor) -> Tensor:
        dtype = self.mean.weight.dtype
        value: Tensor = self.critic(z.to(dtype)).squeeze(-1).float()
        # A tensor of its own, not a view: FSDP2 warns about views among a forward's outputs.
        return value.clone()


def build_linear_gaussian_policy(cfg: ModelConfig, torch_dtype: torch.dtype) -> nn.Module:
    """The registry builder: ``builder(cfg, torch_dtype)``, sizes from ``cfg.model_kwargs``."""
    # model_kwargs holds JSON-like values; the reader types them, naming a bad or unknown key.
    read = KwargsReader(cfg.model_kwargs, "linear_gaussian")
    read.reject_unknown({"obs_dim", "action_dim", "hidden", "init_log_std"})
    return LinearGaussianPolicy(
        obs_dim=read.positive_int("obs_dim", 4),
        action_dim=read.positive_int("action_dim", 2),
        hidden=read.positive_int("hidden", 64),
        init_log_std=read.float_("init_log_std", -0.5),
        dtype=torch_dtype,
    )
