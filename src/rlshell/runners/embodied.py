"""The ``embodied`` runner: PPO, embodied GRPO and asynchronous SAC on vectorised environments.

Collocated PPO (placement ``"actor,rollout,env": ...``): each rank of the
actor group is also the rollout and the env worker. Cheap environments
cannot afford a Ray round trip per env step, so a rank steps its share of
``env.num_envs`` envs with its own copy of the policy for
``runner.rollout_steps`` steps, then all ranks run PPO's update together as
FSDP2 ranks (gradients averaged by FSDP's reduce-scatter). One Ray call per
rank per step:

    rollout (collect_rollout, parameters gathered once) → GAE (rlcore) →
    update_epochs × num_minibatches PPO steps (rlcore's losses) → metrics

With a group estimator as ``algorithm.adv_type`` the rollout is one episode
per env from group-seeded resets and the advantages are group-normalised
returns (`rlshell.workers.embodied_grpo`). Env, rollout and actor each on
workers of their own (the hybrid placement) run pipelined
(`rlshell.workers.embodied_pipeline`); ``algorithm.loss_type='sac'`` runs
`run_sac`. `rlshell.workers.embodied_update` has PPO's rollout and update;
this module places them, logs ``env/``, ``train/`` and ``time/`` metrics,
and saves and resumes checkpoints (model, optimizer, schedule and RNG states
of each rank; envs start new episodes on resume).
"""

from __future__ import annotations

import time
from collections.abc import Container, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from rlcore import unchecked
from rlshell.checkpoint import (
    TrainerState,
    clean_partials,
    commit,
    prune,
    read_trainer_state,
    resolve_resume,
    staging_dir,
    write_trainer_state,
)
from rlshell.cluster.errors import WorkerDiedError
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import ComponentPlan, PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.cluster.worker import Worker
from rlshell.config import Config
from rlshell.config.loading import ConfigError
from rlshell.engines.training.fsdp import FSDPModelManager
from rlshell.envs.stepper import EnvStepper
from rlshell.metrics import logger_for_run, plot_run
from rlshell.models.base import BasePolicy
from rlshell.models.compiled import CompiledPredict
from rlshell.rollout.trajectory import RewardScaler, Samples, TrajectoryBuffer
from rlshell.workers.actor import worker_device
from rlshell.workers.embodied_grpo import collect_group_episodes, group_samples
from rlshell.workers.embodied_update import (
    CompiledPPOStep,
    PPOSettings,
    collect_rollout,
    ppo_update,
)

__all__ = [
    "EmbodiedWorker",
    "PPOActor",
    "actor_share_problems",
    "dummy_samples",
    "is_embodied_grpo",
    "launched_group",
    "merge_metrics",
    "ppo_settings",
    "run",
    "run_sac",
    "save_run_checkpoint",
    "train_steps",
    "updates_per_step",
]


def is_embodied_grpo(config: Config) -> bool:
    """Group-normalised episode returns (``adv_type`` other than ``gae``) instead of GAE."""
    return config.algorithm.adv_type != "gae"


def updates_per_step(config: Config) -> int:
    """Optimizer steps in one runner step: ``update_epochs × num_minibatches``."""
    return config.algorithm.update_epochs * config.algorithm.num_minibatches


def ppo_settings(config: Config) -> PPOSettings:
    """`PPOSettings` from ``algorithm.*`` and ``actor.optim.clip_grad``."""
    algorithm = config.algorithm
    return PPOSettings(
        update_epochs=algorithm.update_epochs,
        num_minibatches=algorithm.num_minibatches,
        clip_coef=algorithm.clip_low if algorithm.clip_low is not None else 0.2,
        clip_vloss=algorithm.value_clip,
        vf_coef=0.0 if is_embodied_grpo(config) else algorithm.vf_coef,  # GRPO has no critic
        ent_coef=algorithm.entropy_coef,
        max_grad_norm=config.actor.optim.clip_grad,
        norm_adv=algorithm.norm_adv,
    )


class PPOActor(Worker):
    """An FSDP2 rank of PPO's actor: the sharded policy and its optimizer, the reward
    scaler of its envs' rewards, PPO's update, and checkpoints.

    `EmbodiedWorker` adds the envs the rank steps itself; the hybrid placement's
    `rlshell.workers.embodied_pipeline.PipelineActor` trains on windows that env and
    rollout workers of their own collected.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.manager: FSDPModelManager | None = None
        self.reward_scaler: RewardScaler | None = None
        self.windows = 0  # rollout windows collected since the run began
        self.checked: set[str] = set()  # phases whose rlcore calls were shape-checked once
        self.generator = torch.Generator()
        self.compiled: CompiledPPOStep | None = None  # actor.compile's update

    def _setup_actor(self) -> FSDPModelManager:
        """Join the process group and build the sharded policy with its optimizer."""
        config = self.config
        device = worker_device()  # a GPU env (ManiSkill) hands the policy tensors on its GPU
        self.init_process_group("nccl" if device.type == "cuda" else "gloo")
        total = config.runner.max_steps * updates_per_step(config)
        self.manager = FSDPModelManager(config.actor, total_steps=total, device=device)
        self.manager.setup_model_and_optimizer()
        if not isinstance(self.manager.module, BasePolicy):
            raise TypeError(
                f"actor.model.model_type '{config.actor.model.model_type}' builds a "
                f"{type(self.manager.module).__name__}, not a rlshell.models.BasePolicy"
            )
        return self.manager

    def _update(self, samples: Samples) -> dict[str, float]:
        """PPO's epochs on ``samples``: the ``train/`` metrics, with ``train/lr``."""
        manager = self.manager
        if manager is None:
            raise RuntimeError("init_worker() has not run")
        policy = manager.module
        assert isinstance(policy, BasePolicy)
        policy.train()
        lrs: list[float] = []

        def optimizer_step() -> float:
            grad_norm, lr = manager.optimizer_step()
            lrs[:] = lr
            return grad_norm

        with self.checked_once("update"):
            metrics = ppo_update(
                policy,
                self.compiled if self.compiled is not None else optimizer_step,
                samples,
                ppo_settings(self.config),
                self.generator,
            )
        if self.compiled is not None:
            lrs[:] = [self.compiled.lr]
        metrics["train/lr"] = lrs[0] if lrs else float("nan")
        return metrics

    def _compile_update(self, samples_per_window: int, obs: dict[str, torch.Tensor]) -> None:
        """``actor.compile``: compile PPO's minibatch step now, for every minibatch size a
        window of ``samples_per_window`` samples splits into, on dummy batches built from
        ``obs``. Parameters, optimizer state and RNG streams stay as they were."""
        config = self.config
        if not config.actor.compile:
            return
        problems = self._rank_problems("actor.compile", "update")
        if is_embodied_grpo(config):
            problems.append(
                f"actor.compile: compiles PPO's update with algorithm.adv_type 'gae'; got "
                f"'{config.algorithm.adv_type}', whose windows vary in size. Set "
                "actor.compile=false"
            )
        if problems:
            raise ConfigError(problems)
        policy = self._unsharded_policy("actor.compile", "update")
        manager = self.manager
        assert manager is not None
        assert manager.optimizer is not None
        policy.train()  # as PPO's update runs it
        self.compiled = CompiledPPOStep(
            policy, manager.optimizer, ppo_settings(config), manager.lr_scheduler
        )
        sizes = {
            len(rows)
            for rows in torch.tensor_split(
                torch.arange(samples_per_window), config.algorithm.num_minibatches
            )
        }
        for size in sorted(sizes):
            self.compiled.warm_up(dummy_samples(policy, obs, size))

    def _rank_problems(self, key: str, what: str) -> list[str]:
        """A compiled call (``key``: actor.compile, rollout.compile) reads one rank's policy."""
        if self.world_size == 1:
            return []
        return [
            f"{key}: the compiled {what} needs one actor rank (an unsharded policy); got "
            f"{self.world_size}. Set {key}=false or place the actor on one process, e.g. "
            '{"actor,rollout,env": "0:0"}'
        ]

    def _unsharded_policy(self, key: str, what: str) -> BasePolicy:
        """The policy module a compiled call reads (ConfigError where FSDP wraps it)."""
        manager = self.manager
        assert manager is not None
        policy = manager.module
        if isinstance(policy, FSDPModule):  # one rank, sharded only to cast the weights
            raise ConfigError(
                [
                    f"{key}: the compiled {what} needs the policy's weights in "
                    "actor.fsdp_config.mixed_precision's dtype (no FSDP cast); got "
                    f"mixed_precision '{self.config.actor.fsdp_config.mixed_precision}'. Set "
                    f"{key}=false or mixed_precision to the model's dtype"
                ]
            )
        assert isinstance(policy, BasePolicy)
        return policy

    def checked_once(self, phase: str) -> AbstractContextManager[None]:
        """rlcore's shape and dtype checks on a phase's first run in this process, not after.

        Every window repeats the same calls on tensors of the same shapes, and
        on an MLP policy the checks cost about a third of PPO's update
        (`rlcore.unchecked`).
        """
        if phase in self.checked:
            return unchecked()
        self.checked.add(phase)
        return nullcontext()

    def save_checkpoint(self, path: str, step: int) -> None:
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        self.manager.save_checkpoint(Path(path) / "actor", step)
        if self.reward_scaler is not None:
            torch.save(self.reward_scaler.state_dict(), self._scaler_path(path))

    def load_checkpoint(self, path: str) -> int:
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        step = self.manager.load_checkpoint(Path(path) / "actor")
        self.windows = step
        if self.reward_scaler is not None:
            saved = self._scaler_path(path)
            if not saved.is_file():
                raise FileNotFoundError(
                    f"checkpoint {path} has no {saved.name}: saved without algorithm.norm_reward"
                )
            self.reward_scaler.load_state_dict(torch.load(saved))
        return step

    def _scaler_path(self, path: str) -> Path:
        return Path(path) / f"reward_scaler_rank{self.rank}.pt"

    def shutdown_distributed(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class EmbodiedWorker(PPOActor):
    """One rank: its envs, its policy copy (an FSDP2 rank of the actor) and PPO's update."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.stepper: EnvStepper | None = None
        self.buffer: TrajectoryBuffer | None = None
        self.obs: dict[str, torch.Tensor] = {}
        self.predict: CompiledPredict | None = None  # rollout.compile's call

    def init_worker(self) -> dict[str, Any]:
        """Join the process group, build the sharded policy and this rank's envs."""
        config = self.config
        self._setup_actor()
        per_rank = config.env.num_envs // self.world_size
        from attrs import evolve

        seed = config.runner.seed + 1000 * self.rank
        self.stepper = EnvStepper.from_config(evolve(config.env, num_envs=per_rank), seed)
        self.buffer = TrajectoryBuffer(per_rank)
        if config.algorithm.norm_reward:
            self.reward_scaler = RewardScaler(per_rank, config.algorithm.gamma)
        self.generator.manual_seed(seed)
        self.obs = self.stepper.reset(seed)
        self._compile_update(per_rank * config.runner.rollout_steps, self.obs)
        self._compile_rollout(self.obs)
        return {"envs": per_rank, "env_id": self.stepper.env_id}

    def _compile_rollout(self, obs: dict[str, torch.Tensor]) -> None:
        """``rollout.compile``: compile the policy's per-step rollout call for observations
        laid out as ``obs``. Tracing runs on fake tensors: weights, buffers and RNG streams
        stay as they were."""
        if not self.config.rollout.compile:
            return
        problems = self._rank_problems("rollout.compile", "rollout call")
        if problems:
            raise ConfigError(problems)
        policy = self._unsharded_policy("rollout.compile", "rollout call")
        policy.eval()  # as the rollout runs it
        self.predict = CompiledPredict(
            policy, obs, mode="train", compute_values=not is_embodied_grpo(self.config)
        )

    def train_step(self) -> dict[str, float]:
        """One rollout of ``runner.rollout_steps`` steps, then PPO's update; this rank's metrics."""
        manager, stepper, buffer = self.manager, self.stepper, self.buffer
        if manager is None or stepper is None or buffer is None:
            raise RuntimeError("init_worker() has not run")
        config = self.config
        algorithm = config.algorithm
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        grouped = is_embodied_grpo(config)
        with manager.unsharded() as policy, self.checked_once("rollout"):
            assert isinstance(policy, BasePolicy)
            policy.eval()
            if self.predict is not None:
                self.predict.bind(policy)  # a checkpoint load may have replaced the weights
            if grouped:
                # Every window resets its envs: one seed per group, new ones each window.
                seed = config.runner.seed + 1000 * self.rank + 1_000_000 * (self.windows + 1)
                window, self.obs = collect_group_episodes(
                    policy,
                    stepper,
                    seed,
                    algorithm.group_size,
                    config.runner.rollout_steps,
                    self.predict,
                )
            else:
                self.obs = collect_rollout(
                    policy,
                    stepper,
                    buffer,
                    self.obs,
                    config.runner.rollout_steps,
                    self.reward_scaler,
                    self.predict,
                )
        rollout_done = time.perf_counter()
        if grouped:
            samples = group_samples(window, algorithm.adv_type, algorithm.group_size)
            env_steps = window.valid.numel()
        else:
            samples = buffer.finish(algorithm.gamma, algorithm.lam)
            env_steps = samples.size
        metrics.update(self._update(samples))
        metrics.update(stepper.pop_metrics())
        metrics["time/rollout"] = rollout_done - started
        metrics["time/update"] = time.perf_counter() - rollout_done
        metrics["env/steps"] = float(env_steps)
        metrics["train/samples"] = float(samples.size)
        self.windows += 1
        return metrics


def dummy_samples(policy: BasePolicy, obs: dict[str, torch.Tensor], size: int) -> Samples:
    """``size`` samples shaped like a window's, from the deterministic actions on ``obs``
    (``"eval"`` mode: no sampling, no observation statistics updated); for compiling."""
    with torch.no_grad():
        _, info = policy.predict_action_batch(obs, mode="eval", compute_values=False)
    logprobs = info["prev_logprobs"]
    rows = torch.arange(size, device=logprobs.device) % logprobs.shape[0]
    return Samples(
        forward_inputs={key: value[rows] for key, value in info["forward_inputs"].items()},
        logprobs=logprobs[rows],
        # Tensors of their own: the compiled step is traced for inputs that do not alias.
        values=torch.zeros(size, device=rows.device),
        advantages=torch.linspace(-1.0, 1.0, size, device=rows.device),
        returns=torch.ones(size, device=rows.device),
    )


def merge_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One record from every rank's: env episode figures weighted by episodes, sums of
    env steps, the slowest rank's times, means of the rest."""
    merged: dict[str, float] = {}
    keys = {key for metrics in per_rank for key in metrics}
    episodes = [metrics.get("env/episodes", 0.0) for metrics in per_rank]
    for key in sorted(keys):
        values = [metrics[key] for metrics in per_rank if key in metrics]
        if key in ("env/episodes", "env/steps"):
            merged[key] = sum(values)
        elif key.startswith("env/"):
            weights = [e for metrics, e in zip(per_rank, episodes, strict=True) if key in metrics]
            total = sum(weights)
            if total > 0:
                merged[key] = sum(v * w for v, w in zip(values, weights, strict=True)) / total
        elif key.startswith("time/"):
            merged[key] = max(values)
        else:
            merged[key] = sum(values) / len(values)
    return merged


def _check_placement(config: Config, plan: PlacementPlan) -> None:
    actor = plan.component("actor")
    problems = [
        f"cluster.component_placement: the collocated embodied runner runs '{name}' in "
        f"the actor's processes; place them under one key, e.g. "
        '{"actor,rollout,env": "0:0-1"}'
        for name in ("rollout", "env")
        if plan.component(name).placement != actor.placement
    ]
    problems += actor_share_problems(config, len(actor.workers))
    if problems:
        raise ConfigError(problems)


def actor_share_problems(config: Config, ranks: int) -> list[str]:
    """Each of the actor's ``ranks`` trains on an equal share of ``env.num_envs`` envs,
    whose samples must fill ``algorithm.num_minibatches``."""
    problems = []
    if config.env.num_envs % ranks:
        problems.append(
            f"env.num_envs: {config.env.num_envs} envs do not split evenly over the actor's "
            f"{ranks} ranks"
        )
    samples = config.env.num_envs // ranks * config.runner.rollout_steps
    if config.algorithm.num_minibatches > samples:
        problems.append(
            f"algorithm.num_minibatches: {config.algorithm.num_minibatches} minibatches of a "
            f"rank's {samples} samples per step (env.num_envs / ranks × runner.rollout_steps)"
        )
    return problems


@contextmanager
def _launched(config: Config, cluster: Cluster, plan: PlacementPlan) -> Iterator[Any]:
    timeout = config.cluster.call_timeout_s
    actor = plan.component("actor")
    with launched_group(EmbodiedWorker.create_group(config), cluster, actor, timeout) as group:
        try:
            started = time.perf_counter()
            info = group.init_worker().wait()
            print(
                f"workers up in {time.perf_counter() - started:.1f} s ({len(info)} ranks × "
                f"{info[0]['envs']} {info[0]['env_id']} envs, env and policy in the same "
                "processes)",
                flush=True,
            )
            yield group
        except WorkerDiedError as error:  # its traceback died with it: say what it was running
            error.extend_message(
                f"\nIt was stepping env {config.env.env_id or config.env.env_type} (an env "
                "that crashes its process ends this way); checkpoint.resume=auto continues "
                "from the last checkpoint."
            )
            raise


def run(config: Config, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> None:
    """Train for ``runner.max_steps`` rollout-and-update steps, resuming when asked.

    ``algorithm.loss_type='sac'`` runs `run_sac`, the asynchronous SAC loop; the hybrid
    placement (env, rollout and actor under keys of their own) runs
    `rlshell.workers.embodied_pipeline.run_pipelined`.
    """
    if config.algorithm.loss_type == "sac":
        run_sac(config, cluster, plan, run_dir)
        return
    from rlshell.workers.embodied_pipeline import is_hybrid, run_pipelined

    if is_hybrid(config):
        run_pipelined(config, cluster, plan, run_dir)
        return
    _check_placement(config, plan)
    run_dir.mkdir(parents=True, exist_ok=True)
    clean_partials(run_dir)
    resume_from = resolve_resume(config.checkpoint.resume, run_dir)
    with ExitStack() as stack:
        group = stack.enter_context(_launched(config, cluster, plan))
        start_step = 0
        if resume_from is not None:
            read_trainer_state(resume_from)
            start_step = int(group.load_checkpoint(str(resume_from)).wait()[0])
            print(f"resumed from {resume_from} (step {start_step})", flush=True)
        logger = stack.enter_context(logger_for_run(config, run_dir, start_step))
        env_steps = start_step * config.env.num_envs * config.runner.rollout_steps
        steps = range(start_step + 1, config.runner.max_steps + 1)
        interval = config.checkpoint.interval
        saves = {s for s in steps if interval and (s % interval == 0 or s == steps[-1])}
        finished = time.perf_counter()
        results = train_steps(group, len(steps), after={s - start_step for s in saves})
        for step, metrics in zip(steps, results, strict=True):
            metrics["time/step"] = time.perf_counter() - finished
            env_steps += int(metrics["env/steps"])
            metrics["env/total_steps"] = float(env_steps)
            metrics["perf/env_steps_per_s"] = metrics["env/steps"] / metrics["time/step"]
            logger.log(step, metrics)
            if step in saves:
                save_run_checkpoint(config, group, run_dir, step)
            finished = time.perf_counter()
    plot_run(run_dir, ("env/episode_return", "env/success"))


def train_steps(
    group: WorkerGroup[Any], count: int, after: Container[int] = ()
) -> Iterator[dict[str, float]]:
    """The merged metrics of ``count`` ``train_step`` calls on ``group``, in order.

    The next call is queued while one runs (Ray runs an actor's calls in the
    order they were made), so a worker starts its next rollout at once
    instead of idling through the driver's round trip (~2 ms a step, a tenth
    of a CartPole step). After the i-th result (from 1) with i in ``after``
    nothing is queued until the caller asks for the next: a checkpoint saved
    then is the state after step i. A failed call raises from the iterator;
    a call queued behind it fails or is dropped with the group.
    """
    pending = group.train_step() if count > 0 else None
    for i in range(1, count + 1):
        call = pending
        assert call is not None
        pending = group.train_step() if i < count and i not in after else None
        yield merge_metrics(call.wait())
        if pending is None and i < count:
            pending = group.train_step()


def save_run_checkpoint(config: Config, group: WorkerGroup[Any], run_dir: Path, step: int) -> None:
    """``group.save_checkpoint`` into a staging directory, then commit it and prune old ones."""
    staging = staging_dir(run_dir, step)
    group.save_checkpoint(str(staging), step).wait()
    write_trainer_state(
        staging,
        TrainerState(
            step=step,
            sampler_epoch=0,
            sampler_position=0,
            experiment_name=config.runner.experiment_name,
        ),
    )
    commit(staging, run_dir, step)
    prune(run_dir, config.checkpoint.keep_last)


# ---------------------------------------------------------------------------
# SAC: env collectors and one learner, overlapped.


def _check_sac_placement(config: Config, plan: PlacementPlan) -> None:
    collectors = len(plan.component("env").workers)
    problems = []
    if len(plan.component("actor").workers) != 1:
        problems.append(
            "cluster.component_placement: SAC's learner ('actor') runs in one process, got "
            f"{len(plan.component('actor').workers)}"
        )
    if config.env.num_envs % collectors:
        problems.append(
            f"env.num_envs: {config.env.num_envs} envs do not split evenly over the "
            f"{collectors} env workers"
        )
    if problems:
        raise ConfigError(problems)


def run_sac(config: Config, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> None:
    """Asynchronous SAC: while the learner trains on chunk k the collectors gather chunk k + 1.

    One runner step is one chunk: ``runner.rollout_steps`` steps of every env
    (``env.num_envs × rollout_steps`` transitions), the learner's updates on
    it, and the new weights queued to the collectors behind the chunk they
    are collecting (Ray runs a worker's calls in order), so the policy that
    collects chunk k + 2 is the one trained on chunk k. Chunks before
    ``algorithm.sac.learning_starts`` transitions use uniform random actions.
    A checkpoint holds the learner, its replay buffer and RNG states; the
    envs start new episodes on resume.
    """
    from rlshell.workers.sac_workers import SACCollector, SACLearnerWorker

    _check_sac_placement(config, plan)
    run_dir.mkdir(parents=True, exist_ok=True)
    clean_partials(run_dir)
    resume_from = resolve_resume(config.checkpoint.resume, run_dir)
    chunk = config.env.num_envs * config.runner.rollout_steps
    timeout = config.cluster.call_timeout_s

    def random_chunk(step: int) -> bool:  # does chunk ``step`` (1-based) act at random?
        return (step - 1) * chunk < config.algorithm.sac.learning_starts

    with ExitStack() as stack:
        started = time.perf_counter()
        collectors: WorkerGroup[SACCollector] = stack.enter_context(
            launched_group(
                SACCollector.create_group(config), cluster, plan.component("env"), timeout
            )
        )
        learner: WorkerGroup[SACLearnerWorker] = stack.enter_context(
            launched_group(
                SACLearnerWorker.create_group(config), cluster, plan.component("actor"), timeout
            )
        )
        info = collectors.init_worker().wait()
        learner.init_worker(info[0]["obs_dim"], info[0]["action_dim"]).wait()
        print(
            f"workers up in {time.perf_counter() - started:.1f} s ({len(info)} env workers × "
            f"{info[0]['envs']} {info[0]['env_id']} envs, 1 learner)",
            flush=True,
        )
        start_step = 0
        if resume_from is not None:
            read_trainer_state(resume_from)
            start_step = int(learner.load_checkpoint(str(resume_from)).wait()[0])
            print(f"resumed from {resume_from} (step {start_step})", flush=True)
        weights = learner.policy_weights().wait()[0]
        collectors.set_weights(weights).wait()
        logger = stack.enter_context(logger_for_run(config, run_dir, start_step))
        env_steps = start_step * chunk
        pending = collectors.collect(config.runner.rollout_steps, random_chunk(start_step + 1))
        for step in range(start_step + 1, config.runner.max_steps + 1):
            step_started = time.perf_counter()
            collected = pending.wait()
            if step < config.runner.max_steps:
                pending = collectors.collect(config.runner.rollout_steps, random_chunk(step + 1))
            train_metrics, weights = learner.train([batch for batch, _ in collected]).wait()[0]
            if weights is not None:
                collectors.set_weights(weights)  # runs after the chunk being collected
            metrics = merge_metrics([m for _, m in collected])
            metrics.update(train_metrics)
            metrics["time/step"] = time.perf_counter() - step_started
            env_steps += int(metrics["env/steps"])
            metrics["env/total_steps"] = float(env_steps)
            metrics["perf/env_steps_per_s"] = metrics["env/steps"] / metrics["time/step"]
            logger.log(step, metrics)
            interval = config.checkpoint.interval
            if interval and (step % interval == 0 or step == config.runner.max_steps):
                save_run_checkpoint(config, learner, run_dir, step)
    plot_run(run_dir, ("env/episode_return", "env/success"))


@contextmanager
def launched_group(
    group: WorkerGroup[Any], cluster: Cluster, placement: ComponentPlan, timeout: float | None
) -> Iterator[Any]:
    """``group`` launched on ``placement`` for the block, shut down after it."""
    launched = group.launch(cluster, placement, call_timeout_s=timeout)
    try:
        yield launched
    finally:
        launched.shutdown()
