"""SAC's two workers for the asynchronous embodied runner: env collectors and one learner.

`SACCollector` (the ``env`` and ``rollout`` component) holds its share of
``env.num_envs`` envs and a copy of the policy; each `SACCollector.collect`
call steps them ``runner.rollout_steps`` times and returns the transitions.
`SACLearnerWorker` (the ``actor`` component, one process) keeps the replay
buffer and the `rlshell.workers.sac_update.SACLearner`; each
`SACLearnerWorker.train` call adds the transitions of a chunk and makes
``utd_ratio`` updates per transition added, then hands back the policy's
weights. The trainer (`rlshell.runners.sac`) overlaps the two: while the
learner trains on chunk k, the collectors gather chunk k + 1 with the
weights of the update before, so each chunk's policy is one chunk stale, as
in asynchronous SAC (RLinf's async embodied runner, SRL, Sample Factory).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import attrs
import torch
from attrs import evolve, frozen
from torch import Tensor

from rlcore import unchecked
from rlshell.cluster.worker import Worker
from rlshell.config import Config
from rlshell.envs.stepper import EnvObs, EnvStepper
from rlshell.models import as_policy, get_model
from rlshell.models.base import BasePolicy
from rlshell.randomness import rng_state, set_rng_state
from rlshell.rollout.replay import ReplayBatch, ReplayBuffer
from rlshell.rundir import write_nonfinite
from rlshell.workers.sac_update import SACLearner, SACSettings, collect_sac_steps

__all__ = ["CollectorShare", "SACCollector", "SACLearnerWorker", "sac_settings"]

LEARNER_STATE = "sac_learner.pt"


def sac_settings(config: Config) -> SACSettings:
    """`SACSettings` from ``algorithm.sac``, ``algorithm.gamma`` and ``actor.optim.lr``."""
    sac = config.algorithm.sac
    return SACSettings(
        gamma=config.algorithm.gamma,
        tau=sac.tau,
        batch_size=sac.batch_size,
        learning_starts=sac.learning_starts,
        policy_frequency=sac.policy_frequency,
        target_network_frequency=sac.target_network_frequency,
        autotune=sac.autotune,
        alpha=sac.alpha,
        target_entropy=sac.target_entropy,
        policy_lr=config.actor.optim.lr,
        q_lr=sac.q_lr,
        alpha_lr=sac.alpha_lr,
    )


@frozen
class CollectorShare:
    """What a collector reports when it starts: its envs and the sizes the learner needs."""

    envs: int
    env_id: str
    obs_dim: int
    action_dim: int


def _build_policy(config: Config) -> BasePolicy:
    torch.manual_seed(config.actor.seed)
    return as_policy(get_model(config.actor.model), config.actor.model)


class SACCollector(Worker):
    """One env worker: its envs and a copy of the policy, stepped a chunk per call."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.policy: BasePolicy | None = None
        self.stepper: EnvStepper | None = None
        self.obs: EnvObs = {}
        self.generator = torch.Generator()

    def init_worker(self) -> CollectorShare:
        """Build the policy copy and this worker's envs; their sizes for the learner."""
        config = self.config
        self.policy = _build_policy(config).eval()
        self.policy.requires_grad_(False)
        per_worker = config.env.num_envs // self.world_size
        seed = config.runner.seed + 1000 * self.rank
        self.stepper = EnvStepper.from_config(evolve(config.env, num_envs=per_worker), seed)
        self.generator.manual_seed(seed)
        torch.manual_seed(seed)  # the policy samples from the global generator
        self.obs = self.stepper.reset(seed)
        return CollectorShare(
            envs=per_worker,
            env_id=self.stepper.env_id,
            obs_dim=int(self.obs["states"].shape[1]),
            action_dim=int(self.stepper.action_shape[1]),
        )

    def collect(self, steps: int, random_actions: bool) -> tuple[ReplayBatch, dict[str, float]]:
        """``steps`` steps of every env: the transitions in step order and ``env/`` metrics."""
        policy, stepper = self.policy, self.stepper
        if policy is None or stepper is None:
            raise RuntimeError("init_worker() has not run")
        started = time.perf_counter()
        obs_dim = int(self.obs["states"].shape[1])
        chunk = ReplayBuffer(steps * stepper.num_envs, obs_dim, stepper.action_shape[1])
        with torch.no_grad():
            self.obs = collect_sac_steps(
                policy,
                stepper,
                chunk,
                self.obs,
                steps,
                self.generator,
                random_actions,
                bootstrap_at_done=self.config.algorithm.bootstrap_at_done == "always",
            )
        metrics = stepper.pop_metrics()
        metrics["env/steps"] = float(steps * stepper.num_envs)
        metrics["time/collect"] = time.perf_counter() - started
        return chunk.contents(), metrics

    def set_weights(self, weights: dict[str, Tensor]) -> None:
        """Load the learner's policy weights (a state dict)."""
        if self.policy is None:
            raise RuntimeError("init_worker() has not run")
        self.policy.load_state_dict(weights)


class SACLearnerWorker(Worker):
    """The learner: the replay buffer, the policy with its target Q heads, α and optimizers."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.learner: SACLearner | None = None
        self.replay: ReplayBuffer | None = None
        self.generator = torch.Generator()
        self.transitions = 0  # added to the replay buffer since the run began
        self.owed = 0.0  # updates earned by transitions and not yet made
        self.checked = False  # whether an update ran with rlcore's shape checks

    def init_worker(self, obs_dim: int, action_dim: int) -> int:
        """Build the learner for the collectors' observation and action sizes; its parameter
        count."""
        config = self.config
        if self.world_size != 1:
            raise ValueError(
                f"SAC's learner runs in one process; the actor is placed on {self.world_size}"
            )
        policy = _build_policy(config)
        self.learner = SACLearner(policy, action_dim, sac_settings(config))
        self.replay = ReplayBuffer(config.algorithm.sac.replay_size, obs_dim, action_dim)
        self.generator.manual_seed(config.runner.seed + 7919)
        return sum(p.numel() for p in policy.parameters())

    def policy_weights(self) -> dict[str, Tensor]:
        """The policy's state dict, for the collectors."""
        if self.learner is None:
            raise RuntimeError("init_worker() has not run")
        return {name: t.detach().clone() for name, t in self.learner.policy.state_dict().items()}

    def train(self, chunks: list[ReplayBatch]) -> tuple[dict[str, float], dict[str, Tensor] | None]:
        """Add the chunks, make the updates they earn; (metrics, new weights or None).

        Before ``learning_starts`` transitions no update runs and no weights
        come back. Metrics are means over this call's updates.
        """
        learner, replay = self.learner, self.replay
        if learner is None or replay is None:
            raise RuntimeError("init_worker() has not run")
        sac = self.config.algorithm.sac
        started = time.perf_counter()
        added = 0
        for chunk in chunks:
            replay.add(
                chunk.states, chunk.actions, chunk.rewards, chunk.next_states, chunk.terminated
            )
            added += chunk.size
        before = self.transitions
        self.transitions += added
        learning = max(0, self.transitions - max(before, sac.learning_starts))
        self.owed += sac.utd_ratio * learning
        updates = int(self.owed)
        self.owed -= updates
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        learner.policy.train()
        for index in range(updates):
            # rlcore's checks on this process's first update; the rest repeat its shapes.
            with unchecked() if self.checked or index else nullcontext():
                batch = replay.sample(sac.batch_size, self.generator)
                try:
                    update = learner.update(batch)
                except FloatingPointError as error:
                    raise FloatingPointError(f"{error}. {self._dump_nonfinite(batch)}") from None
                for key, value in update.items():
                    totals[key] = totals.get(key, 0.0) + value
                    counts[key] = counts.get(key, 0) + 1
        self.checked = self.checked or updates > 0
        metrics = {key: totals[key] / counts[key] for key in totals}
        metrics["train/updates"] = float(updates)
        metrics["train/replay_size"] = float(len(replay))
        metrics["time/update"] = time.perf_counter() - started
        return metrics, (self.policy_weights() if updates else None)

    def _dump_nonfinite(self, batch: ReplayBatch) -> str:
        """Write the sampled batch of an update whose loss or gradient was not finite into
        ``<run dir>/nonfinite/update_<n>.pt`` (n: the learner's update count, from 1)."""
        assert self.learner is not None
        runner = self.config.runner
        update = self.learner.step + 1
        record = {
            "update": update,
            **{f.name: getattr(batch, f.name).detach().cpu() for f in attrs.fields(ReplayBatch)},
        }
        run_dir = Path(runner.output_dir) / runner.experiment_name
        return write_nonfinite(run_dir, f"update_{update}", record)

    def save_checkpoint(self, path: str, step: int) -> None:
        """Learner, replay buffer, counters and RNG states to ``path/sac_learner.pt``."""
        if self.learner is None or self.replay is None:
            raise RuntimeError("init_worker() has not run")
        target = Path(path) / LEARNER_STATE
        torch.save(
            {
                "step": step,
                "learner": self.learner.state_dict(),
                "replay": self.replay.state_dict(),
                "transitions": self.transitions,
                "owed": self.owed,
                "generator": self.generator.get_state(),
                "rng": rng_state(),
            },
            target,
        )

    def load_checkpoint(self, path: str) -> int:
        """Restore what `save_checkpoint` wrote; returns its step."""
        if self.learner is None or self.replay is None:
            raise RuntimeError("init_worker() has not run")
        source = Path(path) / LEARNER_STATE
        if not source.is_file():
            raise FileNotFoundError(
                f"checkpoint {path} has no {LEARNER_STATE}: not a checkpoint of a SAC run"
            )
        state = torch.load(source, weights_only=True)
        self.learner.load_state_dict(state["learner"])
        self.replay.load_state_dict(state["replay"])
        self.transitions = int(state["transitions"])
        self.owed = float(state["owed"])
        self.generator.set_state(state["generator"])
        set_rng_state(state["rng"])
        return int(state["step"])
