"""PPO's update on a rollout window of an embodied policy: epochs of shuffled minibatches.

The losses are rlcore's (the policy loss registered as ``algorithm.loss_type`` in
`rlcore.registry.POLICY_LOSSES`, PPO's clipped `rlcore.losses.ppo_policy_loss` by
default; `value_loss`, `entropy_loss`) and the advantage whitening
`rlcore.masked.masked_whiten`; this module only feeds them minibatches of
`rlshell.rollout.trajectory.Samples` through the policy's `default_forward`, and
steps the optimizer:

    L = L_π + c_v · L_V − c_H · H,   per minibatch, gradient norm clipped

as in PPO (Schulman et al. 2017) and its common implementations (CleanRL,
Stable-Baselines3): advantages standardised per minibatch, value loss
optionally clipped around the old values. Each sample is a row of one step
for the policy loss (its ``[batch, time]`` with time 1), as the reasoning
runner's losses see tokens.

A policy that breaks its contract is named in the error: actions of the
wrong shape for the env (`EnvStepper.step` names the policy class, the env
and both shapes), ``forward_inputs`` without a key ``default_forward`` reads
(a `MissingInputError` naming the class and the key), or a
``default_forward`` result without ``logprobs``, ``entropy`` or ``values``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from attrs import field, frozen
from torch import Tensor
from torch.distributed.fsdp import FSDPModule

from rlcore.losses import PolicyLossBatch, PolicyLossConfig, entropy_loss, value_loss
from rlcore.masked import masked_whiten
from rlcore.registry import POLICY_LOSSES
from rlshell.config import Config
from rlshell.envs.stepper import EnvObs, EnvRestarted, EnvStepper
from rlshell.hyperparameters import LOSS_KEYS, read_for
from rlshell.models.base import ActionInfo, BasePolicy, ForwardType, MissingInputError
from rlshell.models.compiled import inductor_compile
from rlshell.rollout.trajectory import RewardScaler, Samples, TrajectoryBuffer

__all__ = [
    "CompiledPPOStep",
    "EagerPPOStep",
    "NonFiniteUpdateError",
    "OptimizerStep",
    "PPOLoss",
    "PPOSettings",
    "Predict",
    "UpdateStep",
    "collect_rollout",
    "policy_name",
    "policy_values",
    "ppo_loss",
    "ppo_update",
    "torch_optimizer_step",
]

OptimizerStep = Callable[[], tuple[float, float]]
"""Clip, step and clear the gradients; return (their norm before clipping, the learning rate
of the step). The actor wraps its training backend's ``optimizer_step``; `torch_optimizer_step`
makes one for a torch optimizer."""

Predict = Callable[[EnvObs], tuple[Tensor, ActionInfo]]
"""The rollout's call per env step: the policy's ``predict_action_batch`` in ``"train"``
mode, or a `rlshell.models.compiled.CompiledPredict` of it (``rollout.compile``)."""


def _positive(instance: object, attribute: object, value: float) -> None:
    if not value > 0:
        raise ValueError(
            f"{getattr(attribute, 'name', '?')}: expected a positive number, got {value}"
        )


def _positive_or_none(instance: object, attribute: object, value: float | None) -> None:
    if value is not None:
        _positive(instance, attribute, value)


# The policy loss's hyperparameters the embodied update reads (behavior_weight_cap belongs to
# decoupled PPO, whose proximal policy the embodied runners do not keep).
_EMBODIED_LOSS_KEYS = {
    key: field for key, field in LOSS_KEYS.items() if field != "behavior_weight_cap"
}


@frozen
class PPOSettings:
    """PPO's update hyperparameters (the names CleanRL uses) and the policy loss.

    ``loss_type``: the `rlcore.registry.POLICY_LOSSES` entry; ``clip_coef`` (ε_low),
    ``clip_high`` and ``dual_clip`` reach it as `rlcore.losses.PolicyLossConfig` fields,
    None leaving the loss's own default (ε = 0.2 for PPO's).
    """

    ppo_epochs: int = field(default=10, validator=_positive)
    num_minibatches: int = field(default=4, validator=_positive)
    clip_coef: float | None = field(default=None, validator=_positive_or_none)
    clip_vloss: float | None = None
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float | None = 0.5
    norm_adv: bool = True
    target_kl: float | None = None
    loss_type: str = "ppo"
    clip_high: float | None = None
    dual_clip: float | None = None

    @classmethod
    def of(cls, config: Config, critic: bool) -> PPOSettings:
        """From ``algorithm.*`` and ``actor.optim.clip_grad``; without a ``critic`` (embodied
        GRPO) the value loss weighs nothing. Of the clip settings, those the policy loss
        reads (`rlcore.registry.Registry.reads`)."""
        algorithm = config.algorithm
        loss = read_for(POLICY_LOSSES, algorithm.loss_type, config, _EMBODIED_LOSS_KEYS)
        return cls(
            ppo_epochs=algorithm.ppo_epochs,
            num_minibatches=algorithm.num_minibatches,
            clip_coef=loss.get("clip_low"),
            loss_type=algorithm.loss_type,
            clip_high=loss.get("clip_high"),
            dual_clip=loss.get("dual_clip"),
            clip_vloss=algorithm.value_clip if critic else None,
            vf_coef=algorithm.vf_coef if critic else 0.0,
            ent_coef=algorithm.entropy_coef,
            max_grad_norm=config.actor.optim.clip_grad,
            norm_adv=algorithm.norm_adv,
            target_kl=algorithm.target_kl,
        )

    @property
    def steps_per_window(self) -> int:
        """Optimizer steps on one window: ``ppo_epochs × num_minibatches``."""
        return self.ppo_epochs * self.num_minibatches


# One rollout step as collect_rollout keeps it until the window's last value is known:
# forward inputs, log-probs, values, rewards, terminated, truncated, bootstrap values.
_Pending = tuple[dict[str, Tensor], Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


def collect_rollout(
    policy: BasePolicy,
    stepper: EnvStepper,
    buffer: TrajectoryBuffer,
    obs: EnvObs,
    steps: int,
    reward_scaler: RewardScaler | None = None,
    predict: Predict | None = None,
    bootstrap_at_done: bool = False,
) -> EnvObs:
    """``steps`` steps of every env into ``buffer``; returns the observation to continue from.

    With a ``reward_scaler`` the buffer gets scaled rewards (``algorithm.norm_reward``);
    the env's metrics keep the raw ones. ``predict`` acts in place of
    ``policy.predict_action_batch(obs, mode="train", compute_values=True)`` (a compiled
    call of it); the value bootstraps below call the policy itself.

    The value bootstrap of step t is V(sₜ₊₁): the next step's value where the
    episode goes on, the final observation's where it was truncated (one
    extra value call on those rows), nothing where it terminated (gae ignores
    it), and for the window's last step the value of what follows it. With
    ``bootstrap_at_done`` a terminated step bootstraps like a truncated one
    (`StepResult.bootstrapped_at_done`).

    A step the envs failed (`EnvRestarted`, ``env.on_failure='reset'``) is
    dropped and taken again from the new episodes' first observation, so the
    window still has ``steps`` steps: the step recorded before it becomes a
    truncation bootstrapping from V(the observation the failed step acted on)
    in every env whose episode was in progress.
    """
    pending: list[_Pending] = []
    name = f"{policy_name(policy)}.predict_action_batch"
    if predict is None:
        predict = functools.partial(policy.predict_action_batch, mode="train", compute_values=True)
    while len(pending) < steps:
        actions, info = predict(obs)
        try:
            result = stepper.step(actions, policy=name, chunk=policy.action_chunk)
        except EnvRestarted as restart:
            if pending:
                pending[-1] = _truncated_at(pending[-1], policy_values(policy, obs))
            if reward_scaler is not None:
                reward_scaler.end_returns()
            obs = restart.obs
            continue
        if bootstrap_at_done:
            result = result.bootstrapped_at_done()
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


def _truncated_at(step: _Pending, values: Tensor) -> _Pending:
    """``step`` (inputs, logprobs, values, rewards, terminated, truncated, bootstrap) with
    every episode still running after it truncated there, bootstrapping from ``values``."""
    inputs, logprobs, old_values, rewards, terminated, truncated, bootstrap = step
    running = ~(terminated | truncated)
    return (
        inputs,
        logprobs,
        old_values,
        rewards,
        terminated,
        truncated | running,
        torch.where(running, values.to(bootstrap.dtype), bootstrap),
    )


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
    step: UpdateStep | torch.optim.Optimizer,
    samples: Samples,
    settings: PPOSettings,
    generator: torch.Generator,
) -> dict[str, float]:
    """``ppo_epochs`` passes of ``num_minibatches`` steps each; the last pass's mean metrics.

    With ``settings.target_kl`` the update stops after the first minibatch
    whose approximate KL from the rollout policy (measured before its step)
    exceeds it, as CleanRL's and ManiSkill's PPO do; the metrics are then the
    stopped pass's so far, and ``train/optimizer_steps`` counts the steps taken.
    ``step`` runs one minibatch (an `UpdateStep`: `EagerPPOStep`, or the
    compiled `CompiledPPOStep`); a torch optimizer is taken as the eager step
    over it, its gradients clipped to ``settings.max_grad_norm`` first. A
    non-finite loss or gradient norm stops the update (`NonFiniteUpdateError`, a
    FloatingPointError that holds the minibatch) with the weights as the previous step
    left them.
    """
    if isinstance(step, torch.optim.Optimizer):  # a custom loop's optimizer, as it comes
        step = EagerPPOStep(policy, settings, torch_optimizer_step(policy, step, settings))
    step.prepare(policy)
    totals: dict[str, float] = {}
    steps = taken = 0
    stopped = False
    for _ in range(settings.ppo_epochs):
        totals, steps = {}, 0
        for minibatch in samples.minibatches(settings.num_minibatches, generator):
            try:
                parts, grad_norm = step(minibatch)
            except FloatingPointError as error:
                raise NonFiniteUpdateError(str(error), minibatch) from error
            taken += 1
            steps += 1
            report = _report(parts, grad_norm)
            for key, value in report.items():
                totals[key] = totals.get(key, 0.0) + value
            if settings.target_kl is not None and _approx_kl(report, settings) > settings.target_kl:
                stopped = True
                break
        if stopped:
            break
    metrics = {f"train/{key}": value / steps for key, value in totals.items()}
    if settings.target_kl is not None:
        metrics["train/optimizer_steps"] = float(taken)
    return metrics


def _approx_kl(report: dict[str, float], settings: PPOSettings) -> float:
    """The minibatch's approximate KL as its policy loss reports it (``target_kl`` reads it)."""
    if "approx_kl" not in report:
        raise ValueError(
            f"algorithm.target_kl stops the update on the policy loss's approx_kl metric; "
            f"'{settings.loss_type}' (algorithm.loss_type) reports none (its metrics: "
            f"{sorted(report)}). Report approx_kl from the loss or leave target_kl unset"
        )
    return report["approx_kl"]


class NonFiniteUpdateError(FloatingPointError):
    """PPO's loss or gradient norm on a minibatch was NaN or infinite; ``minibatch`` is that
    minibatch."""

    def __init__(self, message: str, minibatch: Samples) -> None:
        super().__init__(message)
        self.minibatch = minibatch

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (to the driver) with its minibatch
        return (type(self), (str(self), self.minibatch))


def torch_optimizer_step(
    policy: BasePolicy, optimizer: torch.optim.Optimizer, settings: PPOSettings
) -> OptimizerStep:
    """`OptimizerStep` of a torch optimizer: clip to ``settings.max_grad_norm``, step, clear."""

    def step() -> tuple[float, float]:
        grad_norm = _clip(policy, settings.max_grad_norm)
        if math.isfinite(grad_norm):  # a NaN or infinite gradient is not applied
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, float(optimizer.param_groups[0]["lr"])

    return step


class PPOLoss(NamedTuple):
    """One minibatch's PPO objective and its parts (0-d tensors; ``loss`` keeps its graph)."""

    loss: Tensor
    pg_loss: Tensor
    value_loss: Tensor
    entropy: Tensor
    policy_metrics: dict[str, Tensor]


def ppo_loss(out: dict[str, Tensor], batch: Samples, settings: PPOSettings) -> PPOLoss:
    """L = L_π + c_v · L_V − c_H · H on one minibatch from rlcore's losses, given
    ``default_forward``'s outputs ``out`` on ``batch.forward_inputs``; L_π is the policy
    loss registered as ``settings.loss_type``."""
    logprobs, entropy, values = out["logprobs"], out["entropy"], out["values"]
    # rlcore's losses read [batch, time]: each sample is a row of one step.
    mask = torch.ones_like(logprobs, dtype=torch.bool)[:, None]
    advantages = batch.advantages[:, None]
    if settings.norm_adv and batch.size > 1:
        advantages = masked_whiten(advantages, mask)
    policy_loss = POLICY_LOSSES.get(settings.loss_type)(
        PolicyLossBatch(logprobs[:, None], batch.logprobs[:, None], advantages, mask),
        PolicyLossConfig(
            clip_low=settings.clip_coef,
            clip_high=settings.clip_high,
            dual_clip=settings.dual_clip,
            agg="token-mean",
        ),
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


class UpdateStep(Protocol):
    """PPO's step on one minibatch: forward, losses, backward, gradient clip, optimizer step.

    `ppo_update` drives it, a window at a time:

        step.prepare(policy)                      # once per window
        for minibatch in window.minibatches(...):
            parts, grad_norm = step(minibatch)

    Two implementations, chosen once when the actor is built (``actor.compile``):
    `EagerPPOStep` and `CompiledPPOStep`. ``lr``: the learning rate of the last step.
    """

    @property
    def lr(self) -> float: ...

    def prepare(self, policy: BasePolicy) -> None:
        """Before a window's first minibatch (a checkpoint load may have replaced tensors)."""
        ...

    def __call__(self, batch: Samples) -> tuple[PPOLoss, float]:
        """One step on ``batch``: its `PPOLoss` (detached) and the gradient norm before
        clipping."""
        ...


class EagerPPOStep:
    """PPO's minibatch step in eager torch: `ppo_loss` on ``default_forward``, backward, then
    ``optimizer_step`` (clip, step, clear)."""

    def __init__(
        self, policy: BasePolicy, settings: PPOSettings, optimizer_step: OptimizerStep
    ) -> None:
        self.policy = policy
        self.settings = settings
        self.optimizer_step = optimizer_step
        self.lr = float("nan")

    def prepare(self, policy: BasePolicy) -> None:
        self.policy = policy

    def __call__(self, batch: Samples) -> tuple[PPOLoss, float]:
        parts = ppo_loss(_default_forward(self.policy, batch.forward_inputs), batch, self.settings)
        _finite_loss(parts.loss)
        torch.autograd.backward(parts.loss)
        grad_norm, self.lr = self.optimizer_step()
        _finite_gradient(grad_norm)
        return parts._replace(loss=parts.loss.detach()), grad_norm


_Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # a minibatch's shapes, input by input


class CompiledPPOStep:
    """PPO's whole minibatch step as one compiled call (``actor.compile``).

    The policy's ``default_forward``, rlcore's losses (`ppo_loss`), their
    backward pass, the gradient-norm clip (`torch.nn.utils.get_total_norm` and
    `torch.nn.utils.clip_grad_norm_`'s coefficient ``min(1, max_norm / (norm +
    1e-6))``) and ``optimizer``'s AdamW update (torch's functional
    `torch.optim.adamw.adamw`, its tensor-step branch, with the learning rate
    an input so a schedule needs no recompile) are traced once (``make_fx`` on
    fake tensors, ``torch.func.grad``) into one graph over flat tensors, which
    inductor compiles (`rlshell.models.compiled.inductor_compile`: no dynamo
    frame, C++ wrapper, tanh as 2 / (1 + e^(−2x)) − 1): one call and a few fused kernels
    instead of a few hundred eager ops, a ``.grad`` per parameter and the
    optimizer's Python loop. Parameters and AdamW's state
    (``step``, ``exp_avg``, ``exp_avg_sq``: ``optimizer.state``, so
    checkpoints save them as usual) are updated in place.

    As `rlshell.engines.training.fsdp.FSDPModelManager.optimizer_step` does: a non-finite
    gradient norm or loss leaves the weights and moments as they were (the step
    is skipped inside the graph), then FloatingPointError is raised, as the eager
    step does. ``lr_scheduler`` (if given) steps after each update.

    The same maths as the eager step, not the same bits: inductor's fused
    kernels round differently (~1e-7 relative; its tanh is within 1.8e-7 of
    ``torch.tanh``, absolute), so a seeded run drifts from
    the eager one after some windows, as any float change would make it. A
    trained parameter that the loss does not reach gets a zero gradient (eager
    AdamW skips a parameter without ``.grad``). A policy's
    ``default_forward`` must not branch on tensor values nor draw random
    numbers (tracing fails on the first; the second would be inductor's
    generator, not torch's). Compiled per minibatch shape; `warm_up` compiles
    for one on a dummy batch without touching weights, optimizer state or RNG
    streams.
    """

    def __init__(
        self,
        policy: BasePolicy,
        optimizer: torch.optim.Optimizer,
        settings: PPOSettings,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.policy = policy
        self.optimizer = optimizer
        self.settings = settings
        self.lr_scheduler = lr_scheduler
        self.group = _adamw_group(optimizer)
        # AdamW's constants, traced into the graph as they are now.
        self.hyperparameters = _adamw_constants(self.group)
        self.lr = float(self.group["lr"])  # the learning rate of the last step
        self._scheduler_stepped = False  # its first step may warn; later ones do not
        self.names: list[str] = []  # trained parameters, in the graph's order
        self._static: list[Tensor] = []  # params, moments, steps, lr, buffers: the graph's head
        self._lr = torch.zeros((), dtype=torch.float32)
        self._buffer_names: list[str] = []
        self.prepare(policy)
        # One compiled graph per minibatch shape (a window may split into two sizes).
        self._compiled: dict[_Shapes, tuple[Callable[..., list[Tensor]], list[str]]] = {}

    def prepare(self, policy: BasePolicy) -> None:
        """Read ``policy``'s parameters and buffers and the optimizer's state (`ppo_update`
        does, once per window: a checkpoint load may have replaced them). AdamW's state of
        a parameter not yet stepped is created as ``torch.optim.AdamW`` keeps it."""
        if policy is not self.policy:
            raise ValueError(
                f"CompiledPPOStep was built for a {policy_name(self.policy)} at "
                f"{id(self.policy):#x}, not this {policy_name(policy)}: build one per policy"
            )
        # optimizer.load_state_dict (a resume) puts new param group dicts in place, which the
        # schedule then steps; its constants must still be the ones the graph holds.
        self.group = _adamw_group(self.optimizer)
        constants = _adamw_constants(self.group)
        if constants != self.hyperparameters:
            raise ValueError(
                f"actor.compile: the optimizer's AdamW constants are now {constants}, the "
                f"compiled step holds {self.hyperparameters} (a checkpoint saved with other "
                "optimizer settings?); build a new CompiledPPOStep"
            )
        named = {id(p): name for name, p in policy.named_parameters()}
        trained = [p for p in self.group["params"] if p.requires_grad]
        strangers = [p for p in trained if id(p) not in named]
        if strangers:
            raise ValueError(
                f"actor.compile: the optimizer steps {len(strangers)} parameter(s) that are "
                f"not {policy_name(policy)}'s"
            )
        if not trained:
            raise ValueError(f"actor.compile: {policy_name(policy)} has no trained parameter")
        states = [self._state(p) for p in trained]
        self.names = [named[id(p)] for p in trained]
        buffers = sorted(policy.named_buffers())
        self._buffer_names = [name for name, _ in buffers]
        self._lr = torch.zeros((), dtype=torch.float32, device=trained[0].device)
        self._static = [
            *(p.detach() for p in trained),  # views of the same storage, stepped in place
            *(state["exp_avg"] for state in states),
            *(state["exp_avg_sq"] for state in states),
            *(state["step"] for state in states),
            self._lr,
            *(buffer for _, buffer in buffers),
        ]

    def _state(self, param: Tensor) -> dict[str, Tensor]:
        state: dict[str, Tensor] = self.optimizer.state[param]
        if not state:  # AdamW creates it on a parameter's first step; its layout
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    def __call__(self, batch: Samples) -> tuple[PPOLoss, float]:
        """One PPO step on ``batch``: weights and AdamW's state updated in place; the
        minibatch's `PPOLoss` (detached) and the gradient norm before clipping."""
        compiled, metric_keys = self._graph(batch)
        self.lr = float(self.group["lr"])
        self._lr.fill_(self.lr)
        out = compiled(*self._static, *_flat_batch(batch))
        loss, pg_loss, critic, entropy, grad_norm, *metrics = out
        policy_metrics = dict(zip(metric_keys, metrics, strict=True))
        parts = PPOLoss(loss, pg_loss, critic, entropy, policy_metrics)
        _finite_loss(loss)  # the graph skipped the update; say why
        if self.lr_scheduler is not None:
            if self._scheduler_stepped:
                self.lr_scheduler.step()
            else:
                with warnings.catch_warnings():
                    # Its first step warns when optimizer.step() never ran: this is the graph's.
                    warnings.filterwarnings("ignore", "Detected call of `lr_scheduler", UserWarning)
                    self.lr_scheduler.step()
                self._scheduler_stepped = True
        _finite_gradient(float(grad_norm))  # the graph skipped the update; say why
        return parts, float(grad_norm)

    @property
    def compiled_rows(self) -> list[int]:
        """The minibatch sizes compiled so far."""
        return sorted(dict(shapes)["rows"][0] for shapes in self._compiled)

    def warm_up(self, example: Samples) -> None:
        """Compile for ``example``'s shapes now (e.g. at worker start-up), changing nothing:
        the compiled step runs once on copies of the weights and optimizer state."""
        compiled, _ = self._graph(example)
        rng = torch.get_rng_state()
        compiled(*(t.clone() for t in self._static), *_flat_batch(example))
        torch.set_rng_state(rng)

    def _graph(self, batch: Samples) -> tuple[Callable[..., list[Tensor]], list[str]]:
        shapes = _batch_shapes(batch)
        entry = self._compiled.get(shapes)
        if entry is None:
            entry = self._compiled[shapes] = self._compile(batch)
        return entry

    def _compile(self, example: Samples) -> tuple[Callable[..., list[Tensor]], list[str]]:
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.optim.adamw import adamw

        policy, settings, constants = self.policy, self.settings, self.hyperparameters
        names, buffer_names = list(self.names), list(self._buffer_names)
        keys = sorted(example.forward_inputs)
        n = len(names)
        metric_keys: list[str] = []

        def step(*tensors: Tensor) -> list[Tensor]:
            params = list(tensors[:n])
            exp_avgs, exp_avg_sqs = list(tensors[n : 2 * n]), list(tensors[2 * n : 3 * n])
            steps, lr = list(tensors[3 * n : 4 * n]), tensors[4 * n]
            rest = tensors[4 * n + 1 :]
            buffers = dict(zip(buffer_names, rest[: len(buffer_names)], strict=True))
            rest = rest[len(buffer_names) :]
            batch = Samples(dict(zip(keys, rest[: len(keys)], strict=True)), *rest[len(keys) :])

            def objective(trained: list[Tensor]) -> tuple[Tensor, PPOLoss]:
                def call(*args: object, **kwargs: object) -> dict[str, Tensor]:
                    state = {**buffers, **dict(zip(names, trained, strict=True))}
                    out: dict[str, Tensor] = torch.func.functional_call(policy, state, args, kwargs)
                    return out

                parts = ppo_loss(
                    _default_forward(policy, batch.forward_inputs, call), batch, settings
                )
                return parts.loss, parts._replace(loss=parts.loss.detach())

            grads, parts = torch.func.grad(objective, has_aux=True)(params)
            grad_norm = torch.nn.utils.get_total_norm(grads)
            if settings.max_grad_norm is not None:
                # clip_grad_norm_'s coefficient, on gradients that are not any .grad
                coef = torch.clamp(settings.max_grad_norm / (grad_norm + 1e-6), max=1.0)
                grads = [grad * coef for grad in grads]
            updated = [*params, *exp_avgs, *exp_avg_sqs, *steps]
            before = [tensor.clone() for tensor in updated]
            adamw(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                # The branch whose step counts and learning rate stay tensors (no .item()).
                foreach=False,
                fused=False,
                differentiable=True,
                amsgrad=False,
                beta1=constants["beta1"],
                beta2=constants["beta2"],
                lr=lr,
                weight_decay=constants["weight_decay"],
                eps=constants["eps"],
                maximize=False,
            )
            finite = torch.isfinite(parts.loss) & torch.isfinite(grad_norm)
            for tensor, old in zip(updated, before, strict=True):
                tensor.copy_(torch.where(finite, tensor, old))
            metric_keys[:] = list(parts.policy_metrics)
            return [
                parts.loss,
                parts.pg_loss,
                parts.value_loss,
                parts.entropy,
                grad_norm,
                *parts.policy_metrics.values(),
            ]

        # rlcore's shape checks run once, on the traced call.
        # On fake tensors: a branch on a tensor's value fails here instead of being baked in.
        # On copies: make_fx would trace inputs that share storage as one.
        inputs: list[Any] = [t.clone() for t in (*self._static, *_flat_batch(example))]
        graph = make_fx(step, tracing_mode="fake")(*inputs)
        compiled = inductor_compile(graph, inputs)
        return compiled, metric_keys


def _adamw_group(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's one param group, checked to be AdamW's that the compiled step runs."""
    problems = []
    if not isinstance(optimizer, torch.optim.AdamW):
        problems.append(f"runs torch.optim.AdamW's update; got a {type(optimizer).__name__}")
    if len(optimizer.param_groups) != 1:
        problems.append(f"needs one param group; got {len(optimizer.param_groups)}")
    group = optimizer.param_groups[0]
    for flag in ("amsgrad", "maximize"):
        if group.get(flag):
            problems.append(f"does not run AdamW with {flag}=True")
    if problems:
        raise ValueError(f"actor.compile: the compiled PPO step {'; '.join(problems)}")
    return group


def _adamw_constants(group: dict[str, Any]) -> dict[str, float]:
    """The param group's AdamW constants that the compiled step holds."""
    beta1, beta2 = group["betas"]
    return {
        "beta1": float(beta1),
        "beta2": float(beta2),
        "eps": float(group["eps"]),
        "weight_decay": float(group["weight_decay"]),
    }


def _flat_batch(batch: Samples) -> list[Tensor]:
    """A minibatch as the compiled step takes it: forward_inputs by sorted key, then the rest."""
    inputs = batch.forward_inputs
    return [
        *(inputs[key] for key in sorted(inputs)),
        batch.logprobs,
        batch.values,
        batch.advantages,
        batch.returns,
    ]


def _batch_shapes(batch: Samples) -> _Shapes:
    inputs = sorted(batch.forward_inputs.items())
    return (*((key, tuple(value.shape)) for key, value in inputs), ("rows", (batch.size,)))


def _report(parts: PPOLoss, grad_norm: float) -> dict[str, float]:
    """One minibatch step's metrics (`ppo_update` reports the last epoch's)."""
    metrics = {
        "loss": float(parts.loss),
        "pg_loss": float(parts.pg_loss),
        "value_loss": float(parts.value_loss),
        "entropy": float(parts.entropy),
        "grad_norm": grad_norm,
    }
    metrics.update({key: float(v) for key, v in parts.policy_metrics.items()})
    return metrics


def _finite_loss(loss: Tensor) -> float:
    """The loss's value; a NaN or infinite one stops the update before the weights change."""
    value = float(loss.detach())
    if not math.isfinite(value):
        raise FloatingPointError(
            f"PPO update: the loss is {value}; stopping before the weights change"
        )
    return value


def _finite_gradient(grad_norm: float) -> None:
    """A NaN or infinite gradient norm (the step skipped, the weights as they were) stops
    the update."""
    if not math.isfinite(grad_norm):
        raise FloatingPointError(
            f"PPO update: the gradient norm is {grad_norm}; the step was skipped and the "
            "update stops"
        )


_PPO_OUTPUTS = ("logprobs", "entropy", "values")


def _default_forward(
    policy: BasePolicy,
    forward_inputs: dict[str, Tensor],
    call: Callable[..., dict[str, Tensor]] | None = None,
) -> dict[str, Tensor]:
    """``default_forward``'s result, with a policy's contract breaches named.

    ``call``: the policy's ``__call__`` by default (so that module hooks, FSDP's
    gathers, run); `CompiledPPOStep` passes a ``functional_call`` of it.
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
