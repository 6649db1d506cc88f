"""A small MLP policy over discrete actions, built by rlshell's model registry."""

from __future__ import annotations

import torch
from torch import nn

from rlshell.config import ModelConfig
from rlshell.models.model_kwargs import KwargsReader


class BanditPolicy(nn.Module):
    """Observation → logits over ``num_actions`` and a value."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.logits = nn.Linear(hidden, num_actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.body(obs)
        return self.logits(features), self.value(features).squeeze(-1)


def build_bandit_policy(cfg: ModelConfig, torch_dtype: torch.dtype) -> nn.Module:
    """The registry builder: ``builder(cfg, torch_dtype)``, sizes from ``cfg.model_kwargs``."""
    # model_kwargs holds JSON-like values; the reader types them, naming a bad key.
    read = KwargsReader(cfg.model_kwargs, "bandit_policy")
    read.reject_unknown({"obs_dim", "num_actions", "hidden"})
    policy = BanditPolicy(
        obs_dim=read.positive_int("obs_dim", 1),
        num_actions=read.positive_int("num_actions", 2),
        hidden=read.positive_int("hidden", 16),
    )
    return policy.to(torch_dtype)
