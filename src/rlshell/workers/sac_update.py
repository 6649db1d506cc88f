"""SAC's update on an embodied policy with twin Q heads, and the env steps that feed it.

Soft actor-critic (Haarnoja et al. 2018, arXiv:1812.05905) as CleanRL's
``sac_continuous_action`` runs it. The maths is rlcore's
(`rlcore.losses.sac_critic_target`, `sac_critic_loss`, `sac_actor_loss`,
`sac_temperature_loss`); `SACLearner.update` only wires them, one replay
batch per call:

    y  = r + γ (1 − term) (minᵢ Q'ᵢ(s', a') − α log π(a'|s')),  a' ~ π(·|s')
    L_Q = Σᵢ ½ E[(Qᵢ(s, a) − y)²]                                  every step
    L_π = E[α log π(a|s) − minᵢ Qᵢ(s, a)]                    every ``policy_frequency`` steps
    L_α = −E[log α · (log π(a|s) + H̄)]                      with the actor
    θ'  ← τ θ + (1 − τ) θ'                          every ``target_network_frequency`` steps

As in CleanRL, the delayed actor and temperature step runs
``policy_frequency`` times when it runs, so they get as many steps as the critic.

The policy is a `rlshell.models.BasePolicy` whose ``SAC`` forward samples
reparameterised actions a ∈ [−1, 1] with their log-probs and whose ``SAC_Q``
forward returns the twin Q values; its Q heads are the submodules named in
``q_heads`` (``q1`` and ``q2`` for ``mlp_policy``), the rest is the actor.
The target network is a ``copy.deepcopy`` of the whole policy, read only
through ``SAC_Q``, so any policy that honours the contract works; only its Q
heads are Polyak-averaged and checkpointed (its actor copy is never read).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from attrs import field, frozen
from jaxtyping import Bool, Float
from torch import Tensor, nn

from rlcore import unchecked
from rlcore.losses import (
    sac_actor_loss,
    sac_critic_loss,
    sac_critic_target,
    sac_temperature_loss,
)
from rlcore.types import LossOutput
from rlshell.envs.stepper import EnvObs, EnvRestarted, EnvStepper
from rlshell.models.base import BasePolicy, ForwardType
from rlshell.rollout.replay import ReplayBatch, ReplayBuffer
from rlshell.workers.embodied_update import policy_name

__all__ = ["SACLearner", "SACSettings", "collect_sac_steps", "polyak_update"]


def _positive(instance: object, attribute: object, value: float) -> None:
    if not value > 0:
        raise ValueError(
            f"{getattr(attribute, 'name', '?')}: expected a positive number, got {value}"
        )


def _fraction(instance: object, attribute: object, value: float) -> None:
    if not 0 <= value <= 1:
        raise ValueError(
            f"{getattr(attribute, 'name', '?')}: expected a value in [0, 1], got {value}"
        )


def _non_negative(instance: object, attribute: object, value: int) -> None:
    if value < 0:
        raise ValueError(f"{getattr(attribute, 'name', '?')}: expected 0 or more, got {value}")


@frozen
class SACSettings:
    """SAC's hyperparameters, with CleanRL's ``sac_continuous_action`` names and defaults.

    ``learning_starts``: env steps of uniform random actions before the first
    update (read by the loop that calls `collect_sac_steps`). ``alpha``: the
    initial (or, without ``autotune``, fixed) temperature. ``target_entropy``:
    H̄, −dim(A) when None. CleanRL steps α with ``q_lr``; so does the default here.
    """

    gamma: float = field(default=0.99, validator=_fraction)
    tau: float = field(default=0.005, validator=_fraction)
    batch_size: int = field(default=256, validator=_positive)
    learning_starts: int = field(default=5000, validator=_non_negative)
    policy_frequency: int = field(default=2, validator=_positive)
    target_network_frequency: int = field(default=1, validator=_positive)
    autotune: bool = True
    alpha: float = field(default=0.2, validator=_positive)
    target_entropy: float | None = None
    policy_lr: float = field(default=3e-4, validator=_positive)
    q_lr: float = field(default=1e-3, validator=_positive)
    alpha_lr: float = field(default=1e-3, validator=_positive)


@torch.no_grad()
def polyak_update(target: Iterable[Tensor], online: Iterable[Tensor], tau: float) -> None:
    """θ' ← τ θ + (1 − τ) θ' in place, pairwise over ``target`` (θ') and ``online`` (θ)."""
    targets, onlines = list(target), list(online)
    if len(targets) != len(onlines):
        raise ValueError(
            f"polyak_update: {len(targets)} target tensors but {len(onlines)} online ones"
        )
    torch._foreach_lerp_(targets, onlines, tau)


def _check_finite(loss: LossOutput, name: str) -> float:
    value = float(loss.loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(f"SAC update: {name} is {value}; stopping before its backward")
    return value


def _finite_step(optimizer: torch.optim.Optimizer, name: str) -> None:
    """``optimizer.step()`` unless its gradients' norm is NaN or infinite: then they are
    cleared, nothing is applied, and FloatingPointError names the loss (``name``)."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]]
    present = [grad for grad in grads if grad is not None]
    if present:
        norm = float(torch.nn.utils.get_total_norm(present))
        if not math.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"SAC update: the gradient norm of {name} is {norm}; its step was skipped"
            )
    optimizer.step()


class SACLearner:
    """The policy, its target Q heads, log α and three Adam optimizers; `update` is one SAC step.

    ``step`` counts the updates done; the delayed actor and target updates
    key off it. `state_dict` holds everything needed to resume.
    """

    def __init__(
        self,
        policy: BasePolicy,
        action_dim: int,
        settings: SACSettings,
        q_heads: Sequence[str] = ("q1", "q2"),
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.q_heads = tuple(q_heads)
        self.target_entropy = (
            -float(action_dim) if settings.target_entropy is None else settings.target_entropy
        )
        modules = dict(policy.named_children())
        missing = [name for name in self.q_heads if name not in modules]
        if missing:
            raise ValueError(
                f"SACLearner: {type(policy).__name__} has no Q head submodule "
                f"{', '.join(repr(m) for m in missing)} (it has {', '.join(sorted(modules))}); "
                "pass q_heads= the names of its Q networks"
            )
        self.target = copy.deepcopy(policy).requires_grad_(False)
        q_params = self._q_named(policy)
        actor_params = [
            p for name, p in policy.named_parameters() if name not in q_params and p.requires_grad
        ]
        if not actor_params:
            raise ValueError(f"SACLearner: {type(policy).__name__} has no actor parameters")
        self.critic_optimizer = torch.optim.Adam(list(q_params.values()), lr=settings.q_lr)
        self.actor_optimizer = torch.optim.Adam(actor_params, lr=settings.policy_lr)
        device = next(policy.parameters()).device
        self.log_alpha = torch.tensor(
            math.log(settings.alpha), device=device, requires_grad=settings.autotune
        )
        self.alpha_optimizer = (
            torch.optim.Adam([self.log_alpha], lr=settings.alpha_lr) if settings.autotune else None
        )
        self.device = device
        self.step = 0

    def _q_named(self, module: nn.Module) -> dict[str, nn.Parameter]:
        prefixes = tuple(f"{name}." for name in self.q_heads)
        return {name: p for name, p in module.named_parameters() if name.startswith(prefixes)}

    @property
    def alpha(self) -> float:
        """The current temperature α = exp(log α)."""
        return float(self.log_alpha.detach().exp())

    def update(self, batch: ReplayBatch) -> dict[str, float]:
        """One SAC step on ``batch``; metrics under ``train/``.

        Always ``qf_loss``, ``q_mean``, ``alpha``; ``actor_loss``, ``entropy``
        (−E[log π]) and, with ``autotune``, ``alpha_loss`` on the steps that
        update the actor (the last of its ``policy_frequency`` repeats). A
        non-finite loss raises FloatingPointError before its backward pass, a
        non-finite gradient norm before its optimizer's step.
        """
        settings = self.settings
        states = batch.states.to(self.device)
        actions = batch.actions.to(self.device)
        next_states = batch.next_states.to(self.device)
        metrics = self._critic_step(
            states,
            actions,
            batch.rewards.to(self.device),
            next_states,
            batch.terminated.to(self.device),
        )
        if self.step % settings.policy_frequency == 0:
            for _ in range(settings.policy_frequency):
                metrics.update(self._actor_step(states))
        if self.step % settings.target_network_frequency == 0:
            polyak_update(
                self._q_named(self.target).values(),
                self._q_named(self.policy).values(),
                settings.tau,
            )
        self.step += 1
        metrics["alpha"] = self.alpha
        return {f"train/{key}": value for key, value in metrics.items()}

    def _twin_q(self, network: nn.Module, states: Tensor, actions: Tensor) -> Tensor:
        # Through __call__, so that module hooks (FSDP's gathers) run.
        q1, q2 = network(ForwardType.SAC_Q, states=states, actions=actions)
        return torch.stack([q1, q2], dim=-1)

    @torch.no_grad()
    def critic_target(
        self,
        rewards: Float[Tensor, " batch"],
        next_states: Float[Tensor, "batch obs"],
        terminated: Bool[Tensor, " batch"],
    ) -> Float[Tensor, " batch"]:
        """y = r + γ (1 − term) (minᵢ Q'ᵢ(s', a') − α log π(a'|s')), a' ~ π(·|s') fresh.

        Q' are the target Q heads; ``next_states`` holds the final observation
        where an episode ended, so a truncated step bootstraps from it.
        """
        next_actions, next_logprobs = self.policy(ForwardType.SAC, states=next_states)
        next_q = self._twin_q(self.target, next_states, next_actions)
        return sac_critic_target(
            rewards,
            next_q,
            next_logprobs,
            terminated,
            self.settings.gamma,
            self.log_alpha.detach().exp(),
        )

    def _critic_step(
        self,
        states: Tensor,
        actions: Tensor,
        rewards: Tensor,
        next_states: Tensor,
        terminated: Tensor,
    ) -> dict[str, float]:
        target = self.critic_target(rewards, next_states, terminated)
        critic = sac_critic_loss(self._twin_q(self.policy, states, actions), target)
        value = _check_finite(critic, "the critic loss")
        self.critic_optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(critic.loss)
        _finite_step(self.critic_optimizer, "the critic loss")
        return {"qf_loss": value, "q_mean": float(critic.metrics["q_mean"])}

    def _actor_step(self, states: Tensor) -> dict[str, float]:
        new_actions, logprobs = self.policy(ForwardType.SAC, states=states)
        q_values = self._twin_q(self.policy, states, new_actions)
        actor = sac_actor_loss(logprobs, q_values, self.log_alpha.detach().exp())
        value = _check_finite(actor, "the actor loss")
        # Zero every policy gradient: the actor loss also reaches the Q heads, whose
        # optimizer must not see it.
        self.policy.zero_grad(set_to_none=True)
        torch.autograd.backward(actor.loss)
        _finite_step(self.actor_optimizer, "the actor loss")
        metrics = {"actor_loss": value, "entropy": float(actor.metrics["entropy"])}
        if self.alpha_optimizer is not None:
            with torch.no_grad():
                _, fresh_logprobs = self.policy(ForwardType.SAC, states=states)
            temperature = sac_temperature_loss(self.log_alpha, fresh_logprobs, self.target_entropy)
            metrics["alpha_loss"] = _check_finite(temperature, "the temperature loss")
            self.alpha_optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(temperature.loss)
            _finite_step(self.alpha_optimizer, "the temperature loss")
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Policy, target Q heads, log α, the three optimizers and the step count."""
        return {
            "policy": self.policy.state_dict(),
            "target_q": {
                name: p.detach().clone() for name, p in self._q_named(self.target).items()
            },
            "log_alpha": self.log_alpha.detach().clone(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "alpha_optimizer": (
                None if self.alpha_optimizer is None else self.alpha_optimizer.state_dict()
            ),
            "step": self.step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved (same policy architecture and ``autotune``)."""
        self.policy.load_state_dict(state["policy"])
        target_q = self._q_named(self.target)
        saved: dict[str, Tensor] = state["target_q"]
        if set(saved) != set(target_q):
            raise ValueError(
                f"SACLearner.load_state_dict: target_q holds {sorted(saved)}, "
                f"expected {sorted(target_q)}"
            )
        with torch.no_grad():
            for name, param in target_q.items():
                param.copy_(saved[name])
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if (state["alpha_optimizer"] is None) != (self.alpha_optimizer is None):
            raise ValueError(
                "SACLearner.load_state_dict: the checkpoint and this learner differ in autotune"
            )
        if self.alpha_optimizer is not None:
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.step = int(state["step"])


def collect_sac_steps(
    policy: BasePolicy,
    stepper: EnvStepper,
    replay: ReplayBuffer,
    obs: EnvObs,
    steps: int,
    generator: torch.Generator,
    random_actions: bool,
    bootstrap_at_done: bool = False,
) -> EnvObs:
    """``steps`` steps of every env into ``replay``; returns the observation to continue from.

    ``random_actions`` (before ``learning_starts``): uniform in the env's Box
    bounds, a_env = low + u (high − low), u ~ U(0, 1) from ``generator``,
    stored as 2u − 1 ∈ [−1, 1]. Otherwise the policy samples a = tanh(u)
    (its ``forward_inputs["action"]`` is the pre-tanh u) and the env gets
    its rescaled action. The buffer's s' is ``StepResult.next_obs``: the final
    observation where an episode ended. With ``bootstrap_at_done`` no step is
    stored as terminated: the target bootstraps from s' after a termination too
    (`StepResult.bootstrapped_at_done`).

    A step the envs failed (`EnvRestarted`, ``env.on_failure='reset'``) stores
    nothing and is taken again from the new episodes' first observation: the
    transitions before it stand as they are (their s' not terminal).
    """
    low, high = _box_bounds(stepper)
    name = f"{policy_name(policy)}.predict_action_batch"
    step = 0
    while step < steps:
        if random_actions:
            unit = torch.rand(stepper.action_shape, generator=generator)
            env_actions = low + unit * (high - low)
            squashed = 2.0 * unit - 1.0
        else:
            # rlcore's checks on the first step; the others repeat its shapes (rlcore.unchecked).
            with unchecked() if step else nullcontext():
                env_actions, info = policy.predict_action_batch(
                    obs, mode="train", compute_values=False
                )
            squashed = torch.tanh(info["forward_inputs"]["action"].float())
        try:
            result = stepper.step(env_actions, policy=name)
        except EnvRestarted as restart:
            obs = restart.obs
            continue
        if bootstrap_at_done:
            result = result.bootstrapped_at_done()
        replay.add(
            obs["states"],
            squashed,
            result.rewards,
            result.next_obs["states"],
            result.terminated,
        )
        obs = result.obs
        step += 1
    return obs


def _box_bounds(stepper: EnvStepper) -> tuple[Tensor, Tensor]:
    from gymnasium import spaces

    space = stepper.action_space
    if not isinstance(space, spaces.Box) or not space.is_bounded("both"):
        raise ValueError(f"env {stepper.env_id}: SAC needs a bounded Box action space, got {space}")
    return (
        torch.as_tensor(space.low, dtype=torch.float32),
        torch.as_tensor(space.high, dtype=torch.float32),
    )
