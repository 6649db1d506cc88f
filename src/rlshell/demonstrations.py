"""Demonstrations for embodied SFT: recorded episodes in one safetensors file.

A file holds T steps of E whole episodes, in order (no pickle: safetensors
stores tensors and a string header only, so loading one runs nothing):

- ``obs.<key>``: each observation key the env gave the policy (`rlshell.envs.stepper.EnvObs`):
  ``obs.states`` float32 ``[T, state_dim]``, ``obs.main_images`` uint8 ``[T, H, W, C]``,
  ``obs.task_descriptions`` int32 ``[T, L]``, ...
- ``actions``: float32 ``[T, *action_shape]``, what the expert did at each step;
- ``episode``: int64 ``[T]``, the index of each step's episode, 0 … E − 1, non-decreasing;
- ``success``: bool ``[E]``, whether the episode ended in success (false where the env
  reports none);
- metadata (strings): ``format`` (`FORMAT`), ``env_id``, ``expert`` (who acted) and
  ``sha256``, the digest of every tensor's name, dtype, shape and bytes.

`load_demonstrations` checks all of it (format, digest, keys, dtypes, lengths, episode
order, finite values) and says what is wrong and where: a damaged or altered file is
refused, not trained on. `Demonstrations.sft_batch` gives
``(observation, actions)`` rows for a policy's ``sft_forward``; for a policy acting in
chunks of C actions (`rlshell.models.base.BasePolicy.action_chunk`) the row at step t
takes the actions of steps t … t + C − 1 of its episode, the episode's last action
repeated past its end (as LeRobot pads chunks; OpenPI's data loaders do the same).

``python -m rlshell.record CONFIG [KEY=VALUE ...] --expert EXPERT --episodes N --out FILE``
records them (`record_demonstrations`): the env is the config's (``env.*``), the expert

- ``metaworld``: MetaWorld's scripted policy for the task (``metaworld.policies``,
  one for every task; ``env.env_type='metaworld'`` with ``env.obs_mode='state'``),
- ``checkpoint:PATH``: the policy of a checkpoint of a run of this config, in eval mode
  (a trained expert: e.g. the PPO policy of ``configs/ppo_pushcube_cpu.py``),

and ``--only-success`` keeps the successful episodes only. ``python -m rlshell.record
--show FILE`` prints what a file holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from attrs import evolve, frozen
from torch import Tensor

from rlshell.config import Config, ConfigError
from rlshell.envs.stepper import EnvObs, EnvStepper, StepResult

__all__ = [
    "FORMAT",
    "DemonstrationError",
    "Demonstrations",
    "Expert",
    "describe",
    "load_demonstrations",
    "make_expert",
    "record_demonstrations",
    "save_demonstrations",
]

FORMAT = "rlstack-demonstrations/1"
_OBS = "obs."
_FLOAT_OBS = ("states",)  # float32 observations; the others keep the env's integer dtype

Expert = Callable[[EnvObs], Tensor]
"""What acts while recording: the observation batch → actions ``[num_envs, *action_shape]``."""


class DemonstrationError(ValueError):
    """A demonstrations file is missing, damaged or not laid out as `FORMAT` says."""


@frozen(eq=False)
class Demonstrations:
    """T recorded steps of E episodes (the module's docstring says what each field holds)."""

    obs: dict[str, Tensor]
    actions: Tensor
    episode: Tensor
    success: Tensor
    env_id: str
    expert: str

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def episodes(self) -> int:
        return int(self.success.shape[0])

    def sft_batch(self, rows: Tensor, chunk: int = 1) -> tuple[EnvObs, Tensor]:
        """The observations at steps ``rows`` and the actions a policy acting in chunks of
        ``chunk`` should take there: ``[B, *action_shape]`` for 1, else
        ``[B, chunk, *action_shape]`` (steps t … t + chunk − 1 of t's episode, its last
        action repeated past its end)."""
        obs = {key: value[rows] for key, value in self.obs.items()}
        if chunk == 1:
            return obs, self.actions[rows]
        last = _episode_last_steps(self.episode)[self.episode[rows]]
        ahead = rows[:, None] + torch.arange(chunk)[None, :]
        return obs, self.actions[torch.minimum(ahead, last[:, None])]

    def split(self, held_out: int) -> tuple[Demonstrations, Demonstrations]:
        """(the first E − ``held_out`` episodes, the last ``held_out``), renumbered."""
        if not 0 < held_out < self.episodes:
            raise ValueError(
                f"held_out: 1 to {self.episodes - 1} of {self.episodes} episodes, got {held_out}"
            )
        keep = self.episodes - held_out
        return self._episodes(torch.arange(keep)), self._episodes(torch.arange(keep, self.episodes))

    def _episodes(self, which: Tensor) -> Demonstrations:
        rows = torch.isin(self.episode, which)
        renumbered = torch.searchsorted(which, self.episode[rows])
        return evolve(
            self,
            obs={key: value[rows] for key, value in self.obs.items()},
            actions=self.actions[rows],
            episode=renumbered,
            success=self.success[which],
        )


def _episode_last_steps(episode: Tensor) -> Tensor:
    """Per episode index, the row of its last step."""
    count = int(episode.max()) + 1 if episode.numel() else 0
    last = torch.zeros(count, dtype=torch.int64)
    last.scatter_reduce_(0, episode, torch.arange(episode.numel()), reduce="amax")
    return last


def save_demonstrations(demos: Demonstrations, path: Path) -> Path:
    """Write ``demos`` to ``path`` (safetensors, `FORMAT`); returns ``path``."""
    from safetensors.torch import save_file

    _check(demos, str(path))
    tensors = {f"{_OBS}{key}": value.contiguous() for key, value in demos.obs.items()}
    tensors.update(
        actions=demos.actions.contiguous(),
        episode=demos.episode.contiguous(),
        success=demos.success.contiguous(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "format": FORMAT,
        "env_id": demos.env_id,
        "expert": demos.expert,
        "sha256": _digest(tensors),
    }
    save_file(tensors, str(path), metadata=metadata)
    return path


def load_demonstrations(path: Path | str) -> Demonstrations:
    """The demonstrations in ``path``, checked (`DemonstrationError` naming what is wrong)."""
    from safetensors import SafetensorError, safe_open

    where = str(path)
    if not Path(path).is_file():
        raise DemonstrationError(f"demonstrations {where}: no such file")
    try:
        with safe_open(where, framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as error:
        raise DemonstrationError(
            f"demonstrations {where}: not a safetensors file ({error}); record one with "
            "python -m rlshell.record"
        ) from None
    if metadata.get("format") != FORMAT:
        raise DemonstrationError(
            f"demonstrations {where}: format {metadata.get('format')!r}, expected {FORMAT!r}"
        )
    if metadata.get("sha256") != _digest(tensors):
        raise DemonstrationError(
            f"demonstrations {where}: its tensors do not match the digest it was written with "
            "(the file is damaged or was altered)"
        )
    missing = [key for key in ("actions", "episode", "success") if key not in tensors]
    if missing:
        raise DemonstrationError(f"demonstrations {where}: no {', '.join(missing)} tensor")
    obs = {key[len(_OBS) :]: value for key, value in tensors.items() if key.startswith(_OBS)}
    unknown = sorted(set(tensors) - {"actions", "episode", "success"} - {_OBS + k for k in obs})
    if unknown:
        raise DemonstrationError(f"demonstrations {where}: unknown tensors {unknown}")
    demos = Demonstrations(
        obs=obs,
        actions=tensors["actions"],
        episode=tensors["episode"],
        success=tensors["success"],
        env_id=metadata.get("env_id", ""),
        expert=metadata.get("expert", ""),
    )
    _check(demos, where)
    return demos


def _digest(tensors: dict[str, Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        value = tensors[key].contiguous()
        digest.update(f"{key} {value.dtype} {list(value.shape)}\n".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def _check(demos: Demonstrations, where: str) -> None:
    def fail(problem: str) -> DemonstrationError:
        return DemonstrationError(f"demonstrations {where}: {problem}")

    steps = len(demos)
    if not demos.obs:
        raise fail("no observations (obs.<key> tensors)")
    if demos.actions.dtype != torch.float32 or demos.actions.dim() < 2:
        raise fail(f"actions must be float32 [T, *action_shape], got {_shape(demos.actions)}")
    if not bool(torch.isfinite(demos.actions).all()):
        raise fail(f"non-finite actions at steps {_bad_rows(demos.actions)}")
    for key, value in demos.obs.items():
        if value.shape[:1] != (steps,):
            raise fail(f"obs.{key} has {_shape(value)}, expected {steps} steps first")
        if key in _FLOAT_OBS and value.dtype != torch.float32:
            raise fail(f"obs.{key} must be float32, got {value.dtype}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise fail(f"non-finite obs.{key} at steps {_bad_rows(value)}")
    episode, success = demos.episode, demos.success
    if episode.dtype != torch.int64 or episode.shape != (steps,):
        raise fail(f"episode must be int64 [{steps}], got {_shape(episode)}")
    if success.dtype != torch.bool or success.dim() != 1:
        raise fail(f"success must be bool [episodes], got {_shape(success)}")
    if steps == 0:
        raise fail("no steps")
    steps_up = episode.diff()
    if int(episode[0]) != 0 or bool(((steps_up != 0) & (steps_up != 1)).any()):
        raise fail("episode indices must start at 0 and go up by 0 or 1 from step to step")
    if int(episode[-1]) + 1 != success.shape[0]:
        raise fail(f"{int(episode[-1]) + 1} episodes but {success.shape[0]} success flags")


def _shape(value: Tensor) -> str:
    return f"{value.dtype} {list(value.shape)}"


def _bad_rows(value: Tensor) -> list[int]:
    bad = ~torch.isfinite(value.reshape(value.shape[0], -1)).all(dim=1)
    return bad.nonzero().flatten()[:5].tolist()


# --- recording ---------------------------------------------------------------------------------


def record_demonstrations(
    stepper: EnvStepper,
    expert: Expert,
    episodes: int,
    seed: int,
    *,
    name: str,
    only_success: bool = False,
    max_steps: int = 100_000,
    observed: EnvStepper | None = None,
) -> Demonstrations:
    """``episodes`` whole episodes of ``expert`` acting on ``stepper``'s envs from a reset with
    ``seed`` (episodes still running when enough have ended are dropped; with
    ``only_success``, ``episodes`` successful ones, the others dropped). ``name`` is the
    expert's, stored with them. Gives up, saying so, after ``max_steps`` vector steps.

    ``observed``: the same envs observed otherwise (a camera where the expert reads the
    state), reset with the same seed and stepped with the same actions in lockstep; the
    demonstrations hold its observations, what the cloned policy will see. As ManiSkill's
    trajectory replay converts observation modes, this relies on the simulation being
    deterministic: every step's rewards and episode ends must agree between the two, or
    the recording stops naming the step where they parted.
    """
    obs = stepper.reset(seed)
    seen = obs if observed is None else observed.reset(seed)
    _same_envs(stepper, observed)
    running: list[list[tuple[EnvObs, Tensor]]] = [[] for _ in range(stepper.num_envs)]
    kept: list[tuple[list[tuple[EnvObs, Tensor]], bool]] = []
    steps = 0
    while len(kept) < episodes:
        if steps >= max_steps:
            raise RuntimeError(
                f"env {stepper.env_id}: {len(kept)} of {episodes} episodes kept after "
                f"{steps} steps of {name}"
                + (" (--only-success: does the expert succeed?)" if only_success else "")
            )
        with torch.no_grad():
            actions = expert(obs)  # stepped as the expert gave them, stored as float32
        result = stepper.step(actions, policy=name)
        steps += 1
        for row in range(stepper.num_envs):
            step = ({k: v[row].cpu() for k, v in seen.items()}, actions[row].float().cpu())
            running[row].append(step)
        if observed is not None:
            seen = _in_lockstep(result, observed.step(actions, policy=name), steps, stepper)
        else:
            seen = result.obs
        for row in result.dones.nonzero().flatten().tolist():
            success = stepper.last_success(row)
            if (success or not only_success) and len(kept) < episodes:
                kept.append((running[row], success))
            running[row] = []
        obs = result.obs
    rows = [step for steps_of, _ in kept for step in steps_of]
    return Demonstrations(
        obs={key: torch.stack([o[key] for o, _ in rows]) for key in rows[0][0]},
        actions=torch.stack([a for _, a in rows]),
        episode=torch.cat(
            [torch.full((len(s),), i, dtype=torch.int64) for i, (s, _) in enumerate(kept)]
        ),
        success=torch.tensor([success for _, success in kept], dtype=torch.bool),
        env_id=stepper.env_id,
        expert=name,
    )


def _same_envs(stepper: EnvStepper, observed: EnvStepper | None) -> None:
    if observed is not None and (observed.num_envs, observed.env_id) != (
        stepper.num_envs,
        stepper.env_id,
    ):
        raise ValueError(
            f"the observed envs ({observed.num_envs} × {observed.env_id}) must be the acting "
            f"ones ({stepper.num_envs} × {stepper.env_id}) observed otherwise"
        )


def _in_lockstep(acting: StepResult, seen: StepResult, step: int, stepper: EnvStepper) -> EnvObs:
    """``seen``'s observation, once its rewards and episode ends agree with ``acting``'s."""
    rewards_apart = (acting.rewards.cpu() - seen.rewards.cpu()).abs().max()
    if bool(rewards_apart > 1e-5) or not torch.equal(acting.dones.cpu(), seen.dones.cpu()):
        raise RuntimeError(
            f"env {stepper.env_id}: the observed envs parted from the acting ones at step "
            f"{step} (rewards apart by up to {float(rewards_apart):.3g}, episode ends "
            f"{acting.dones.tolist()} and {seen.dones.tolist()}): the simulation is not "
            "deterministic across observation modes, so record in the observed mode itself"
        )
    return seen.obs


def make_expert(spec: str, config: Config) -> tuple[Expert, str]:
    """The expert ``spec`` names (``metaworld`` or ``checkpoint:PATH``) for ``config``'s env,
    and its name."""
    if spec == "metaworld":
        return _metaworld_expert(config), f"metaworld scripted policy for {config.env.env_id}"
    if spec.startswith("checkpoint:"):
        from rlshell.evaluation.embodied import load_embodied_policy

        path = Path(spec.removeprefix("checkpoint:"))
        policy = load_embodied_policy(path, config)
        if policy.action_chunk != 1:
            raise ConfigError(
                [f"--expert {spec}: its policy acts in chunks; record with a one-action policy"]
            )

        def act(obs: EnvObs) -> Tensor:
            actions, _ = policy.predict_action_batch(obs, mode="eval", compute_values=False)
            return actions

        return act, f"{type(policy).__name__} of {path}"
    raise ConfigError(
        [f"--expert: 'metaworld' or 'checkpoint:PATH' (a run's checkpoint), got {spec!r}"]
    )


def _metaworld_expert(config: Config) -> Expert:
    env = config.env
    if env.env_type != "metaworld" or (env.obs_mode or "state") != "state":
        raise ConfigError(
            [
                "--expert metaworld: MetaWorld's scripted policies act on its 39-number state: "
                f"set env.env_type=metaworld and env.obs_mode=state (got {env.env_type!r}, "
                f"{env.obs_mode!r})"
            ]
        )
    from metaworld.policies import ENV_POLICY_MAP

    task = str(env.env_id).rsplit("/", 1)[-1]
    if task not in ENV_POLICY_MAP:
        raise ConfigError(
            [f"env.env_id: MetaWorld has no scripted policy for {task!r} (an MT1 task name)"]
        )
    scripted = ENV_POLICY_MAP[task]()  # type: ignore[abstract]  # each entry is concrete

    def act(obs: EnvObs) -> Tensor:
        states = obs["states"].cpu().numpy().astype(np.float64)
        return torch.from_numpy(np.stack([scripted.get_action(s) for s in states])).float()

    return act


def describe(demos: Demonstrations) -> str:
    """A few lines on what ``demos`` holds."""
    fields = ", ".join(f"{key} {_shape(value)}" for key, value in demos.obs.items())
    return (
        f"{len(demos)} steps of {demos.episodes} episodes of {demos.env_id} by {demos.expert}\n"
        f"success: {float(demos.success.float().mean()):.3f}\n"
        f"observations: {fields}\nactions: {_shape(demos.actions)}"
    )
