"""Evaluate an embodied checkpoint: its policy's deterministic actions on fresh env seeds.

`evaluate_embodied` builds the run's policy (``actor.model``), loads its
weights from the checkpoint (`load_embodied_policy`), plays
``settings.episodes`` episodes on ``num_envs`` copies of the run's env with
``mode="eval"`` actions, and returns an `EmbodiedEvaluation`: returns and
lengths per episode, the mean return with a Student-t 95% interval, the
success rate with a Wilson 95% interval where the env reports success, and
the GIFs `rlshell.evaluation.recording` wrote.

Episodes are split over the envs before they start (env i plays its first
⌈N/K⌉ or ⌊N/K⌋ episodes), so short episodes are not favoured by counting
whichever finish first. The envs are seeded from `eval_seed`, not from the
training runner's ``runner.seed + 1000 × rank``.

The checkpoint's policy weights are read by `rlshell.checkpoint.load_policy_weights`
(its `POLICY_LAYOUTS` table: a marker file that identifies each runner's
layout and the function that loads the policy's weights from it), re-exported here.
"""

from __future__ import annotations

import math
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from attrs import evolve, frozen

from rlcore import unchecked
from rlshell.checkpoint import (
    POLICY_LAYOUTS,
    CheckpointError,
    PolicyLayout,
    load_policy_weights,
    missing_checkpoint_message,
    policy_layout,
    read_trainer_state,
)
from rlshell.config import Config
from rlshell.envs.stepper import EnvRestarted, EnvStepError, EnvStepper
from rlshell.evaluation.intervals import student_t_interval, wilson_interval
from rlshell.evaluation.recording import RecordingUnavailableError, record_task_gifs
from rlshell.models import as_policy, get_model
from rlshell.models.base import BasePolicy

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

__all__ = [
    "MAX_STEPS_PER_EPISODE",
    "POLICY_LAYOUTS",
    "EmbodiedEvalSettings",
    "EmbodiedEvaluation",
    "Episode",
    "EvaluationError",
    "PolicyLayout",
    "eval_seed",
    "evaluate_embodied",
    "gif_dir",
    "load_embodied_policy",
    "load_policy_weights",
    "missing_checkpoint_message",
    "policy_layout",
    "run_episodes",
]

# SeedSequence([seed, _EVAL_STREAM]): an evaluation's env seeds come from their own stream.
_EVAL_STREAM = int.from_bytes(b"eval", "big")
# A safety stop for envs whose episodes never end (no time limit and a policy that never fails).
MAX_STEPS_PER_EPISODE = 100_000


class EvaluationError(RuntimeError):
    """The run's env or policy cannot be evaluated (the message says which and why)."""


def load_embodied_policy(checkpoint: Path, config: Config) -> BasePolicy:
    """The policy ``config.actor.model`` builds, with the checkpoint's weights, in eval mode."""
    policy_layout(checkpoint)  # a checkpoint without weights fails before the model is built
    torch.manual_seed(config.actor.seed)
    policy = as_policy(
        get_model(config.actor.model),
        config.actor.model,
        EvaluationError,
        ": only a policy with predict_action_batch can act in an env",
    )
    load_policy_weights(checkpoint, policy)
    return policy.eval()


# --- episodes ----------------------------------------------------------------------------------


@frozen
class Episode:
    """One finished episode: env ``env_index``'s ``ordinal``-th since the reset."""

    env_index: int
    ordinal: int
    episode_return: float
    length: int
    success: bool | None  # at the last step; None when the env reports no success
    success_once: bool | None  # at any step


class _EpisodeRecorder(EnvStepper):
    """An `EnvStepper` that keeps every finished episode with its env index.

    The base class keeps only what `EnvStepper.pop_metrics` averages; this
    reads the same figures (return, length, success at the end, success at
    any step) per episode, just before the base class clears them.
    """

    def __init__(self, env: VectorEnv, env_id: str | None = None, **options: Any) -> None:
        super().__init__(env, env_id, **options)
        self.episodes: list[Episode] = []
        self.finished = [0] * self.num_envs

    def _record_episodes(self, rows: np.ndarray, success: np.ndarray | None) -> None:
        reported = self._reports_success
        # As the base class counts them: no success flag at an episode's last step is a failure.
        at_end = success if success is not None else np.zeros_like(self._success_once)
        for row in rows.tolist():
            self.episodes.append(
                Episode(
                    env_index=row,
                    ordinal=self.finished[row],
                    episode_return=float(self._returns[row]),
                    length=int(self._lengths[row]),
                    success=bool(at_end[row]) if reported else None,
                    success_once=bool(self._success_once[row]) if reported else None,
                )
            )
            self.finished[row] += 1
        super()._record_episodes(rows, success)


def eval_seed(seed: int) -> int:
    """The env seed of evaluation seed ``seed``: a 32-bit draw of SeedSequence([seed, "eval"])."""
    sequence = np.random.SeedSequence([seed, _EVAL_STREAM])
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def run_episodes(
    policy: BasePolicy, stepper: _EpisodeRecorder, episodes: int, seed: int
) -> list[Episode]:
    """``episodes`` episodes, env i playing its first ``quota[i]`` (an even split) from ``seed``.

    Ordered by (ordinal, env index): the first ``num_envs`` are each env's
    first episode. Deterministic for a deterministic policy and env.

    An env failure (a step that raises, hangs past ``env.step_timeout_s`` or
    returns NaN) is handled as the stepper's ``on_failure`` says: ``"stop"``
    raises it, naming the env, the env step and the episodes finished so far;
    ``"reset"`` rebuilds the envs (counted in ``stepper.restarts``), the
    episodes in progress are not counted, and every env plays on until its
    quota of finished episodes.
    """
    count = stepper.num_envs
    quotas = [episodes // count + (index < episodes % count) for index in range(count)]
    obs = stepper.reset(seed)
    steps = 0
    with torch.no_grad():
        while any(done < quota for done, quota in zip(stepper.finished, quotas, strict=True)):
            if steps >= MAX_STEPS_PER_EPISODE * max(quotas):
                raise EvaluationError(
                    f"env {stepper.env_id}: episodes still running after {steps} steps; "
                    "set env.max_episode_steps to cut them"
                )
            # rlcore's checks on the first step; the others repeat its shapes (rlcore.unchecked).
            with unchecked() if steps else nullcontext():
                actions, _ = policy.predict_action_batch(obs, mode="eval", compute_values=False)
            try:
                obs = stepper.step(actions, chunk=policy.action_chunk).obs
            except EnvRestarted as restart:
                obs = restart.obs
            except (EnvStepError, FloatingPointError) as error:
                done = sum(min(f, q) for f, q in zip(stepper.finished, quotas, strict=True))
                hint = (
                    "; env.on_failure=reset rebuilds the envs and plays on"
                    if stepper.on_failure == "stop"
                    else ""
                )
                raise EvaluationError(
                    f"{error} — the evaluation stopped after {done} of {episodes} episodes"
                    f"{hint}\n" + "".join(traceback.format_exception(error.__cause__ or error))
                ) from error
            steps += 1
    kept = [e for e in stepper.episodes if e.ordinal < quotas[e.env_index]]
    return sorted(kept, key=lambda e: (e.ordinal, e.env_index))


# --- the evaluation ----------------------------------------------------------------------------


@frozen
class EmbodiedEvalSettings:
    """What `evaluate_embodied` plays: episodes, envs (None: the run's, at most ``episodes``),
    the evaluation seed, and whether (and how long) to record GIFs."""

    episodes: int = 20
    num_envs: int | None = None
    seed: int = 0
    gif: bool = True
    gif_max_frames: int = 200


@frozen
class EmbodiedEvaluation:
    """What an evaluation found; `report` is the JSON object the CLI prints."""

    step: int
    env_id: str
    seed: int
    num_envs: int
    episodes: tuple[Episode, ...]
    gifs: dict[str, Path] | None
    gif_warning: str | None
    seconds: float
    # Env failures the envs were rebuilt after (env.on_failure='reset'; None: 'stop').
    env_failures: int | None = None

    def report(self) -> dict[str, Any]:
        returns = [e.episode_return for e in self.episodes]
        lengths = [e.length for e in self.episodes]
        count = len(returns)
        mean = math.fsum(returns) / count
        interval = student_t_interval(returns)
        std = (
            math.sqrt(math.fsum((r - mean) ** 2 for r in returns) / (count - 1))
            if count > 1
            else None
        )
        reports_success = any(e.success is not None for e in self.episodes)
        wins = sum(bool(e.success) for e in self.episodes)
        return {
            "step": self.step,
            "env_id": self.env_id,
            "seed": self.seed,
            "num_envs": self.num_envs,
            "eval/episodes": count,
            "eval/episode_return": mean,
            "eval/episode_return_ci95": list(interval) if interval is not None else None,
            "eval/episode_return_std": std,
            "eval/episode_length": math.fsum(lengths) / count,
            "eval/success": wins / count if reports_success else None,
            "eval/success_ci95": list(wilson_interval(wins, count)) if reports_success else None,
            "eval/success_once": (
                sum(bool(e.success_once) for e in self.episodes) / count
                if reports_success
                else None
            ),
            "episode_returns": returns,
            "episode_lengths": lengths,
            "gifs": (
                {task: str(path) for task, path in self.gifs.items()}
                if self.gifs is not None
                else None
            ),
            "time/eval": self.seconds,
            **({} if self.env_failures is None else {"eval/env_failures": self.env_failures}),
        }


def gif_dir(checkpoint: Path, step: int) -> Path:
    """``<run dir>/eval/step_N`` for ``<run dir>/checkpoints/global_step_N``."""
    parent = checkpoint.parent
    run_dir = parent.parent if parent.name == "checkpoints" else parent
    return run_dir / "eval" / f"step_{step}"


def _make_stepper(config: Config, num_envs: int, seed: int) -> _EpisodeRecorder:
    import gymnasium

    env_cfg = evolve(config.env, num_envs=num_envs)
    try:
        # The run's env.on_failure, env.step_timeout_s and env.max_consecutive_failures apply.
        return _EpisodeRecorder.from_config(env_cfg, seed)
    except (ValueError, KeyError, ImportError, RuntimeError, gymnasium.error.Error) as error:
        raise EvaluationError(
            f"cannot make the run's env (env.env_type={env_cfg.env_type!r}, "
            f"env.env_id={env_cfg.env_id!r}): {error}"
        ) from error


def evaluate_embodied(
    checkpoint: Path, config: Config, settings: EmbodiedEvalSettings | None = None
) -> EmbodiedEvaluation:
    """Play the checkpoint's policy on the run's env; see the module docstring."""
    settings = settings or EmbodiedEvalSettings()
    if settings.episodes < 1:
        raise ValueError(f"episodes must be a positive int, got {settings.episodes}")
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise CheckpointError(missing_checkpoint_message(checkpoint))
    step = read_trainer_state(checkpoint).step
    started = time.perf_counter()
    policy = load_embodied_policy(checkpoint, config)
    num_envs = min(settings.num_envs or config.env.num_envs, settings.episodes)
    seed = eval_seed(settings.seed)
    stepper = _make_stepper(config, num_envs, seed)
    try:
        episodes = run_episodes(policy, stepper, settings.episodes, seed)
    finally:
        stepper.close()
    env_id = stepper.env_id
    env_failures = stepper.restarts if stepper.on_failure == "reset" else None
    gifs: dict[str, Path] | None = None
    warning = None
    if settings.gif:
        try:
            gifs = record_task_gifs(
                policy,
                config.env,
                seed,
                gif_dir(checkpoint, step),
                max_frames=settings.gif_max_frames,
            )
        except RecordingUnavailableError as error:
            warning = f"no GIF: {error}"
        except (EnvStepError, FloatingPointError) as error:  # the episodes above are kept
            warning = f"no GIF: the recording's env failed: {error}"
    return EmbodiedEvaluation(
        step=step,
        env_id=env_id,
        seed=settings.seed,
        num_envs=num_envs,
        episodes=tuple(episodes),
        gifs=gifs,
        gif_warning=warning,
        seconds=time.perf_counter() - started,
        env_failures=env_failures,
    )
