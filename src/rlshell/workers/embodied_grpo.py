"""Embodied GRPO: groups of envs start from the same state; an episode's advantage is its
return normalised within its group.

Each runner step resets every env with one seed per group of
``algorithm.group_size`` consecutive envs (`rlshell.envs.stepper.EnvStepper.reset`),
so the episodes of a group start alike and differ only by the policy's
sampling, then steps until every env has finished one episode (or
``runner.rollout_steps`` steps). An episode is treated as a response whose
steps are its tokens: its return is placed on its last step and the
registered group estimator (``algorithm.adv_type``: ``grpo``, ``dr_grpo``,
``rloo``) spreads (R − mean_group)/(std_group + ε) over its steps, exactly as
the reasoning runner scores completions (`rlcore.advantages`). Steps after an
env's episode ended are dropped. No value function is learnt; PPO's clipped
update (`rlshell.workers.embodied_update.ppo_update`) then runs with
``vf_coef`` = 0.
"""

from __future__ import annotations

import functools

import torch
from attrs import frozen
from jaxtyping import Bool, Float
from torch import Tensor

from rlcore.advantages import AdvantageBatch, AdvantageConfig
from rlcore.registry import ADVANTAGES
from rlcore.tokens import place_on_last_token
from rlshell.envs.stepper import EnvObs, EnvRestarted, EnvStepError, EnvStepper
from rlshell.models.base import BasePolicy
from rlshell.rollout.trajectory import Samples
from rlshell.workers.embodied_update import Predict, policy_name

__all__ = ["EpisodeWindow", "collect_group_episodes", "group_samples"]


@frozen(eq=False)
class EpisodeWindow:
    """One episode per env, time-major ``[T, N]``; ``valid`` marks steps inside the episode."""

    forward_inputs: dict[str, Tensor]
    logprobs: Float[Tensor, "time envs"]
    rewards: Float[Tensor, "time envs"]
    valid: Bool[Tensor, "time envs"]

    @property
    def returns(self) -> Float[Tensor, " envs"]:
        """Each env's episode return Σₜ rₜ over its valid steps."""
        return torch.where(self.valid, self.rewards, 0.0).sum(0)


def collect_group_episodes(
    policy: BasePolicy,
    stepper: EnvStepper,
    seed: int,
    group_size: int,
    max_steps: int,
    predict: Predict | None = None,
) -> tuple[EpisodeWindow, EnvObs]:
    """Reset with one seed per group, step until each env has ended an episode (≤ ``max_steps``).

    Returns the window and the last observation (the next window resets anyway).
    ``predict`` acts in place of ``policy.predict_action_batch(obs, mode="train",
    compute_values=False)`` (a compiled call of it).

    A step the envs failed (`EnvRestarted`, ``env.on_failure='reset'``) cut
    every group's episodes short: the window is collected again from the same
    seeds, at most ``stepper.max_consecutive_failures`` more times.
    """
    if stepper.num_envs % group_size:
        raise ValueError(
            f"algorithm.group_size: {group_size} does not divide this worker's "
            f"{stepper.num_envs} envs of {stepper.env_id}"
        )
    restarts = 0
    while True:
        try:
            return _group_episodes(policy, stepper, seed, group_size, max_steps, predict)
        except EnvRestarted as restart:
            restarts += 1
            if restarts > stepper.max_consecutive_failures:
                raise EnvStepError(
                    f"{restart} — the window's episodes were cut short {restarts} times, more "
                    f"than env.max_consecutive_failures={stepper.max_consecutive_failures}; "
                    "stopping"
                ) from restart


def _group_episodes(
    policy: BasePolicy,
    stepper: EnvStepper,
    seed: int,
    group_size: int,
    max_steps: int,
    predict: Predict | None,
) -> tuple[EpisodeWindow, EnvObs]:
    obs = stepper.reset(seed, group_size)
    running = torch.ones(stepper.num_envs, dtype=torch.bool)
    inputs: list[dict[str, Tensor]] = []
    logprobs: list[Tensor] = []
    rewards: list[Tensor] = []
    valid: list[Tensor] = []
    name = f"{policy_name(policy)}.predict_action_batch"
    if predict is None:
        predict = functools.partial(policy.predict_action_batch, mode="train", compute_values=False)
    for _ in range(max_steps):
        actions, info = predict(obs)
        result = stepper.step(actions, policy=name, chunk=policy.action_chunk)
        inputs.append(info["forward_inputs"])
        logprobs.append(info["prev_logprobs"].float().cpu())
        rewards.append(result.rewards.float().cpu())
        valid.append(running.clone())
        running &= ~(result.terminated | result.truncated).cpu()
        obs = result.obs
        if not bool(running.any()):
            break
    window = EpisodeWindow(
        forward_inputs={key: torch.stack([step[key] for step in inputs]) for key in inputs[0]},
        logprobs=torch.stack(logprobs),
        rewards=torch.stack(rewards),
        valid=torch.stack(valid),
    )
    return window, obs


def group_samples(window: EpisodeWindow, adv_type: str, group_size: int) -> Samples:
    """The window's valid steps as PPO samples, with group-normalised episode advantages.

    The estimator sees envs as rows and steps as tokens: ``token_rewards`` is
    each episode's return on its last valid step, ``mask`` the valid steps.
    Values and returns are zero (no critic).
    """
    valid = window.valid.T  # [envs, time]
    token_rewards = place_on_last_token(window.returns, valid)
    advantages = ADVANTAGES.get(adv_type)(
        AdvantageBatch(token_rewards=token_rewards, mask=valid, group_size=group_size),
        AdvantageConfig(),
    ).advantages.T  # [time, envs]
    rows = window.valid.reshape(-1).nonzero().flatten()
    flat = {
        key: value.reshape(-1, *value.shape[2:])[rows.to(value.device)]
        for key, value in window.forward_inputs.items()
    }
    zeros = torch.zeros(rows.numel())
    return Samples(
        forward_inputs=flat,
        logprobs=window.logprobs.reshape(-1)[rows],
        values=zeros,
        advantages=advantages.reshape(-1)[rows].float(),
        returns=zeros.clone(),
    )
