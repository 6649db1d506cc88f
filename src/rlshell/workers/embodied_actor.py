"""Embodied PPO's actor ranks: the sharded policy, its optimizer and PPO's update.

`PPOActor` is one FSDP2 rank of the policy with its optimizer, the reward
scaler of its envs' rewards, PPO's update (`rlshell.workers.embodied_update`,
its minibatch step chosen once: eager, or compiled with ``actor.compile``) and
checkpoints. `EmbodiedWorker` adds the envs a rank steps itself (the
collocated placement, ``"actor,rollout,env"`` under one key): one
`EmbodiedWorker.train_step` call is a rollout of ``runner.rollout_steps``
steps and the update on it. The hybrid placement's
`rlshell.workers.embodied_pipeline.PipelineActor` trains on windows that env
and rollout workers of their own collected.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from attrs import evolve, frozen
from torch.distributed.fsdp import FSDPModule

from rlcore import unchecked
from rlshell.cluster.worker import Worker
from rlshell.config import Config, ConfigError
from rlshell.engines.training import TrainingBackend, make_training_backend
from rlshell.envs.stepper import EnvStepper
from rlshell.models import as_policy
from rlshell.models.base import BasePolicy
from rlshell.models.compiled import CompiledPredict
from rlshell.rollout.trajectory import RewardScaler, Samples, TrajectoryBuffer
from rlshell.rundir import write_nonfinite
from rlshell.workers.common import worker_device
from rlshell.workers.embodied_grpo import collect_group_episodes, group_samples
from rlshell.workers.embodied_update import (
    CompiledPPOStep,
    EagerPPOStep,
    NonFiniteUpdateError,
    PPOSettings,
    UpdateStep,
    collect_rollout,
    ppo_update,
)

__all__ = ["EmbodiedWorker", "EnvShare", "PPOActor", "dummy_samples"]


@frozen
class EnvShare:
    """What a worker that steps envs reports when it starts: how many, of which env."""

    envs: int
    env_id: str


class PPOActor(Worker):
    """An FSDP2 rank of PPO's actor: the sharded policy and its optimizer, the reward
    scaler of its envs' rewards, PPO's update, and checkpoints.

    `EmbodiedWorker` adds the envs the rank steps itself; the hybrid placement's
    `rlshell.workers.embodied_pipeline.PipelineActor` trains on windows that env and
    rollout workers of their own collected.
    """

    def __init__(self, config: Config, critic: bool) -> None:
        self.config = config
        self.critic = critic  # GAE with a value head; without, group-normalised returns
        self.settings = PPOSettings.of(config, critic)
        self.manager: TrainingBackend | None = None
        self.reward_scaler: RewardScaler | None = None
        self.windows = 0  # rollout windows collected since the run began
        self.checked: set[str] = set()  # phases whose rlcore calls were shape-checked once
        self.generator = torch.Generator()
        self.update_step: UpdateStep | None = None

    def _setup_actor(self) -> TrainingBackend:
        """Join the process group and build the sharded policy with its optimizer (and the
        eager update step; `_compile_update` may replace it)."""
        config = self.config
        device = worker_device()  # a GPU env (ManiSkill) hands the policy tensors on its GPU
        self.init_process_group("nccl" if device.type == "cuda" else "gloo")
        total = config.runner.max_steps * self.settings.steps_per_window
        manager = make_training_backend(config.actor, total_steps=total, device=device)
        manager.setup_model_and_optimizer()
        self.manager = manager
        policy = as_policy(manager.module, config.actor.model)

        def optimizer_step() -> tuple[float, float]:
            grad_norm, lrs = manager.optimizer_step()
            return grad_norm, lrs[0]

        self.update_step = EagerPPOStep(policy, self.settings, optimizer_step)
        return manager

    def _update(self, samples: Samples) -> dict[str, float]:
        """PPO's epochs on ``samples``: the ``train/`` metrics, with ``train/lr``."""
        manager, step = self.manager, self.update_step
        if manager is None or step is None:
            raise RuntimeError("init_worker() has not run")
        policy = manager.module
        assert isinstance(policy, BasePolicy)
        policy.train()
        with self.checked_once("update"):
            try:
                metrics = ppo_update(policy, step, samples, self.settings, self.generator)
            except NonFiniteUpdateError as error:
                raise FloatingPointError(f"{error}. {self._dump_nonfinite(error)}") from None
        metrics["train/lr"] = step.lr
        # The learning-rate schedule counts windows (runner.max_steps of them): the steps an
        # early stop (algorithm.target_kl) saved still move it, as CleanRL anneals per update.
        planned = self.settings.steps_per_window
        skipped = planned - int(metrics.get("train/optimizer_steps", planned))
        scheduler = manager.lr_scheduler
        if scheduler is not None:
            for _ in range(skipped):
                scheduler.step()
        return metrics

    def _dump_nonfinite(self, error: NonFiniteUpdateError) -> str:
        """Write the minibatch whose loss was not finite into the run directory."""
        batch = error.minibatch
        runner = self.config.runner
        step = self.windows + 1
        record = {
            "step": step,
            "rank": self.rank,
            "forward_inputs": {k: v.detach().cpu() for k, v in batch.forward_inputs.items()},
            **{
                name: getattr(batch, name).detach().cpu()
                for name in ("logprobs", "values", "advantages", "returns")
            },
        }
        run_dir = Path(runner.output_dir) / runner.experiment_name
        return write_nonfinite(run_dir, f"step_{step}_rank_{self.rank}", record)

    def _compile_update(self, samples_per_window: int, obs: dict[str, torch.Tensor]) -> None:
        """``actor.compile``: compile PPO's minibatch step now, for every minibatch size a
        window of ``samples_per_window`` samples splits into, on dummy batches built from
        ``obs``. Parameters, optimizer state and RNG streams stay as they were."""
        config = self.config
        if not config.actor.compile:
            return
        policy = self._unsharded_policy("actor.compile", "update")
        manager = self.manager
        assert manager is not None
        assert manager.optimizer is not None
        policy.train()  # as PPO's update runs it
        compiled = CompiledPPOStep(policy, manager.optimizer, self.settings, manager.lr_scheduler)
        sizes = {
            len(rows)
            for rows in torch.tensor_split(
                torch.arange(samples_per_window), config.algorithm.num_minibatches
            )
        }
        for size in sorted(sizes):
            compiled.warm_up(dummy_samples(policy, obs, size))
        self.update_step = compiled

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
            self.reward_scaler.load_state_dict(torch.load(saved, weights_only=True))
        return step

    def _scaler_path(self, path: str) -> Path:
        return Path(path) / f"reward_scaler_rank{self.rank}.pt"

    def shutdown_distributed(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class EmbodiedWorker(PPOActor):
    """One rank: its envs, its policy copy (an FSDP2 rank of the actor) and PPO's update."""

    def __init__(self, config: Config, critic: bool) -> None:
        super().__init__(config, critic)
        self.stepper: EnvStepper | None = None
        self.buffer: TrajectoryBuffer | None = None
        self.obs: dict[str, torch.Tensor] = {}
        self.predict: CompiledPredict | None = None  # rollout.compile's call

    def init_worker(self) -> EnvShare:
        """Join the process group, build the sharded policy and this rank's envs."""
        config = self.config
        self._setup_actor()
        per_rank = config.env.num_envs // self.world_size
        seed = config.runner.seed + 1000 * self.rank
        self.stepper = EnvStepper.from_config(evolve(config.env, num_envs=per_rank), seed)
        self.buffer = TrajectoryBuffer(per_rank)
        if config.algorithm.norm_reward:
            self.reward_scaler = RewardScaler(per_rank, config.algorithm.gamma)
        self.generator.manual_seed(seed)
        self.obs = self.stepper.reset(seed)
        self._compile_update(per_rank * config.runner.rollout_steps, self.obs)
        self._compile_rollout(self.obs)
        return EnvShare(envs=per_rank, env_id=self.stepper.env_id)

    def _compile_rollout(self, obs: dict[str, torch.Tensor]) -> None:
        """``rollout.compile``: compile the policy's per-step rollout call for observations
        laid out as ``obs``. Tracing runs on fake tensors: weights, buffers and RNG streams
        stay as they were."""
        if not self.config.rollout.compile:
            return
        policy = self._unsharded_policy("rollout.compile", "rollout call")
        policy.eval()  # as the rollout runs it
        self.predict = CompiledPredict(policy, obs, mode="train", compute_values=self.critic)

    def train_step(self) -> dict[str, float]:
        """One rollout of ``runner.rollout_steps`` steps, then PPO's update; this rank's metrics."""
        manager, stepper, buffer = self.manager, self.stepper, self.buffer
        if manager is None or stepper is None or buffer is None:
            raise RuntimeError("init_worker() has not run")
        config = self.config
        algorithm = config.algorithm
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        grouped = not self.critic
        with manager.unsharded() as policy, self.checked_once("rollout"):
            assert isinstance(policy, BasePolicy)
            policy.eval()
            chunk = policy.action_chunk  # env steps per policy step
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
                    bootstrap_at_done=algorithm.bootstrap_at_done == "always",
                )
        rollout_done = time.perf_counter()
        if grouped:
            samples = group_samples(window, algorithm.adv_type, algorithm.group_size)
            env_steps = window.valid.numel() * chunk
        else:
            samples = buffer.finish(algorithm.gamma, algorithm.lam)
            env_steps = samples.size * chunk
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
