"""Embodied PPO's workers in the hybrid placement: env and rollout workers of their own.

With env, rollout and actor under three keys, e.g.
``{"actor": "0:0-1", "rollout": "0:0", "env": "0:0"}``, three groups run:
`EnvWorker`s step the envs, each its ``env.num_envs / env workers`` envs in
``rollout.pipeline_stage_num`` stages; `PipelineRolloutWorker`s hold a copy of
the policy and choose the actions; the `PipelineActor` ranks (FSDP2, as in the
collocated placement) train on what they collected. The chain of calls that
overlaps them, a window at a time, is `rlshell.runners.embodied_pipeline`'s.
At a window's end a rollout worker sends a `RolloutWindow`, an env worker an
`EnvWindow`, to every actor rank through a `rlshell.cluster.channel.Channel`
(``finish_into``: stored once, in the sender's object store, never passing
through the driver; the driver hears only the env worker's metrics), and
`window_buffer` joins them for GAE. (``finish`` hands them back to the driver
instead, the route before channels, kept for measuring the difference.)

A truncated step bootstraps from V(final observation): the env worker hands
the final observations of its truncated rows to the rollout worker with the
next observation, and the rollout worker values them with the policy that
acted (at its next ``predict`` for that stage, or in ``finish``). The actor's
ranks split the window's envs as collocated ranks do (env workers side by
side in rank order, each one's stages in order; rank r takes the r-th equal
share) and scale rewards in step order (``algorithm.norm_reward``), so a
window gives the samples a collocated rollout of the same envs and actions
gives. A policy's buffers that move on during rollout (``mlp_policy``'s
``normalize_obs`` statistics) come back to the actor from rollout worker 0's
copy with each window, so checkpoints carry them.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from contextlib import nullcontext
from typing import Literal

import torch
from attrs import evolve, frozen
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from rlcore import unchecked
from rlshell.cluster.channel import Channel
from rlshell.cluster.worker import Worker
from rlshell.config import Config
from rlshell.envs.stepper import EnvObs, EnvStepper
from rlshell.metrics import merge_rank_metrics
from rlshell.models import as_policy
from rlshell.models.base import BasePolicy
from rlshell.rollout.trajectory import RewardScaler, TrajectoryBuffer
from rlshell.workers.common import build_rollout_model, worker_device
from rlshell.workers.embodied_actor import EnvShare, PPOActor
from rlshell.workers.embodied_update import policy_name, policy_values

__all__ = [
    "Acting",
    "EnvWindow",
    "EnvWorker",
    "PipelineActor",
    "PipelineRolloutWorker",
    "RolloutWindow",
    "StageObs",
    "stage_seed",
    "window_buffer",
    "window_keys",
]


# ---------------------------------------------------------------- records


@frozen(eq=False)
class StageObs:
    """What an env worker hands the rollout worker for one stage: the observation to act
    on, and the final observations of the rows whose episode was truncated by the step
    that led to it (their value is the bootstrap of that step)."""

    obs: EnvObs
    truncated_rows: Int[Tensor, " rows"]
    final_obs: EnvObs


@frozen(eq=False)
class RolloutWindow:
    """What a rollout worker computed for one env worker's window, ``[steps, envs]``
    with the envs of stage 0 first: the policy's ``forward_inputs``, log-probs and
    values, the bootstrap V(final observation) of truncated steps (0 elsewhere), the
    truncations it saw, V of the observation after the window, and the policy's buffers."""

    env_rank: int
    forward_inputs: dict[str, Tensor]
    logprobs: Float[Tensor, "steps envs"]
    values: Float[Tensor, "steps envs"]
    bootstrap: Float[Tensor, "steps envs"]
    truncated: Bool[Tensor, "steps envs"]
    last_values: Float[Tensor, " envs"]
    buffers: dict[str, Tensor]


@frozen(eq=False)
class EnvWindow:
    """What an env worker's envs answered in one window, ``[steps, envs]`` with the
    envs of stage 0 first, and its ``env/`` and ``time/env_busy`` metrics."""

    env_rank: int
    rewards: Float[Tensor, "steps envs"]
    terminated: Bool[Tensor, "steps envs"]
    truncated: Bool[Tensor, "steps envs"]
    metrics: dict[str, float]


@frozen
class Acting:
    """What acts on the env workers' envs: the policy's name (for action errors) and how many
    env steps each of its actions covers (`BasePolicy.action_chunk`)."""

    policy: str
    chunk: int = 1


def stage_seed(config: Config, env_rank: int, stage: int) -> int:
    """The seed of one stage's envs; with one stage, env worker r's is collocated rank r's."""
    return config.runner.seed + 1000 * (env_rank * config.rollout.pipeline_stage_num + stage)


def window_keys(window: int, actor_ranks: int) -> list[tuple[int, int]]:
    """The channel keys of one window's items, one per actor rank: ``(window, rank)``."""
    return [(window, rank) for rank in range(actor_ranks)]


def _on(obs: EnvObs, device: torch.device) -> EnvObs:
    return {key: value.to(device) for key, value in obs.items()}


def _side_by_side(steps: Sequence[Sequence[Tensor]]) -> Tensor:
    """Per stage, one tensor per step → ``[steps, envs, ...]``, the stages' envs in order."""
    return torch.cat([torch.stack(list(stage)) for stage in steps], dim=1)


def _same_lengths(what: str, lengths: Sequence[int]) -> None:
    if len(set(lengths)) != 1:
        raise RuntimeError(
            f"{what}: the stages recorded different numbers of steps {list(lengths)}"
        )


# ---------------------------------------------------------------- env workers


class EnvWorker(Worker):
    """One env worker: its share of ``env.num_envs`` envs in ``pipeline_stage_num`` stages."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.steppers: list[EnvStepper] = []
        self.obs: list[EnvObs] = []
        self.acting = Acting("the policy")
        self._columns: dict[str, list[list[Tensor]]] = {}
        self._busy = 0.0

    def init_worker(self, acting: Acting | None = None) -> EnvShare:
        """Make and reset each stage's envs; ``acting`` says what acts on them (its name for
        action errors, its action chunk)."""
        config = self.config
        stages = config.rollout.pipeline_stage_num
        per_stage = config.env.num_envs // self.world_size // stages
        self.acting = acting or self.acting
        for stage in range(stages):
            seed = stage_seed(config, self.rank, stage)
            stepper = EnvStepper.from_config(evolve(config.env, num_envs=per_stage), seed)
            self.steppers.append(stepper)
            self.obs.append(stepper.reset(seed))
        self._clear()
        return EnvShare(envs=per_stage * stages, env_id=self.steppers[0].env_id)

    def observe(self, stage: int) -> StageObs:
        """The observation ``stage``'s envs are at, with no truncation to report."""
        obs = _on(self.obs[stage], torch.device("cpu"))
        return StageObs(obs=obs, truncated_rows=torch.zeros(0, dtype=torch.int64), final_obs={})

    def step(self, stage: int, actions: Tensor) -> StageObs:
        """Step ``stage``'s envs with ``actions``; what the rollout worker acts on next."""
        started = time.perf_counter()
        acting = self.acting
        result = self.steppers[stage].step(actions, policy=acting.policy, chunk=acting.chunk)
        if self.config.algorithm.bootstrap_at_done == "always":
            result = result.bootstrapped_at_done()
        cpu = torch.device("cpu")
        for key, value in (
            ("rewards", result.rewards),
            ("terminated", result.terminated),
            ("truncated", result.truncated),
        ):
            self._columns[key][stage].append(value.to(cpu))
        rows = result.truncated.nonzero().flatten()
        final = {key: value[rows] for key, value in result.next_obs.items()}
        self.obs[stage] = result.obs
        handed = StageObs(
            obs=_on(result.obs, cpu), truncated_rows=rows.to(cpu), final_obs=_on(final, cpu)
        )
        self._busy += time.perf_counter() - started
        return handed

    def finish(self) -> EnvWindow:
        """The window's rewards and flags, the episodes that ended in it; then start anew."""
        columns = self._columns
        _same_lengths(f"env worker {self.rank}", [len(steps) for steps in columns["rewards"]])
        per_stage = [stepper.pop_metrics() for stepper in self.steppers]
        window = EnvWindow(
            env_rank=self.rank,
            rewards=_side_by_side(columns["rewards"]),
            terminated=_side_by_side(columns["terminated"]),
            truncated=_side_by_side(columns["truncated"]),
            metrics=merge_rank_metrics(per_stage),
        )
        window.metrics["env/steps"] = float(window.rewards.numel() * self.acting.chunk)
        window.metrics["time/env_busy"] = self._busy
        self._clear()
        return window

    def finish_into(self, channel: Channel, keys: Sequence[Hashable]) -> dict[str, float]:
        """`finish`, the window sent to every key of ``keys`` (one per actor rank) through
        ``channel``; only its metrics come back."""
        window = self.finish()
        channel.broadcast(window, keys)
        return window.metrics

    def _clear(self) -> None:
        stages = range(len(self.steppers))
        self._columns = {
            key: [[] for _ in stages] for key in ("rewards", "terminated", "truncated")
        }
        self._busy = 0.0


# ---------------------------------------------------------------- rollout workers


class _StageRecord:
    """What a rollout worker predicted for one stage of one env worker in this window.

    ``bootstrap`` and ``truncated`` of a step are known once the observation
    that followed it arrives, so they trail the other columns by one step.
    """

    def __init__(self) -> None:
        self.forward_inputs: list[dict[str, Tensor]] = []
        self.logprobs: list[Tensor] = []
        self.values: list[Tensor] = []
        self.bootstrap: list[Tensor] = []
        self.truncated: list[Tensor] = []


class PipelineRolloutWorker(Worker):
    """A copy of the policy acting for env workers e ≡ rank (mod rollout workers).

    ``mode`` is ``predict_action_batch``'s: ``"train"`` samples, ``"eval"`` acts
    deterministically.
    """

    def __init__(self, config: Config, mode: Literal["train", "eval"] = "train") -> None:
        self.config = config
        self.mode: Literal["train", "eval"] = mode
        self.policy: BasePolicy | None = None
        self.device = torch.device("cpu")
        self._records: dict[tuple[int, int], _StageRecord] = {}
        self._busy = 0.0
        self._checked = False  # whether a predict ran with rlcore's shape checks

    def init_worker(self) -> Acting:
        """Build the policy copy (the actor's initial weights until `set_weights`); what acts,
        for the env workers."""
        config = self.config
        self.device = worker_device()
        policy = as_policy(build_rollout_model(config), config.actor.model)
        self.policy = policy.to(self.device).eval().requires_grad_(False)
        # The policy samples from torch's global generator: one stream per rollout worker.
        torch.manual_seed(config.runner.seed + 7919 * (self.rank + 1))
        return Acting(f"{policy_name(policy)}.predict_action_batch", policy.action_chunk)

    def set_weights(self, state: dict[str, Tensor], keep_buffers: bool = False) -> None:
        """Load the actor's policy (a full state dict). ``keep_buffers``: keep this worker's
        own persistent buffers (the running statistics it moves on while it acts), which
        the asynchronous runner's syncs must not rewind to the actor's, a window older."""
        policy = self._policy()
        own = _persistent_buffers(policy) if keep_buffers else {}
        policy.load_state_dict(state)
        _adopt_buffers(policy, own)

    def predict(self, env_rank: int, stage: int, observation: StageObs) -> Tensor:
        """Actions for ``stage`` of env worker ``env_rank``, recording what PPO needs."""
        started = time.perf_counter()
        policy = self._policy()
        record = self._records.setdefault((env_rank, stage), _StageRecord())
        cpu = torch.device("cpu")
        # rlcore's checks on the first step; the others repeat its shapes (rlcore.unchecked).
        with torch.no_grad(), unchecked() if self._checked else nullcontext():
            self._close_last_step(policy, record, observation)
            actions, info = policy.predict_action_batch(
                _on(observation.obs, self.device), mode=self.mode, compute_values=True
            )
            if "prev_values" not in info:
                raise ValueError(f"{policy_name(policy)} has no value head; PPO needs one")
            record.forward_inputs.append(_on(info["forward_inputs"], cpu))
            record.logprobs.append(info["prev_logprobs"].to(cpu))
            record.values.append(info["prev_values"].to(cpu))
        self._checked = True
        self._busy += time.perf_counter() - started
        return actions.to(cpu)

    def finish(self, env_rank: int, *last: StageObs) -> RolloutWindow:
        """Env worker ``env_rank``'s window, given the observation after it for each stage."""
        started = time.perf_counter()
        policy = self._policy()
        stages = self.config.rollout.pipeline_stage_num
        if len(last) != stages:
            raise ValueError(f"finish: {len(last)} observations for {stages} stages")
        records = []
        last_values = []
        cpu = torch.device("cpu")
        with torch.no_grad():
            for stage, observation in enumerate(last):
                record = self._records.pop((env_rank, stage), None)
                if record is None or not record.values:
                    raise RuntimeError(
                        f"finish: no step of env worker {env_rank}, stage {stage} in this window"
                    )
                self._close_last_step(policy, record, observation)
                last_values.append(policy_values(policy, _on(observation.obs, self.device)).to(cpu))
                records.append(record)
        _same_lengths(f"env worker {env_rank}", [len(record.values) for record in records])
        keys = records[0].forward_inputs[0]
        window = RolloutWindow(
            env_rank=env_rank,
            forward_inputs={
                key: _side_by_side([[s[key] for s in r.forward_inputs] for r in records])
                for key in keys
            },
            logprobs=_side_by_side([r.logprobs for r in records]),
            values=_side_by_side([r.values for r in records]),
            bootstrap=_side_by_side([r.bootstrap for r in records]),
            truncated=_side_by_side([r.truncated for r in records]),
            last_values=torch.cat(last_values),
            buffers=_persistent_buffers(policy),
        )
        self._busy += time.perf_counter() - started
        return window

    def finish_into(
        self, channel: Channel, keys: Sequence[Hashable], env_rank: int, *last: StageObs
    ) -> None:
        """`finish`, the window sent to every key of ``keys`` (one per actor rank) through
        ``channel``."""
        channel.broadcast(self.finish(env_rank, *last), keys)

    def pop_metrics(self) -> dict[str, float]:
        """``time/rollout_busy``: seconds in ``predict`` and ``finish`` since the last call."""
        busy, self._busy = self._busy, 0.0
        return {"time/rollout_busy": busy}

    def _policy(self) -> BasePolicy:
        if self.policy is None:
            raise RuntimeError("init_worker() has not run")
        return self.policy

    def _close_last_step(
        self, policy: BasePolicy, record: _StageRecord, observation: StageObs
    ) -> None:
        """The truncations and bootstrap of the step that led to ``observation``."""
        if len(record.bootstrap) == len(record.values):
            return  # the window's first observation: its step was closed by the last finish
        values = record.values[-1]
        bootstrap = torch.zeros_like(values)
        truncated = torch.zeros(values.shape[0], dtype=torch.bool)
        rows = observation.truncated_rows
        if rows.numel():
            truncated[rows] = True
            final = policy_values(policy, _on(observation.final_obs, self.device))
            bootstrap[rows] = final.to(bootstrap.device, bootstrap.dtype)
        record.bootstrap.append(bootstrap)
        record.truncated.append(truncated)


def _persistent_buffers(model: nn.Module) -> dict[str, Tensor]:
    """The state-dict buffers of ``model`` (running statistics a rollout moves on): copies,
    on CPU (the model's own keep moving)."""
    state = model.state_dict()
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return {
        name: t.detach().to("cpu", copy=True) for name, t in state.items() if name not in parameters
    }


# ---------------------------------------------------------------- the actor


class PipelineActor(PPOActor):
    """An FSDP2 rank of the actor that trains on windows env and rollout workers collected."""

    def init_worker(self) -> int:
        """Join the process group and build the sharded policy and its optimizer; the number
        of envs whose samples this rank trains on."""
        config = self.config
        self._setup_actor()
        share = config.env.num_envs // self.world_size
        if config.algorithm.norm_reward:
            self.reward_scaler = RewardScaler(share, config.algorithm.gamma)
        self.generator.manual_seed(config.runner.seed + 1000 * self.rank)
        return share

    def train_on(self, *windows: RolloutWindow | EnvWindow) -> dict[str, float]:
        """GAE and PPO's update on this rank's share of the window; its ``train/`` metrics.

        ``windows``: every env worker's `RolloutWindow` and `EnvWindow`, in any order.
        """
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        rollouts = sorted(
            (w for w in windows if isinstance(w, RolloutWindow)), key=lambda w: w.env_rank
        )
        envs = sorted((w for w in windows if isinstance(w, EnvWindow)), key=lambda w: w.env_rank)
        _adopt_buffers(self.manager.module, rollouts[0].buffers)
        share = self.config.env.num_envs // self.world_size
        columns = slice(self.rank * share, (self.rank + 1) * share)
        buffer = window_buffer(rollouts, envs, columns, self.reward_scaler)
        algorithm = self.config.algorithm
        return self._update(buffer.finish(algorithm.gamma, algorithm.lam))

    def train_from(
        self, channel: Channel, window: int, env_workers: int, timeout_s: float | None = None
    ) -> dict[str, float]:
        """`train_on` window number ``window``, read from ``channel`` under this rank's key
        (`window_keys`): a `RolloutWindow` and an `EnvWindow` of each of ``env_workers``.
        ``timeout_s`` bounds each read (None: as long as the window takes)."""
        key = (window, self.rank)
        return self.train_on(*(channel.get(key, timeout=timeout_s) for _ in range(2 * env_workers)))

    def policy_state(self) -> dict[str, Tensor]:
        """The policy's full state dict on rank 0 (empty on the others); collective."""
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        state = self.manager.get_model_state_dict(cpu_offload=True, full_state_dict=True)
        return state if self.rank == 0 else {}


def _adopt_buffers(model: nn.Module, buffers: dict[str, Tensor]) -> None:
    with torch.no_grad():
        for name, value in buffers.items():
            model.get_buffer(name).copy_(value)


def window_buffer(
    rollouts: Sequence[RolloutWindow],
    envs: Sequence[EnvWindow],
    columns: slice | None = None,
    reward_scaler: RewardScaler | None = None,
) -> TrajectoryBuffer:
    """Every env worker's window as one `TrajectoryBuffer` over ``columns`` of the envs.

    The envs are laid side by side in env-worker rank order, each worker's
    stages in order. Step t's ``next_values`` is V(sₜ₊₁): the bootstrap where
    the step was truncated, else the next step's value (V after the window for
    the last step). ``reward_scaler`` scales the rewards step by step.
    A rollout worker that saw truncations other than its env worker's means
    the stages were mixed up: RuntimeError.
    """
    ranks = [w.env_rank for w in rollouts]
    if ranks != list(range(len(envs))) or [w.env_rank for w in envs] != ranks:
        raise ValueError(
            f"window_buffer: rollout windows of env workers {ranks} and env windows of "
            f"{[w.env_rank for w in envs]}; expected one of each for env workers 0-{len(envs) - 1}"
        )
    for rollout, env in zip(rollouts, envs, strict=True):
        if rollout.truncated.shape != env.truncated.shape or not torch.equal(
            rollout.truncated, env.truncated
        ):
            raise RuntimeError(
                f"env worker {env.env_rank}: its rollout worker saw truncations "
                f"{tuple(rollout.truncated.shape)} that differ from the envs' "
                f"{tuple(env.truncated.shape)}: the pipeline mixed up steps or stages"
            )
    picked = slice(None) if columns is None else columns

    def joined(tensors: Sequence[Tensor]) -> Tensor:
        return torch.cat(list(tensors), dim=1)[:, picked]

    keys = rollouts[0].forward_inputs
    inputs = {key: joined([w.forward_inputs[key] for w in rollouts]) for key in keys}
    logprobs = joined([w.logprobs for w in rollouts])
    values = joined([w.values for w in rollouts])
    bootstrap = joined([w.bootstrap for w in rollouts])
    last_values = torch.cat([w.last_values for w in rollouts])[picked]
    rewards = joined([w.rewards for w in envs])
    terminated = joined([w.terminated for w in envs])
    truncated = joined([w.truncated for w in envs])
    following = torch.cat([values[1:], last_values[None]])
    next_values = torch.where(truncated, bootstrap, following)
    buffer = TrajectoryBuffer(int(values.shape[1]))
    for t in range(values.shape[0]):
        step_rewards = rewards[t]
        if reward_scaler is not None:
            step_rewards = reward_scaler(step_rewards, terminated[t] | truncated[t])
        buffer.add(
            {key: value[t] for key, value in inputs.items()},
            logprobs[t],
            values[t],
            step_rewards,
            terminated[t],
            truncated[t],
            next_values[t],
        )
    return buffer
