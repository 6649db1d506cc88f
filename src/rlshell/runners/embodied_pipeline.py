"""Embodied PPO in the hybrid placement: env, rollout and actor workers of their own, pipelined.

With env, rollout and actor under three keys, e.g.
``{"actor": "0:0-1", "rollout": "0:0", "env": "0:0"}``, the trainer starts
three groups (`rlshell.workers.embodied_pipeline`): `EnvWorker`s step the
envs, `PipelineRolloutWorker`s act, `PipelineActor` ranks train. Each env
worker splits its envs into ``rollout.pipeline_stage_num`` stages, and the
driver submits a window's whole chain of calls at once, each call's result
handed to the next as a Ray ObjectRef (`rlshell.cluster.worker.GroupCall.refs`),
never waited for:

    for t in range(runner.rollout_steps):
        for s in range(stages):
            actions[s] = rollout.predict(env, s, obs[s])
            obs[s] = env.step(s, actions[s])

A worker runs its calls in the order they were submitted, each once its
inputs exist, so while the rollout worker computes stage s + 1's actions the
env worker steps stage s. Env worker e is served by rollout worker
e mod (rollout workers). At the window's end the windows go from the env and
rollout workers to every actor rank through a `rlshell.cluster.channel.Channel`,
under the keys ``(window, actor rank)``; the driver submits the calls and hears
only metrics:

    rollout.finish_into(channel, keys, e, obs[0], …)  → RolloutWindow: forward_inputs,
                                                        log-probs, values, bootstraps
    env.finish_into(channel, keys)    → EnvWindow: rewards, terminated, truncated
                                        (env/ metrics to the driver)
    actor.train_from(channel, window) → GAE (rlcore, `TrajectoryBuffer.finish`), PPO's update
    rollout.set_weights(actor.policy_state())

``PipelinedPPOTrainer.transport = "driver"`` routes the windows as before
channels: each worker's window a call result, handed to the actor's call as an
ObjectRef by the driver (Ray inlines results under 100 KiB into the driver's
process and out again); benchmarks/driver_share.py measures both.

Timing: ``time/rollout_busy`` and ``time/env_busy`` are the seconds the
busiest rollout and env worker computed in the window; set against
``time/rollout`` they show the overlap.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from attrs import frozen

from rlshell.cluster.channel import Channel
from rlshell.cluster.errors import WorkerDiedError, WorkerError
from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.metrics import merge_rank_metrics
from rlshell.runners.async_rollout import StalenessError
from rlshell.runners.embodied import EmbodiedTrainer
from rlshell.runners.rules.embodied import PipelinedPPORules
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import launched_together
from rlshell.workers.embodied_pipeline import (
    EnvWindow,
    EnvWorker,
    PipelineActor,
    PipelineRolloutWorker,
    window_keys,
)

__all__ = ["Pipeline", "PipelinedPPOTrainer", "SubmittedWindow"]


class PipelinedPPOTrainer(PipelinedPPORules, EmbodiedTrainer):
    """Env, rollout and actor groups of their own; a window's calls chained, then the update."""

    # How the windows reach the actor: through the channel, or through the driver (the
    # route before channels, kept to measure the difference: benchmarks/driver_share.py).
    transport: ClassVar[Literal["channel", "driver"]] = "channel"

    def __init__(
        self,
        config: Config,
        envs: WorkerGroup[EnvWorker],
        rollout: WorkerGroup[PipelineRolloutWorker],
        actor: WorkerGroup[PipelineActor],
        stack: ExitStack,
        channel: Channel,
    ) -> None:
        super().__init__(config, actor, stack)
        self.envs = envs
        self.rollout = rollout
        self.actor = actor
        self.channel = channel
        self.pipeline: Pipeline | None = None  # made at the first step, after any resume
        # runner.mode='async': windows submitted ahead (step, the version sampling it, calls).
        self.windows: deque[tuple[int, int, SubmittedWindow]] = deque()
        self.version = 0
        self.submitted_through = 0

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        config = spec.config
        timeout = config.cluster.call_timeout_s
        stages = config.rollout.pipeline_stage_num
        stack = ExitStack()
        try:
            started = time.perf_counter()
            envs, rollout, actor = launched_together(
                stack,
                cluster,
                timeout,
                (EnvWorker.create_group(config), plan.component("env")),
                (PipelineRolloutWorker.create_group(config), plan.component("rollout")),
                (PipelineActor.create_group(config, spec.critic), plan.component("actor")),
            )
            actor_up = actor.init_worker()
            policy = rollout.init_worker().wait()[0]
            shares = envs.init_worker(policy).wait()
            actor_up.wait()
            # A window's items under one key: a rollout and an env window per env worker.
            channel = Channel.create("embodied-windows", maxsize=2 * envs.world_size)
            # Closed before the groups shut down (a stack runs its callbacks last first).
            stack.callback(channel.close, "the run ended", kill=True)
        except BaseException:
            stack.close()
            raise
        print(
            f"workers up in {time.perf_counter() - started:.1f} s ({len(shares)} env workers × "
            f"{shares[0].envs} {shares[0].env_id} envs in {stages} stages, "
            f"{rollout.world_size} rollout workers, {actor.world_size} actor ranks; pipelined)",
            flush=True,
        )
        return cls(config, envs, rollout, actor, stack, channel)

    def step(self, step: int) -> dict[str, float]:
        """One window and its update. ``runner.mode='async'``: the windows of the next
        ``algorithm.max_staleness`` steps are submitted before this step's update and its
        weight sync, so the env and rollout workers step them while the actor trains; each
        is sampled by weights at most that many updates behind those it trains."""
        config = self.config
        ahead = config.algorithm.max_staleness if config.runner.mode == "async" else 0
        if self.pipeline is None:  # the first step of this process: the actor's weights first
            for call in _sync_weights(self.actor, self.rollout):
                call.wait()
            self.pipeline = Pipeline(
                self.envs,
                self.rollout,
                config.runner.rollout_steps,
                config.rollout.pipeline_stage_num,
                (self.channel, self.actor.world_size) if self.transport == "channel" else None,
            )
            self.version = step - 1  # updates the weights have had (a resume's step)
            self.submitted_through = step - 1
        step_started = time.perf_counter()
        # A worker runs its calls in submission order: a window submitted now is sampled by
        # the weights of the last sync submitted before it, self.version.
        while self.submitted_through < step + ahead:
            self.submitted_through += 1
            self.windows.append((self.submitted_through, self.version, self.pipeline.submit()))
        planned, sampled_by, window = self.windows.popleft()
        if planned != step:
            raise RuntimeError(f"step {step} took the window submitted for step {planned}")
        lag = self.version - sampled_by
        if not 0 <= lag <= ahead:
            raise StalenessError(
                f"step {step}'s window was sampled by version {sampled_by} and trains version "
                f"{self.version}: {lag} versions behind, algorithm.max_staleness is {ahead}"
            )
        if self.transport == "channel":
            train = self.actor.train_from(
                self.channel, window.number, self.envs.world_size, config.cluster.call_timeout_s
            )
        else:
            parts = [call.refs[0] for call in window.rollout_windows]
            train = self.actor.train_on(*parts, *window.env_windows.refs)
        # Async: the rollout workers have moved their running statistics (normalize_obs) on
        # through the windows ahead; the sync, applied after those, keeps them.
        synced = _sync_weights(self.actor, self.rollout, keep_buffers=ahead > 0)
        self.version = step
        window.calls.extend([train, *synced])
        collected = window.wait(window.env_windows)
        busy = window.wait(window.rollout_metrics)
        rollout_done = time.perf_counter()
        train_metrics = window.wait(train)
        update_done = time.perf_counter()
        for call in synced:  # async: behind the next window's calls on the rollout workers
            window.wait(call)
        env_metrics = [w.metrics if isinstance(w, EnvWindow) else w for w in collected]
        metrics = merge_rank_metrics(env_metrics + busy)
        metrics.update(merge_rank_metrics(train_metrics))
        metrics["time/rollout"] = rollout_done - step_started
        metrics["time/update"] = update_done - rollout_done
        if config.runner.mode == "async":
            metrics["async/staleness_max"] = float(lag)
            metrics["async/queue_length"] = float(len(self.windows) + 1)
            metrics["async/wait_s"] = rollout_done - step_started
            metrics["time/sync"] = time.perf_counter() - update_done
        return self.counted(metrics, step_started)


@frozen(eq=False)
class SubmittedWindow:
    """The calls of one window, in submission order, and the ones the driver reads.

    ``number``: the window's, from 0 (its items' channel keys, `window_keys`).
    ``env_windows``: each env worker's `EnvWindow` (through the driver), or its
    metrics (through a channel); ``rollout_windows``: each env worker's
    `RolloutWindow`, or None.
    """

    number: int
    calls: list[GroupCall]
    rollout_windows: list[GroupCall]
    env_windows: GroupCall
    rollout_metrics: GroupCall

    def wait(self, call: GroupCall) -> list[Any]:
        """``call.wait()``; a failure is reported as the first call of the chain that failed
        (a call whose input failed fails with that error, naming the wrong worker)."""
        try:
            return call.wait()
        except WorkerError as error:
            raise _first_failure(self.calls, error) from None


def _first_failure(calls: Sequence[GroupCall], error: WorkerError) -> WorkerError:
    for call in calls:
        if not call.done():
            continue
        try:
            call.wait(timeout=0)
        except WorkerError as failure:
            error = failure
            break
    if isinstance(error, WorkerDiedError) and error.component == "env":
        error.extend_message(
            "\nIt was stepping envs (an env that crashes its process ends this way); "
            "checkpoint.resume=auto continues from the last checkpoint."
        )
    return error


class Pipeline:
    """Submits windows of env ↔ rollout calls; each stage's observation travels as an ObjectRef.

    The observation refs carry over from one window to the next, as the envs do.
    ``into``: ``(channel, actor ranks)``: a window's rollout and env windows are
    sent through the channel to every actor rank (`window_keys`); None: they are
    the results of the window's last calls.
    """

    def __init__(
        self,
        envs: WorkerGroup[EnvWorker],
        rollout: WorkerGroup[PipelineRolloutWorker],
        steps: int,
        stages: int,
        into: tuple[Channel, int] | None = None,
    ) -> None:
        self.envs = envs
        self.rollout = rollout
        self.steps = steps
        self.stages = stages
        self.into = into
        self.submitted = 0  # windows
        self._calls: list[GroupCall] = []
        self.obs: list[list[Any]] = []
        for env_rank in range(envs.world_size):
            observed = [envs.execute_on(env_rank).observe(stage) for stage in range(stages)]
            self._calls += observed
            self.obs.append([call.refs[0] for call in observed])

    def _rollout_of(self, env_rank: int) -> int:
        return env_rank % self.rollout.world_size

    def submit(self) -> SubmittedWindow:
        """Submit one window's calls without waiting for any."""
        calls, self._calls = self._calls, []
        env_ranks = range(self.envs.world_size)
        for _ in range(self.steps):
            for stage in range(self.stages):
                for env_rank in env_ranks:
                    rollout = self.rollout.execute_on(self._rollout_of(env_rank))
                    actions = rollout.predict(env_rank, stage, self.obs[env_rank][stage])
                    stepped = self.envs.execute_on(env_rank).step(stage, actions.refs[0])
                    self.obs[env_rank][stage] = stepped.refs[0]
                    calls += [actions, stepped]
        number, self.submitted = self.submitted, self.submitted + 1
        if self.into is None:
            rollout_windows = [
                self.rollout.execute_on(self._rollout_of(env_rank)).finish(
                    env_rank, *self.obs[env_rank]
                )
                for env_rank in env_ranks
            ]
            env_windows = self.envs.finish()
        else:
            channel, actor_ranks = self.into
            keys = window_keys(number, actor_ranks)
            rollout_windows = [
                self.rollout.execute_on(self._rollout_of(env_rank)).finish_into(
                    channel, keys, env_rank, *self.obs[env_rank]
                )
                for env_rank in env_ranks
            ]
            env_windows = self.envs.finish_into(channel, keys)
        rollout_metrics = self.rollout.pop_metrics()
        calls += [*rollout_windows, env_windows, rollout_metrics]
        return SubmittedWindow(number, calls, rollout_windows, env_windows, rollout_metrics)


def _sync_weights(
    actor: WorkerGroup[PipelineActor],
    rollout: WorkerGroup[PipelineRolloutWorker],
    keep_buffers: bool = False,
) -> list[GroupCall]:
    """Rank 0's full state dict straight to every rollout worker (Ray stores it once);
    ``keep_buffers``: the rollout workers keep their own running statistics."""
    state = actor.policy_state()
    return [state, rollout.set_weights(state.refs[0], keep_buffers)]
