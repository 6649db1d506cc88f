"""The KL penalty in the reward (``algorithm.kl_in_reward``) and its coefficient β.

β starts at ``algorithm.kl_coef`` and, with ``algorithm.kl_target`` set, moves
after each step (`rlcore.shaping.adaptive_kl_coef`); a moving β is saved with
the checkpoint and restored on resume.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rlcore.shaping import adaptive_kl_coef, kl_penalized_rewards
from rlshell.config import AlgorithmConfig
from rlshell.rollout import RolloutBatch
from rlshell.rollout.advantages import outcome_token_rewards

__all__ = ["KLPenalty"]


class KLPenalty:
    """β of the KL penalty in the reward and how it moves."""

    def __init__(self, algorithm: AlgorithmConfig) -> None:
        self.algorithm = algorithm
        self.coef = algorithm.kl_coef

    @property
    def in_reward(self) -> bool:
        """Whether the KL term is a penalty in the reward (read only where a reference runs:
        with ``kl_coef`` 0 the key is declared unread)."""
        return self.algorithm.kl_coef > 0 and self.algorithm.kl_in_reward

    @property
    def adaptive(self) -> bool:
        """Whether β moves (and so is checkpointed)."""
        return self.in_reward and self.algorithm.kl_target is not None

    def penalised(
        self,
        batch: RolloutBatch,
        scores: torch.Tensor,
        logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """The token rewards with the KL penalty of π_old (``logprobs``) against the
        reference at this step's β (`rlcore.shaping.kl_penalized_rewards`); β moves for the
        next step when ``algorithm.kl_target`` is set."""
        algorithm = self.algorithm
        placed = outcome_token_rewards(batch, scores)
        rewards, kl = kl_penalized_rewards(
            placed,
            logprobs.float(),
            ref_logprobs.float(),
            batch.trained_mask,
            self.coef,
            algorithm.kl_kind,
        )
        response_kl = float(kl.sum(-1).mean())  # KL of a response: summed over its tokens
        metrics["reward/kl"] = response_kl
        metrics["reward/kl_coef"] = self.coef
        metrics["reward/kl_penalty"] = self.coef * response_kl
        if algorithm.kl_target is not None:
            self.coef = adaptive_kl_coef(
                self.coef, response_kl, algorithm.kl_target, algorithm.kl_horizon, batch.rows
            )
        return rewards

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of β (nothing unless it moves)."""
        return {"kl_coef": self.coef} if self.adaptive else {}

    def restore(
        self, extra: Mapping[str, Any], checkpoint: Path, print_line: Callable[[str], None]
    ) -> None:
        """β from a checkpoint's `state`; a checkpoint without one is said, and β restarts."""
        if not self.adaptive:
            return
        if "kl_coef" in extra:
            self.coef = float(extra["kl_coef"])
        else:
            print_line(
                f"{checkpoint} holds no adaptive KL coefficient (its run had no "
                f"algorithm.kl_target): β starts again from algorithm.kl_coef={self.coef}"
            )
