"""Embodied rollouts: the steps of ``num_envs`` vectorised envs, time-major, and PPO's samples.

`TrajectoryBuffer` records what one rollout window of ``T`` steps of ``N``
envs produced: for each step the policy's ``forward_inputs`` (what
`rlshell.models.BasePolicy.default_forward` recomputes from), its behaviour
log-probs and values, the rewards, and the ``terminated`` / ``truncated``
flags with the value of the observation that followed (``next_values``:
the final observation's where an episode ended, per `rlcore.advantages.gae`).
`TrajectoryBuffer.finish` computes advantages and returns with rlcore's
``gae`` and flattens the window into `Samples`, which `Samples.minibatches`
cuts into shuffled minibatches for PPO's epochs. No maths here beyond
moving tensors: the estimator is rlcore's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from attrs import frozen
from jaxtyping import Bool, Float
from torch import Tensor

from rlcore import normalize as running_stats
from rlcore.advantages import gae

__all__ = ["RewardScaler", "Samples", "TrajectoryBuffer"]


@frozen(eq=False)
class Samples:
    """A rollout window flattened to ``T·N`` samples (row t·N + i: step t of env i)."""

    forward_inputs: dict[str, Tensor]
    logprobs: Float[Tensor, "samples"]
    values: Float[Tensor, "samples"]
    advantages: Float[Tensor, "samples"]
    returns: Float[Tensor, "samples"]

    @property
    def size(self) -> int:
        return int(self.logprobs.shape[0])

    def select(self, rows: Tensor) -> Samples:
        """These rows (an index tensor) of every field."""
        return Samples(
            forward_inputs={key: value[rows] for key, value in self.forward_inputs.items()},
            logprobs=self.logprobs[rows],
            values=self.values[rows],
            advantages=self.advantages[rows],
            returns=self.returns[rows],
        )

    def minibatches(self, count: int, generator: torch.Generator) -> Iterator[Samples]:
        """One pass over the samples in ``count`` shuffled minibatches of (nearly) equal size.

        One minibatch is the samples as they are: a loss averaged over all of them does
        not depend on their order, so no permutation is drawn (nor copied).
        """
        if not 1 <= count <= self.size:
            raise ValueError(
                f"num_minibatches: expected 1 to {self.size} (the rollout's samples), got {count}"
            )
        if count == 1:
            yield self
            return
        order = torch.randperm(self.size, generator=generator)
        for rows in torch.tensor_split(order, count):
            yield self.select(rows)


class RewardScaler:
    """Rewards divided by the running standard deviation of the discounted return.

    Per env, Gₜ = γ Gₜ₋₁ (1 − doneₜ₋₁) + rₜ; the statistics of every Gₜ seen
    (`rlcore.normalize`) give r̃ₜ = clip(rₜ / √(Var[G] + 10⁻⁸), ±10). This is
    the reward scaling of PPO's common implementations (gymnasium's
    ``NormalizeReward``, SB3's ``VecNormalize``, CleanRL's continuous PPO):
    the rewards keep their sign and mean-zero shift is not applied.
    `state_dict` / `load_state_dict` carry it across a resume.
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0) -> None:
        self.gamma = gamma
        self.clip = clip
        self.returns = torch.zeros(num_envs, dtype=torch.float64)
        self.stats = running_stats.init(())

    def __call__(self, rewards: Float[Tensor, " envs"], dones: Bool[Tensor, " envs"]) -> Tensor:
        """Scale one step's rewards; ``dones`` ends those envs' discounted returns after it."""
        raw = rewards.detach().to(device=self.returns.device, dtype=torch.float64)
        self.returns = self.returns * self.gamma + raw
        self.stats = running_stats.update(self.stats, self.returns)
        scale = torch.sqrt(running_stats.variance(self.stats) + 1e-8)
        self.returns = torch.where(dones.to(self.returns.device), 0.0, self.returns)
        scaled = (raw / scale).clamp(-self.clip, self.clip)
        return scaled.to(device=rewards.device, dtype=rewards.dtype)

    def end_returns(self) -> None:
        """End every env's discounted return (its episodes were cut short)."""
        self.returns = torch.zeros_like(self.returns)

    def state_dict(self) -> dict[str, Tensor]:
        return {
            "returns": self.returns.clone(),
            "count": self.stats.count.clone(),
            "mean": self.stats.mean.clone(),
            "m2": self.stats.m2.clone(),
        }

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        if state["returns"].shape != self.returns.shape:
            raise ValueError(
                f"RewardScaler.load_state_dict: {state['returns'].shape[0]} envs saved, "
                f"this scaler has {self.returns.shape[0]}"
            )
        self.returns = state["returns"].clone()
        self.stats = running_stats.RunningStats(state["count"], state["mean"], state["m2"])


class TrajectoryBuffer:
    """The steps of one rollout window, appended in order; `finish` turns them into `Samples`."""

    def __init__(self, num_envs: int) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs: expected a positive integer, got {num_envs}")
        self.num_envs = num_envs
        self._inputs: list[dict[str, Tensor]] = []
        self._columns: dict[str, list[Tensor]] = {}
        self._clear()

    def _clear(self) -> None:
        self._inputs = []
        self._columns = {
            key: []
            for key in ("logprobs", "values", "rewards", "terminated", "truncated", "next_values")
        }

    def __len__(self) -> int:
        return len(self._inputs)

    def add(
        self,
        forward_inputs: dict[str, Tensor],
        logprobs: Float[Tensor, " envs"],
        values: Float[Tensor, " envs"],
        rewards: Float[Tensor, " envs"],
        terminated: Bool[Tensor, " envs"],
        truncated: Bool[Tensor, " envs"],
        next_values: Float[Tensor, " envs"],
    ) -> None:
        """One step of every env: what the policy cached and what the envs answered."""
        step = {
            "logprobs": logprobs,
            "values": values,
            "rewards": rewards,
            "terminated": terminated,
            "truncated": truncated,
            "next_values": next_values,
        }
        for key, tensor in [*step.items(), *forward_inputs.items()]:
            if tensor.shape[:1] != (self.num_envs,):
                raise ValueError(
                    f"step {len(self)}: '{key}' has shape {tuple(tensor.shape)}; expected "
                    f"{self.num_envs} rows (one per env) first"
                )
        if self._inputs and forward_inputs.keys() != self._inputs[0].keys():
            raise ValueError(
                f"step {len(self)}: forward_inputs keys {sorted(forward_inputs)} differ from "
                f"the first step's {sorted(self._inputs[0])}"
            )
        self._inputs.append({key: value.detach() for key, value in forward_inputs.items()})
        for key, tensor in step.items():
            self._columns[key].append(tensor.detach())

    def finish(self, gamma: float, lam: float) -> Samples:
        """GAE over the window (rlcore's ``gae``, env-major), flattened time-major; then empty."""
        if not self._inputs:
            raise ValueError("finish(): the buffer holds no steps")
        # [T, N] stacks; gae wants the time axis last.
        cols = {key: torch.stack(values) for key, values in self._columns.items()}
        estimate = gae(
            rewards=cols["rewards"].float().T,
            values=cols["values"].float().T,
            next_values=cols["next_values"].float().T,
            terminated=cols["terminated"].bool().T,
            truncated=cols["truncated"].bool().T,
            gamma=gamma,
            lam=lam,
        )
        inputs = {key: torch.cat([step[key] for step in self._inputs]) for key in self._inputs[0]}
        samples = Samples(
            forward_inputs=inputs,
            logprobs=cols["logprobs"].reshape(-1),
            values=cols["values"].reshape(-1),
            advantages=estimate.advantages.T.reshape(-1),
            returns=estimate.returns.T.reshape(-1),
        )
        self._clear()
        return samples
