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
from typing import NamedTuple

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
    compiled: CompiledPPOGradients | None = None,
) -> dict[str, float]:
    """``update_epochs`` passes of ``num_minibatches`` steps each; the last pass's mean metrics.

    ``optimizer``: a torch optimizer (gradients clipped to
    ``settings.max_grad_norm`` first), or a callable that clips, steps and
    clears the gradients itself and returns the norm before clipping (e.g.
    `rlshell.fsdp.FSDPModelManager.optimizer_step`, whose clipping is
    ``actor.optim.clip_grad``). A non-finite loss stops before its backward
    pass (FloatingPointError). ``compiled``: the forward and backward passes of
    `CompiledPPOGradients` (the same maths) instead of eager ones.
    """
    step = optimizer if callable(optimizer) else _torch_step(policy, optimizer, settings)
    if compiled is not None:
        compiled.bind(policy)
    totals: dict[str, float] = {}
    steps = 0
    for epoch in range(settings.update_epochs):
        last = epoch == settings.update_epochs - 1
        for minibatch in samples.minibatches(settings.num_minibatches, generator):
            metrics = _step(policy, step, minibatch, settings, compiled)
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


class PPOLoss(NamedTuple):
    """One minibatch's PPO objective and its parts (0-d tensors; ``loss`` keeps its graph)."""

    loss: Tensor
    pg_loss: Tensor
    value_loss: Tensor
    entropy: Tensor
    policy_metrics: dict[str, Tensor]


def ppo_loss(out: dict[str, Tensor], batch: Samples, settings: PPOSettings) -> PPOLoss:
    """L = L_clip + c_v · L_V − c_H · H on one minibatch from rlcore's losses, given
    ``default_forward``'s outputs ``out`` on ``batch.forward_inputs``."""
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
    return PPOLoss(
        loss,
        policy_loss.loss.detach(),
        critic.loss.detach(),
        entropy.detach().mean(),
        {key: value.detach() for key, value in policy_loss.metrics.items()},
    )


_Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # a minibatch's shapes, input by input


class CompiledPPOGradients:
    """`ppo_loss` and its gradients in one compiled call (``actor.compile``).

    The policy's ``default_forward``, rlcore's losses and their backward pass
    are traced once (``torch.func.grad`` under ``make_fx``, on fake tensors)
    into one graph of the parameters, buffers and a minibatch, which
    ``torch.compile`` (inductor) compiles: one call instead of a few hundred
    eager ops per PPO step. The maths is the eager path's; inductor's fused
    kernels round differently, so the result agrees with it to float
    rounding (~1e-7 relative), not bit for bit, and a run drifts from the
    eager one after some windows as any float change would make it.

    A policy's ``default_forward`` must not branch on tensor values nor
    draw random numbers (tracing fails on the first; the second would be
    inductor's generator, not torch's). Compiled per minibatch shape; `warm_up`
    compiles for one on a dummy batch without touching parameters, gradients,
    optimizer state or RNG streams.
    """

    def __init__(self, policy: BasePolicy, settings: PPOSettings) -> None:
        self.policy = policy
        self.settings = settings
        self.trained: dict[str, Tensor] = {}
        self._params: dict[str, Tensor] = {}
        self._buffers: dict[str, Tensor] = {}
        self.bind(policy)
        # One compiled graph per minibatch shape (a window may split into two sizes).
        self._compiled: dict[_Shapes, Callable[..., tuple[dict[str, Tensor], PPOLoss]]] = {}

    def bind(self, policy: BasePolicy) -> None:
        """Read ``policy``'s current parameters and buffers (`ppo_update` does, once per
        window: a checkpoint load may have replaced them)."""
        if policy is not self.policy:
            raise ValueError(
                f"CompiledPPOGradients was built for a {policy_name(self.policy)} at "
                f"{id(self.policy):#x}, not this {policy_name(policy)}: build one per policy"
            )
        self.trained = {name: p for name, p in policy.named_parameters() if p.requires_grad}
        # Detached views of the same storage: the optimizer steps them in place.
        self._params = {name: p.detach() for name, p in self.trained.items()}
        self._buffers = dict(policy.named_buffers())

    def __call__(self, batch: Samples) -> tuple[PPOLoss, dict[str, Tensor]]:
        """The minibatch's `PPOLoss` (detached) and d loss / d parameter by parameter name."""
        shapes = _batch_shapes(batch)
        compiled = self._compiled.get(shapes)
        if compiled is None:
            compiled = self._compiled[shapes] = self._compile(batch)
        grads, parts = compiled(self._params, self._buffers, *_fields(batch))
        return parts, grads

    def backward(self, batch: Samples) -> PPOLoss:
        """Like ``ppo_loss(...).loss.backward()``: gradients into ``.grad``; the detached parts."""
        parts, grads = self(batch)
        _finite_loss(parts.loss)
        for name, grad in grads.items():
            param = self.trained[name]
            if param.grad is None:
                param.grad = grad
            else:
                param.grad += grad
        return parts

    @property
    def compiled_rows(self) -> list[int]:
        """The minibatch sizes compiled so far."""
        return sorted(dict(shapes)["rows"][0] for shapes in self._compiled)

    def warm_up(self, example: Samples) -> None:
        """Compile for ``example``'s shapes now (e.g. at worker start-up), changing nothing."""
        rng = torch.get_rng_state()
        self(example)
        torch.set_rng_state(rng)

    def _compile(self, example: Samples) -> Callable[..., tuple[dict[str, Tensor], PPOLoss]]:
        from torch.fx.experimental.proxy_tensor import make_fx

        policy, settings = self.policy, self.settings

        def loss_and_grads(
            params: dict[str, Tensor],
            buffers: dict[str, Tensor],
            forward_inputs: dict[str, Tensor],
            *tensors: Tensor,
        ) -> tuple[dict[str, Tensor], PPOLoss]:
            batch = Samples(forward_inputs, *tensors)

            def objective(trained: dict[str, Tensor]) -> tuple[Tensor, PPOLoss]:
                def call(*args: object, **kwargs: object) -> dict[str, Tensor]:
                    state = {**buffers, **trained}
                    out: dict[str, Tensor] = torch.func.functional_call(policy, state, args, kwargs)
                    return out

                parts = ppo_loss(
                    _default_forward(policy, batch.forward_inputs, call), batch, settings
                )
                return parts.loss, parts._replace(loss=parts.loss.detach())

            grads, parts = torch.func.grad(objective, has_aux=True)(params)
            return grads, parts

        # rlcore's shape checks run once, on the traced call.
        # On fake tensors: a branch on a tensor's value fails here instead of being baked in.
        # On copies: make_fx would trace inputs that share storage as one.
        inputs, *tensors = _fields(example)
        graph = make_fx(loss_and_grads, tracing_mode="fake")(
            self._params,
            self._buffers,
            {key: value.clone() for key, value in inputs.items()},
            *(tensor.clone() for tensor in tensors),
        )
        return torch.compile(graph, dynamic=False)


def _fields(batch: Samples) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor, Tensor]:
    return batch.forward_inputs, batch.logprobs, batch.values, batch.advantages, batch.returns


def _batch_shapes(batch: Samples) -> _Shapes:
    inputs = sorted(batch.forward_inputs.items())
    return (*((key, tuple(value.shape)) for key, value in inputs), ("rows", (batch.size,)))


def _step(
    policy: BasePolicy,
    optimizer_step: OptimizerStep,
    batch: Samples,
    settings: PPOSettings,
    compiled: CompiledPPOGradients | None = None,
) -> dict[str, float]:
    if compiled is not None:
        parts = compiled.backward(batch)
        value = float(parts.loss)
    else:
        parts = ppo_loss(_default_forward(policy, batch.forward_inputs), batch, settings)
        value = _finite_loss(parts.loss)
        torch.autograd.backward(parts.loss)
    grad_norm = optimizer_step()
    metrics = {
        "loss": value,
        "pg_loss": float(parts.pg_loss),
        "value_loss": float(parts.value_loss),
        "entropy": float(parts.entropy),
        "grad_norm": grad_norm,
    }
    metrics.update({key: float(v) for key, v in parts.policy_metrics.items()})
    return metrics


def _finite_loss(loss: Tensor) -> float:
    """The loss's value; a NaN or infinite one stops the update before its backward pass."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(f"PPO update: the loss is {value}; stopping before its backward")
    return value


_PPO_OUTPUTS = ("logprobs", "entropy", "values")


def _default_forward(
    policy: BasePolicy,
    forward_inputs: dict[str, Tensor],
    call: Callable[..., dict[str, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """``default_forward``'s result, with a policy's contract breaches named.

    ``call``: the policy's ``__call__`` by default (so that module hooks, FSDP's
    gathers, run); `CompiledPPOGradients` passes a ``functional_call`` of it.
    """
    try:
        out = (policy if call is None else call)(ForwardType.DEFAULT, forward_inputs=forward_inputs)
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
