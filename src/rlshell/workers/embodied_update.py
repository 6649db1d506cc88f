"""PPO's update on a rollout window of an embodied policy: epochs of shuffled minibatches.

The losses are rlcore's (`rlcore.losses.ppo_policy_loss`, `value_loss`,
`entropy_loss`) and the advantage whitening `rlcore.masked.masked_whiten`;
this module only feeds them minibatches of `rlshell.rollout.trajectory.Samples`
through the policy's `default_forward`, and steps the optimizer:

    L = L_clip + c_v · L_V − c_H · H,   per minibatch, gradient norm clipped

as in PPO (Schulman et al. 2017) and its common implementations (CleanRL,
Stable-Baselines3): advantages standardised per minibatch, value loss
optionally clipped around the old values.

A policy that breaks its contract is named in the error: actions of the
wrong shape for the env (`EnvStepper.step` names the policy class, the env
and both shapes), ``forward_inputs`` without a key ``default_forward`` reads
(a `MissingInputError` naming the class and the key), or a
``default_forward`` result without ``logprobs``, ``entropy`` or ``values``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from attrs import field, frozen
from torch import Tensor
from torch.distributed.fsdp import FSDPModule

from rlcore.losses import entropy_loss, ppo_policy_loss, value_loss
from rlcore.masked import masked_whiten
from rlshell.envs.stepper import EnvObs, EnvStepper
from rlshell.models.base import BasePolicy, ForwardType, MissingInputError
from rlshell.rollout.trajectory import RewardScaler, Samples, TrajectoryBuffer

__all__ = [
    "OptimizerStep",
    "PPOSettings",
    "collect_rollout",
    "policy_name",
    "policy_values",
    "ppo_update",
]

OptimizerStep = Callable[[], float]
"""Clip, step and clear the gradients; return their norm before clipping."""


def _positive(instance: object, attribute: object, value: float) -> None:
    if not value > 0:
        raise ValueError(
            f"{getattr(attribute, 'name', '?')}: expected a positive number, got {value}"
        )


@frozen
class PPOSettings:
    """PPO's update hyperparameters (the names CleanRL uses)."""

    update_epochs: int = field(default=10, validator=_positive)
    num_minibatches: int = field(default=4, validator=_positive)
    clip_coef: float = field(default=0.2, validator=_positive)
    clip_vloss: float | None = None
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float | None = 0.5
    norm_adv: bool = True


def collect_rollout(
    policy: BasePolicy,
    stepper: EnvStepper,
    buffer: TrajectoryBuffer,
    obs: EnvObs,
    steps: int,
    reward_scaler: RewardScaler | None = None,
) -> EnvObs:
    """``steps`` steps of every env into ``buffer``; returns the observation to continue from.

    With a ``reward_scaler`` the buffer gets scaled rewards (``algorithm.norm_reward``);
    the env's metrics keep the raw ones.

    The value bootstrap of step t is V(sₜ₊₁): the next step's value where the
    episode goes on, the final observation's where it was truncated (one
    extra value call on those rows), nothing where it terminated (gae ignores
    it), and for the window's last step the value of what follows it.
    """
    pending: list[tuple[dict[str, Tensor], Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]] = []
    name = f"{policy_name(policy)}.predict_action_batch"
    for _ in range(steps):
        actions, info = policy.predict_action_batch(obs, mode="train", compute_values=True)
        result = stepper.step(actions, policy=name)
        values = info["prev_values"]
        bootstrap = torch.zeros_like(values)
        if bool(result.truncated.any()):
            rows = result.truncated.nonzero().flatten()
            final = {key: value[rows] for key, value in result.next_obs.items()}
            bootstrap[rows] = policy_values(policy, final)
        pending.append(
            (
                info["forward_inputs"],
                info["prev_logprobs"],
                values,
                (
                    result.rewards
                    if reward_scaler is None
                    else reward_scaler(result.rewards, result.terminated | result.truncated)
                ),
                result.terminated,
                result.truncated,
                bootstrap,
            )
        )
        obs = result.obs
    last = policy_values(policy, obs)
    for t, (inputs, logprobs, values, rewards, terminated, truncated, bootstrap) in enumerate(
        pending
    ):
        following = pending[t + 1][2] if t + 1 < len(pending) else last
        next_values = torch.where(truncated, bootstrap, following)
        buffer.add(inputs, logprobs, values, rewards, terminated, truncated, next_values)
    return obs


def policy_name(policy: BasePolicy) -> str:
    """The policy's class name as its author wrote it (FSDP2 prefixes sharded classes' names)."""
    if isinstance(policy, FSDPModule):
        return next(c.__name__ for c in type(policy).__mro__ if not issubclass(c, FSDPModule))
    return type(policy).__name__


def policy_values(policy: BasePolicy, obs: EnvObs) -> Tensor:
    """V(s) of ``obs`` from the policy's value head (deterministic, no sampling)."""
    _, info = policy.predict_action_batch(obs, mode="eval", compute_values=True)
    if "prev_values" not in info:
        raise ValueError(f"{policy_name(policy)} has no value head; PPO needs one")
    return info["prev_values"]


def ppo_update(
    policy: BasePolicy,
    optimizer: torch.optim.Optimizer | OptimizerStep,
    samples: Samples,
    settings: PPOSettings,
    generator: torch.Generator,
) -> dict[str, float]:
    """``update_epochs`` passes of ``num_minibatches`` steps each; the last pass's mean metrics.

    ``optimizer``: a torch optimizer (gradients clipped to
    ``settings.max_grad_norm`` first), or a callable that clips, steps and
    clears the gradients itself and returns the norm before clipping (e.g.
    `rlshell.fsdp.FSDPModelManager.optimizer_step`, whose clipping is
    ``actor.optim.clip_grad``). A non-finite loss stops before its backward
    pass (FloatingPointError).
    """
    step = optimizer if callable(optimizer) else _torch_step(policy, optimizer, settings)
    totals: dict[str, float] = {}
    steps = 0
    for epoch in range(settings.update_epochs):
        last = epoch == settings.update_epochs - 1
        for minibatch in samples.minibatches(settings.num_minibatches, generator):
            metrics = _step(policy, step, minibatch, settings)
            if last:
                steps += 1
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
    return {f"train/{key}": value / steps for key, value in totals.items()}


def _torch_step(
    policy: BasePolicy, optimizer: torch.optim.Optimizer, settings: PPOSettings
) -> OptimizerStep:
    def step() -> float:
        grad_norm = _clip(policy, settings.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    return step


def _step(
    policy: BasePolicy, optimizer_step: OptimizerStep, batch: Samples, settings: PPOSettings
) -> dict[str, float]:
    out = _default_forward(policy, batch.forward_inputs)
    logprobs, entropy, values = out["logprobs"], out["entropy"], out["values"]
    # rlcore's losses read [batch, time]: each sample is a row of one step.
    mask = torch.ones_like(logprobs, dtype=torch.bool)[:, None]
    advantages = batch.advantages[:, None]
    if settings.norm_adv and batch.size > 1:
        advantages = masked_whiten(advantages, mask)
    policy_loss = ppo_policy_loss(
        logprobs[:, None],
        batch.logprobs[:, None],
        advantages,
        mask,
        clip_low=settings.clip_coef,
    )
    critic = value_loss(
        values[:, None],
        batch.values[:, None],
        batch.returns[:, None],
        mask,
        clip=settings.clip_vloss,
    )
    bonus = entropy_loss(entropy[:, None], mask)
    loss = policy_loss.loss + settings.vf_coef * critic.loss + settings.ent_coef * bonus.loss
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(f"PPO update: the loss is {value}; stopping before its backward")
    torch.autograd.backward(loss)
    grad_norm = optimizer_step()
    metrics = {
        "loss": value,
        "pg_loss": float(policy_loss.loss.detach()),
        "value_loss": float(critic.loss.detach()),
        "entropy": float(entropy.detach().mean()),
        "grad_norm": grad_norm,
    }
    metrics.update({key: float(v) for key, v in policy_loss.metrics.items()})
    return metrics


_PPO_OUTPUTS = ("logprobs", "entropy", "values")


def _default_forward(policy: BasePolicy, forward_inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    """``default_forward``'s result, with a policy's contract breaches named."""
    try:
        # Through __call__, so that module hooks (FSDP's gathers) run.
        out = policy(ForwardType.DEFAULT, forward_inputs=forward_inputs)
    except MissingInputError as error:
        error.policy = policy_name(policy)  # FSDP2 renames a sharded class FSDP<name>
        raise
    except KeyError as error:
        # A policy indexing forward_inputs directly: say which dict lacked the key.
        key = error.args[0] if len(error.args) == 1 else None
        if isinstance(key, str) and key not in forward_inputs:
            raise MissingInputError(
                policy_name(policy), "forward_inputs", key, sorted(forward_inputs)
            ) from error
        raise
    missing = [key for key in _PPO_OUTPUTS if key not in out]
    if missing:
        raise ValueError(
            f"{policy_name(policy)}.default_forward returned {sorted(out)}, without "
            f"{', '.join(repr(key) for key in missing)}; PPO's update needs "
            f"{', '.join(repr(key) for key in _PPO_OUTPUTS)}"
        )
    return dict(out)


def _clip(policy: BasePolicy, max_norm: float | None) -> float:
    params = [p for p in policy.parameters() if p.grad is not None]
    if max_norm is None:
        norms: list[Tensor] = [p.grad.detach().norm() for p in params if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
