"""SAC's replay buffer: a ring of preallocated tensors over (s, a, r, s', term) transitions.

Each row is one env step: the state sₜ, the squashed action aₜ ∈ [−1, 1]
(the policy's, not the env's rescaled one), the reward rₜ, the state that
followed sₜ₊₁ and whether the episode terminated there. Where an episode
ended, sₜ₊₁ is its final observation (`rlshell.envs.stepper.StepResult.next_obs`),
so truncated steps bootstrap from it and terminated ones do not (see
`rlcore.losses.sac_critic_target`). Once ``capacity`` rows are written the
oldest are overwritten. `ReplayBuffer.sample` draws rows uniformly with
replacement, as CleanRL and Stable-Baselines3 do.
"""

from __future__ import annotations

from typing import Any

import torch
from attrs import frozen
from jaxtyping import Bool, Float
from torch import Tensor

__all__ = ["ReplayBatch", "ReplayBuffer"]


@frozen(eq=False)
class ReplayBatch:
    """Transitions sampled from a `ReplayBuffer`, one row each."""

    states: Float[Tensor, "batch obs"]
    actions: Float[Tensor, "batch action"]
    rewards: Float[Tensor, " batch"]
    next_states: Float[Tensor, "batch obs"]
    terminated: Bool[Tensor, " batch"]

    @property
    def size(self) -> int:
        return int(self.rewards.shape[0])


_FIELDS = ("states", "actions", "rewards", "next_states", "terminated")


class ReplayBuffer:
    """A ring buffer of ``capacity`` transitions on ``device``; `add` takes one step of N envs."""

    def __init__(
        self, capacity: int, obs_dim: int, action_dim: int, device: str | torch.device = "cpu"
    ) -> None:
        for name, value in (
            ("capacity", capacity),
            ("obs_dim", obs_dim),
            ("action_dim", action_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ReplayBuffer.{name}: expected a positive int, got {value!r}")
        self.capacity = capacity
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.device = torch.device(device)
        self._tensors: dict[str, Tensor] = {
            "states": torch.zeros(capacity, obs_dim, device=self.device),
            "actions": torch.zeros(capacity, action_dim, device=self.device),
            "rewards": torch.zeros(capacity, device=self.device),
            "next_states": torch.zeros(capacity, obs_dim, device=self.device),
            "terminated": torch.zeros(capacity, dtype=torch.bool, device=self.device),
        }
        self._position = 0  # the row the next transition goes to
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _shapes(self, rows: int) -> dict[str, tuple[int, ...]]:
        return {
            "states": (rows, self.obs_dim),
            "actions": (rows, self.action_dim),
            "rewards": (rows,),
            "next_states": (rows, self.obs_dim),
            "terminated": (rows,),
        }

    def add(
        self,
        states: Float[Tensor, "envs obs"],
        actions: Float[Tensor, "envs action"],
        rewards: Float[Tensor, " envs"],
        next_states: Float[Tensor, "envs obs"],
        terminated: Bool[Tensor, " envs"],
    ) -> None:
        """Append one step of every env (row i: env i); ``actions`` are squashed, in [−1, 1].

        ``next_states`` is ``StepResult.next_obs["states"]``: the final
        observation where an episode ended. With more envs than ``capacity``
        only the last ``capacity`` rows are kept.
        """
        values = {
            "states": states,
            "actions": actions,
            "rewards": rewards,
            "next_states": next_states,
            "terminated": terminated,
        }
        rows = states.shape[0] if states.dim() > 0 else 0
        for name, want in self._shapes(rows).items():
            got = tuple(values[name].shape)
            if got != want:
                raise ValueError(
                    f"ReplayBuffer.add: {name} has shape {got}, expected {want} "
                    f"(num_envs={rows}, obs_dim={self.obs_dim}, action_dim={self.action_dim})"
                )
        if rows > self.capacity:
            values = {name: value[-self.capacity :] for name, value in values.items()}
            rows = self.capacity
        index = (self._position + torch.arange(rows, device=self.device)) % self.capacity
        for name, value in values.items():
            target = self._tensors[name]
            target[index] = value.detach().to(device=self.device, dtype=target.dtype)
        self._position = (self._position + rows) % self.capacity
        self._size = min(self._size + rows, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> ReplayBatch:
        """``batch_size`` rows drawn uniformly with replacement (``generator`` on the CPU)."""
        if batch_size < 1:
            raise ValueError(f"ReplayBuffer.sample: batch_size must be positive, got {batch_size}")
        if self._size < batch_size:
            raise ValueError(
                f"ReplayBuffer.sample: the buffer holds {self._size} transitions, fewer than "
                f"batch_size={batch_size}; collect at least that many first (learning_starts)"
            )
        rows = torch.randint(0, self._size, (batch_size,), generator=generator).to(self.device)
        return ReplayBatch(**{name: self._tensors[name][rows] for name in _FIELDS})

    def contents(self) -> ReplayBatch:
        """Every stored transition, oldest first (copies)."""
        start = self._position if self._size == self.capacity else 0
        rows = (start + torch.arange(self._size, device=self.device)) % self.capacity
        return ReplayBatch(**{name: self._tensors[name][rows] for name in _FIELDS})

    def state_dict(self) -> dict[str, Any]:
        """The filled rows and the write position, for a checkpoint."""
        return {
            "capacity": self.capacity,
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "position": self._position,
            "size": self._size,
            **{name: self._tensors[name][: self._size].clone() for name in _FIELDS},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved into a buffer of the same capacity and dimensions."""
        for key in ("capacity", "obs_dim", "action_dim"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"ReplayBuffer.load_state_dict: the checkpoint has {key}={state.get(key)!r}, "
                    f"this buffer {getattr(self, key)}"
                )
        size, position = int(state["size"]), int(state["position"])
        if not (0 <= size <= self.capacity and 0 <= position < self.capacity):
            raise ValueError(
                f"ReplayBuffer.load_state_dict: size {size} / position {position} do not fit "
                f"capacity {self.capacity}"
            )
        for name, want in self._shapes(size).items():
            got = tuple(state[name].shape)
            if got != want:
                raise ValueError(
                    f"ReplayBuffer.load_state_dict: {name} has shape {got}, expected {want}"
                )
        for name in _FIELDS:
            self._tensors[name].zero_()
            self._tensors[name][:size] = state[name].to(self.device, self._tensors[name].dtype)
        self._size, self._position = size, position
