"""`EnvStepper`: what an env worker does each step, over one gymnasium VectorEnv.

The stepper turns the env's observations into the policy's ``env_obs`` dict,
checks the policy's actions before the env sees them, keeps the bootstrap
observation apart from the reset one, and counts episode statistics:

- ``env_obs``: ``{"states": float32 [N, state_dim]}`` for a Box observation
  (flattened); ``{"main_images": uint8 [N, H, W, C]}`` for an image Box
  (uint8, three dims, channels last); for a Dict observation (gymnasium-robotics
  Fetch: observation / achieved_goal / desired_goal) ``states`` concatenates
  its Box entries in sorted key order, an image entry becomes
  ``main_images`` (an entry named ``wrist_images``, a second camera, keeps
  its name) and a ``Text`` entry (the task in words)
  ``task_descriptions``, int32 code points ``[N, max_length]`` (`rlshell.envs.text`).
- The env resets a finished copy in the same step (gymnasium's ``SAME_STEP``
  autoreset, ManiSkill's vector wrapper): `StepResult.obs` is what the policy
  acts on next, `StepResult.next_obs` is sₜ₊₁ for the value bootstrap, the
  finished episode's final observation where it ended (see
  `rlcore.advantages.gae`).
- Numpy envs (gymnasium) and torch envs (ManiSkill, on the GPU) both work:
  tensors stay on the env's device, actions are handed over as numpy or as
  tensors accordingly.

Bad input stops at the step it happens, naming the env: actions of the wrong
shape, dtype or range (and the policy that produced them, when the caller
says which), a non-finite observation or reward (the env index and the env
step), and an exception inside the env's own ``step`` or ``reset``
(`EnvStepError`, chained to the env's exception and its traceback).

An env that fails (raises, runs past ``step_timeout_s``, loses its process,
returns a non-finite observation or reward) is handled as ``on_failure``
says (``env.on_failure``): ``"stop"`` raises as above; ``"reset"`` closes the
vector env, builds it anew, resets it and raises `EnvRestarted` holding the
new observation. The failed step has no result; its caller drops it and
treats the episodes in progress as truncated at the observation before it:
a rollout's last recorded step is then a truncation that bootstraps from
V(that observation), which is also what a window's last step does, so a
failure costs the episodes in progress their remaining length and adds no
transition that did not happen (`rlshell.workers.embodied_update.collect_rollout`,
`rlshell.workers.sac_update.collect_sac_steps`, and
`rlshell.workers.embodied_grpo.collect_group_episodes`, which collects the
window again). Those episodes are not counted in the episode metrics;
``env/failures`` counts the failures, and once ``max_consecutive_failures``
steps in a row have failed the next failure stops the run.

No Ray here: a Ray env worker wraps one `EnvStepper`.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np
import torch
from attrs import evolve, frozen
from jaxtyping import Bool, Float
from torch import Tensor

from rlshell.config import EnvConfig
from rlshell.envs.text import encode_texts
from rlshell.limits import CallTimeout, time_limit

if TYPE_CHECKING:
    from gymnasium import Space
    from gymnasium.vector import VectorEnv

__all__ = [
    "EnvObs",
    "EnvRestarted",
    "EnvStepError",
    "EnvStepper",
    "StepResult",
    "group_seeds",
]

EnvObs = dict[str, Tensor]
"""The policy's observation dict: ``"states"`` float32 ``[num_envs, state_dim]``
and/or ``"main_images"`` uint8 ``[num_envs, height, width, channels]``, and
``"task_descriptions"`` int32 code points ``[num_envs, max_length]`` when the
env states its task (`rlshell.envs.text.texts_of` reads them as strings)."""

_SUCCESS_KEYS = ("success", "is_success")
_FINAL_OBS_KEYS = ("final_obs", "final_observation")  # gymnasium 1.x, ManiSkill 3.0


class EnvStepError(RuntimeError):
    """The env itself raised in ``step`` or ``reset``; ``__cause__`` is its exception."""


class EnvRestarted(EnvStepError):
    """``on_failure='reset'``: a step failed, and the envs were rebuilt and reset.

    ``obs`` is the new episodes' first observation, what to act on next; the
    failed step has no result (see the module's docstring). A caller that
    cannot drop a step lets it propagate, and the run stops naming the failure.
    """

    def __init__(self, message: str, obs: EnvObs) -> None:
        super().__init__(message)
        self.obs = obs

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (to the driver) with its observation
        return (type(self), (str(self), self.obs))


@frozen(eq=False)
class StepResult:
    """One vector step: rows are envs.

    ``next_obs`` row i is the finished episode's final observation where
    episode i ended at this step (``terminated | truncated``), else the same
    as ``obs`` row i; rows of ``obs`` that ended hold the new episode's reset
    observation. Tensors may share storage with each other: do not write to them.
    """

    obs: EnvObs
    rewards: Float[Tensor, "num_envs"]
    terminated: Bool[Tensor, "num_envs"]
    truncated: Bool[Tensor, "num_envs"]
    next_obs: EnvObs

    @property
    def dones(self) -> Bool[Tensor, "num_envs"]:
        """Episodes that ended at this step, by termination or truncation."""
        return self.terminated | self.truncated

    def bootstrapped_at_done(self) -> StepResult:
        """This step with every ended episode counted as truncated, none as terminated.

        A value target then bootstraps from V(final observation) after a
        termination too (``algorithm.bootstrap_at_done='always'``, as
        ManiSkill's PPO and SAC baselines do): where an env terminates on
        success, the success state keeps its value instead of 0, so ending the
        episode early is not worth less than lingering before the goal.
        """
        return evolve(self, terminated=torch.zeros_like(self.terminated), truncated=self.dones)


def group_seeds(seed: int, num_envs: int, group_size: int = 1) -> list[int]:
    """Per-env reset seeds: equal within each block of ``group_size`` envs, distinct across blocks.

    Group g gets a seed drawn from ``SeedSequence([seed, g])``, so nearby base
    seeds (one per rollout) never hand the same seeds to different groups.
    """
    if group_size < 1 or num_envs % group_size != 0:
        raise ValueError(
            f"group_size must be a positive divisor of num_envs={num_envs}, got {group_size}"
        )
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed}")
    per_group = [
        int(np.random.SeedSequence([seed, g]).generate_state(1, dtype=np.uint32)[0])
        for g in range(num_envs // group_size)
    ]
    return [s for s in per_group for _ in range(group_size)]


class _ObsLayout:
    """How one observation space maps to ``env_obs`` keys (built once per stepper)."""

    def __init__(self, space: Space[Any], env_id: str) -> None:
        from gymnasium import spaces

        self.env_id = env_id
        self.state_paths: list[tuple[str, ...]] = []
        self.image_path: tuple[str, ...] | None = None
        self.wrist_path: tuple[str, ...] | None = None
        self.text_path: tuple[str, ...] | None = None
        self.text_width = 0
        leaves: list[tuple[tuple[str, ...], Space[Any]]] = []

        def collect(path: tuple[str, ...], sub: Space[Any]) -> None:
            if isinstance(sub, spaces.Dict):
                for key in sorted(sub.spaces):
                    collect((*path, key), sub.spaces[key])
            else:
                leaves.append((path, sub))

        collect((), space)
        for path, leaf in leaves:
            where = ".".join(path) or "observation"
            if isinstance(leaf, spaces.Text) and self.text_path is None:
                self.text_path, self.text_width = path, int(leaf.max_length)
                continue
            if not isinstance(leaf, spaces.Box):
                raise ValueError(
                    f"env {env_id}: {where} space {leaf} is not supported "
                    "(expected a Box, an image Box, one Text or a Dict of them)"
                )
            if leaf.dtype == np.uint8 and len(leaf.shape) == 3:
                if path[-1:] == ("wrist_images",) and self.wrist_path is None:
                    self.wrist_path = path
                    continue
                if self.image_path is not None:
                    raise ValueError(
                        f"env {env_id}: more than one image observation "
                        f"({'.'.join(self.image_path)}, {where}); main_images takes one"
                    )
                self.image_path = path
            else:
                self.state_paths.append(path)

    def convert(self, obs: Any, device: torch.device | None = None) -> EnvObs:
        """``env_obs`` for a batched observation (array, tensor or dict of them)."""
        out: EnvObs = {}
        if self.state_paths:
            flat = [_float_rows(_at(obs, p), device) for p in self.state_paths]
            out["states"] = flat[0] if len(flat) == 1 else torch.cat(flat, dim=1)
        if self.image_path is not None:
            out["main_images"] = _as_tensor(_at(obs, self.image_path), device)
        if self.wrist_path is not None:
            out["wrist_images"] = _as_tensor(_at(obs, self.wrist_path), device)
        if self.text_path is not None:
            out["task_descriptions"] = encode_texts(
                _at(obs, self.text_path), self.text_width, device
            )
        return out

    def check_finite(self, env_obs: EnvObs, what: str, step: int) -> None:
        states = env_obs.get("states")
        if states is not None and states.is_floating_point():
            _check_finite(states, f"{what} (states)", self.env_id, step)


def _at(obs: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obs = obs[key]
    return obs


def _as_tensor(value: Any, device: torch.device | None) -> Tensor:
    if isinstance(value, Tensor):
        return value if device is None else value.to(device)
    return torch.as_tensor(np.asarray(value), device=device)


def _as_numpy(value: Any) -> np.ndarray:
    """A host array of ``value`` (a tensor is copied off its device; a CPU tensor is viewed)."""
    if isinstance(value, Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


_TORCH_DTYPES = {np.float32: torch.float32, np.bool_: torch.bool}


def _per_env(
    value: Any, dtype: type[np.generic], device: torch.device
) -> tuple[Tensor, np.ndarray]:
    """One value per env as ``[N]`` of ``dtype``: the tensor on ``device`` and a host array of it.

    A numpy batch is cast by numpy and shared with the tensor (no copy); a tensor
    batch stays on its device and its host copy is what the bookkeeping reads.
    """
    if isinstance(value, Tensor):
        tensor = value.reshape(-1).to(device=device, dtype=_TORCH_DTYPES[dtype])
        return tensor, tensor.cpu().numpy()
    array = np.asarray(value, dtype=dtype).reshape(-1)
    return _from_host(array, device), array


def _from_host(array: np.ndarray, device: torch.device | None) -> Tensor:
    """A tensor sharing ``array``'s memory, moved to ``device`` unless that is the CPU."""
    tensor = torch.from_numpy(array)
    return tensor if device is None or device.type == "cpu" else tensor.to(device)


def _float_rows(value: Any, device: torch.device | None) -> Tensor:
    """A batched observation entry as float32 ``[N, features]``."""
    if isinstance(value, Tensor):
        tensor = value if device is None else value.to(device)
        return tensor.reshape(tensor.shape[0], -1).to(torch.float32)
    array = np.ascontiguousarray(value, dtype=np.float32)
    return _from_host(array.reshape(array.shape[0], -1), device)


def _stack(rows: Sequence[Any]) -> Any:
    """Single-env observations (arrays, tensors or dicts of them) stacked into a batch."""
    first = rows[0]
    if isinstance(first, Mapping):
        return {key: _stack([row[key] for row in rows]) for key in first}
    if isinstance(first, Tensor):
        return torch.stack(list(rows))
    return np.stack([np.asarray(row) for row in rows])


def _rows(mask: Tensor, like: Tensor) -> Tensor:
    """``mask`` ``[num_envs]`` shaped to broadcast over ``like``'s rows."""
    return mask.reshape(-1, *([1] * (like.dim() - 1))).to(like.device)


def _check_finite(values: Tensor | np.ndarray, what: str, env_id: str, step: int) -> None:
    """Raise FloatingPointError naming the env, the first bad row and the step (0: the reset)."""
    if isinstance(values, Tensor):
        # On a GPU: one reduction and one sync for the whole batch.
        if values.device.type != "cpu" and bool(torch.isfinite(values).all()):
            return
        # numpy's check is a third of torch's time on a small batch
        values = values.numpy() if values.device.type == "cpu" else values.cpu().numpy()
    finite = np.isfinite(values)
    if bool(finite.all()):
        return
    bad_rows = np.flatnonzero(~finite.reshape(values.shape[0], -1).all(axis=1)).tolist()
    when = "at reset" if step == 0 else f"at env step {step}"
    raise FloatingPointError(
        f"env {env_id}: {what} of env index {bad_rows[0]} is not finite {when} "
        f"({values[bad_rows[0]].tolist()}); bad env indices: {bad_rows}"
    )


def _flag(info: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-env success flag an info dict reports, and where it reports it (host arrays)."""
    for key in _SUCCESS_KEYS:
        if key in info:
            flag = _as_numpy(info[key]).reshape(-1) != 0
            mask = info.get(f"_{key}")
            reported = (
                np.ones_like(flag) if mask is None else _as_numpy(mask).reshape(-1).astype(bool)
            )
            return flag & reported, reported
    return None


class EnvStepper:
    """Steps one vector env for a policy: ``reset``, ``step``, ``pop_metrics``, ``close``.

    ``env`` must reset finished copies in the same step (the ``gymnasium`` and
    ``maniskill`` env types do), putting the final observation in
    ``info["final_obs"]`` (or ManiSkill 3.0's ``info["final_observation"]``).
    """

    def __init__(
        self,
        env: VectorEnv,
        env_id: str | None = None,
        *,
        on_failure: Literal["stop", "reset"] = "stop",
        rebuild: Callable[[int], VectorEnv] | None = None,
        step_timeout_s: float | None = None,
        max_consecutive_failures: int = 3,
    ) -> None:
        from gymnasium import spaces

        if on_failure not in ("stop", "reset"):
            raise ValueError(f"on_failure must be 'stop' or 'reset', got {on_failure!r}")
        if on_failure == "reset" and rebuild is None:
            raise ValueError("on_failure='reset' needs rebuild: a function seed -> the vector env")
        if max_consecutive_failures < 1:
            raise ValueError(
                f"max_consecutive_failures must be ≥ 1, got {max_consecutive_failures}"
            )
        self.on_failure = on_failure
        self.step_timeout_s = step_timeout_s
        self.max_consecutive_failures = max_consecutive_failures
        self._rebuild = rebuild
        self._failures = 0  # since the last pop_metrics
        self._failures_in_a_row = 0
        self._restarts = 0  # over the stepper's life: seeds each rebuild
        self._seed = 0  # of the last reset, with its group size
        self._group_size = 1
        self.env = env
        spec = getattr(env, "spec", None)
        self.env_id = env_id or getattr(spec, "id", None) or type(env).__name__
        self.num_envs = int(env.num_envs)
        mode = getattr(env, "metadata", {}).get("autoreset_mode")
        if mode is not None and getattr(mode, "value", mode) != "SameStep":
            raise ValueError(
                f"env {self.env_id}: autoreset mode {getattr(mode, 'value', mode)}; EnvStepper "
                "needs same-step autoreset (gymnasium.vector.AutoresetMode.SAME_STEP)"
            )
        self.action_space = env.single_action_space
        if not isinstance(
            self.action_space,
            spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary,
        ):
            raise ValueError(
                f"env {self.env_id}: action space {self.action_space} is not supported "
                "(expected Box, Discrete, MultiDiscrete or MultiBinary)"
            )
        self.action_shape = (self.num_envs, *(self.action_space.shape or ()))
        self._discrete = not isinstance(self.action_space, spaces.Box)
        self._bounds = self._discrete_bounds() if self._discrete else (0, 0)
        self._layout = _ObsLayout(env.single_observation_space, self.env_id)
        self._device: torch.device | None = None
        self._steps = 0  # vector steps since the last reset, for error messages
        self._torch_env = False
        # Episode bookkeeping on the host, in numpy, whatever the env's device: a few
        # numbers per env, where torch's per-op cost would exceed the env's own step.
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self._success_once = np.zeros(self.num_envs, dtype=np.bool_)
        self._last_success = np.zeros(self.num_envs, dtype=np.bool_)  # of the last episode
        self._reports_success = False
        self._finished: dict[str, list[float]] = {
            "return": [],
            "length": [],
            "success": [],
            "success_once": [],
        }

    @classmethod
    def from_config(cls, cfg: EnvConfig, seed: int = 0) -> Self:
        """A stepper over ``make_env(cfg, seed)``, failing as ``cfg.on_failure`` says."""
        from rlshell.envs import make_env

        env, timeout = make_env(cfg, seed), cfg.step_timeout_s
        if cfg.on_failure == "stop":
            return cls(env, cfg.env_id, step_timeout_s=timeout)
        return cls(
            env,
            cfg.env_id,
            on_failure="reset",
            rebuild=lambda new_seed: make_env(cfg, new_seed),
            step_timeout_s=timeout,
            max_consecutive_failures=cfg.max_consecutive_failures,
        )

    def reset(self, seed: int, group_size: int = 1) -> EnvObs:
        """Reset every env, with one seed per group of ``group_size`` consecutive envs.

        Envs in a group start from the same state (comparable episodes for
        group-normalized advantages); episodes in progress are dropped
        without being counted.
        """
        seeds = group_seeds(seed, self.num_envs, group_size)
        self._steps = 0
        self._seed, self._group_size = seed, group_size
        # Vector envs take one seed per env; gymnasium's VectorEnv annotation says only int.
        obs, _ = self._call(lambda: self.env.reset(seed=seeds), "in reset()")  # type: ignore[arg-type]
        first = obs
        while isinstance(first, Mapping):
            first = next(iter(first.values()))
        self._torch_env = isinstance(first, Tensor)
        self._device = first.device if isinstance(first, Tensor) else torch.device("cpu")
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._success_once[:] = False
        env_obs = self._layout.convert(obs, self._device)
        self._layout.check_finite(env_obs, "reset observation", 0)
        return env_obs

    def step(self, actions: Tensor, policy: str | None = None, chunk: int = 1) -> StepResult:
        """Apply ``actions`` ``[num_envs, *action_shape]`` to every env; with ``chunk`` > 1,
        a chunk of actions ``[num_envs, chunk, *action_shape]``, one env step each.

        ``policy`` names what produced the actions (a policy class), for the
        error a wrong shape, dtype or range raises. An exception inside the
        env's own step is raised again as `EnvStepError` naming the env and
        the env step (counted from the last reset), chained to the original.

        A chunk is one step of the policy (RLinf's ``chunk_step``): the result's
        reward is the sum of the env rewards of the chunk, undiscounted, and
        ``obs`` is the observation after its last action. An episode that ends
        inside the chunk ends the policy's step there (``terminated`` /
        ``truncated``, ``next_obs`` its final observation, the rewards after it
        not counted); the env has reset it and plays the chunk's remaining
        actions in the new episode, whose first observation the policy sees is
        the one after the chunk. Episodes whose length is a multiple of the
        chunk (ManiSkill's and MetaWorld's time limits with a chunk dividing
        them) never end inside one. An env failure inside a chunk fails the
        whole policy step (`EnvRestarted` as for a single step).
        """
        if chunk == 1:
            return self._step_once(actions, policy)
        if chunk < 1:
            raise ValueError(f"env {self.env_id}: chunk must be ≥ 1, got {chunk}")
        got = f"{policy} returned" if policy else "got"
        want = (self.num_envs, chunk, *self.action_shape[1:])
        if tuple(actions.shape) != want:
            raise ValueError(
                f"env {self.env_id}: {got} action chunks of shape {tuple(actions.shape)}, "
                f"expected {want} (num_envs, chunk, *single_action_space.shape)"
            )
        first = self._step_once(actions[:, 0], policy)
        rewards = first.rewards.clone()
        ended = first.dones.clone()
        terminated, truncated = first.terminated.clone(), first.truncated.clone()
        final = {key: value.clone() for key, value in first.next_obs.items()}
        result = first
        for k in range(1, chunk):
            result = self._step_once(actions[:, k], policy)
            live = ~ended
            rewards += torch.where(live, result.rewards, torch.zeros_like(result.rewards))
            newly = live & result.dones
            terminated |= newly & result.terminated
            truncated |= newly & result.truncated
            if bool(newly.any()):
                for key, value in final.items():
                    value[newly] = result.next_obs[key][newly].to(value.dtype)
            ended |= newly
        next_obs = {
            key: torch.where(_rows(ended, value), value, result.obs[key])
            for key, value in final.items()
        }
        return StepResult(
            obs=result.obs,
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            next_obs=next_obs,
        )

    def _step_once(self, actions: Tensor, policy: str | None) -> StepResult:
        device = self._device
        if device is None:
            raise RuntimeError(f"env {self.env_id}: call reset(seed) before step")
        env_actions = self._checked_actions(actions, policy)
        self._steps += 1
        try:
            raw_obs, raw_rewards, raw_terminated, raw_truncated, info = self._call(
                lambda: self.env.step(env_actions), f"at env step {self._steps}"
            )
            rewards, host_rewards = _per_env(raw_rewards, np.float32, device)
            terminated, host_terminated = _per_env(raw_terminated, np.bool_, device)
            truncated, host_truncated = _per_env(raw_truncated, np.bool_, device)
            obs = self._layout.convert(raw_obs, device)
            self._layout.check_finite(obs, "observation", self._steps)
            _check_finite(host_rewards, "reward", self.env_id, self._steps)
        except (EnvStepError, FloatingPointError) as failure:
            if self.on_failure == "stop":
                raise
            raise self._restart(failure) from failure
        self._failures_in_a_row = 0

        dones = host_terminated | host_truncated
        self._returns += host_rewards
        self._lengths += 1
        success = self._success_flags(info, dones)
        if success is not None:
            self._success_once |= success

        next_obs = obs
        if dones.any():
            rows = np.flatnonzero(dones)
            next_obs = self._with_final_obs(obs, info, rows)
            self._record_episodes(rows, success)
        return StepResult(
            obs=obs, rewards=rewards, terminated=terminated, truncated=truncated, next_obs=next_obs
        )

    def pop_metrics(self) -> dict[str, float]:
        """Means over the episodes finished since the last call, then forget them.

        ``env/episode_return``, ``env/episode_length`` and, when the env reports
        success, ``env/success`` (at the episode's last step) and
        ``env/success_once`` (at any step); ``env/episodes`` counts them.
        """
        finished = self._finished
        count = len(finished["return"])
        metrics = {"env/episodes": float(count)}
        if self.on_failure == "reset":
            metrics["env/failures"] = float(self._failures)
            self._failures = 0
        if count:
            metrics["env/episode_return"] = float(np.mean(finished["return"]))
            metrics["env/episode_length"] = float(np.mean(finished["length"]))
            if self._reports_success:
                metrics["env/success"] = float(np.mean(finished["success"]))
                metrics["env/success_once"] = float(np.mean(finished["success_once"]))
        for values in finished.values():
            values.clear()
        return metrics

    def last_success(self, env: int) -> bool:
        """Whether env ``env``'s last finished episode ended in success (false before any has
        ended, and where the env reports no success)."""
        return bool(self._last_success[env])

    @property
    def restarts(self) -> int:
        """How many times the envs were rebuilt after a failure (``on_failure='reset'``),
        over this stepper's life."""
        return self._restarts

    def close(self) -> None:
        """Close the env (and its simulator)."""
        self.env.close()

    def _call(self, call: Callable[[], Any], when: str) -> Any:
        """``call()`` (the env's step or reset) under ``step_timeout_s``; its exception as
        an `EnvStepError` naming the env and ``when``."""
        try:
            with time_limit(self.step_timeout_s, f"env {self.env_id} {when}"):
                return call()
        except CallTimeout as error:
            raise EnvStepError(
                f"env {self.env_id}: the env did not return {when} within "
                f"env.step_timeout_s={self.step_timeout_s:g} s"
            ) from error
        except Exception as error:
            raise EnvStepError(
                f"env {self.env_id}: the env raised {when}: {type(error).__name__}: {error}"
            ) from error

    def _restart(self, failure: Exception) -> EnvStepError:
        """After a failed step (``on_failure='reset'``): rebuild and reset the envs and return
        `EnvRestarted` to raise, or an `EnvStepError` past ``max_consecutive_failures``."""
        self._failures += 1
        self._failures_in_a_row += 1
        if self._failures_in_a_row > self.max_consecutive_failures:
            return EnvStepError(
                f"{failure} — {self._failures_in_a_row} env steps in a row failed, more than "
                f"env.max_consecutive_failures={self.max_consecutive_failures}; stopping"
            )
        print(
            f"env {self.env_id}: {failure}; rebuilding and resetting its "
            f"{self.num_envs} envs (env.on_failure='reset'), the episodes in progress end "
            "there\n" + "".join(traceback.format_exception(failure)),
            file=sys.stderr,
            flush=True,
        )
        self._close_failed()
        self._restarts += 1
        seed = int(
            np.random.SeedSequence([self._seed, self._restarts]).generate_state(1, np.uint32)[0]
        )
        rebuild = self._rebuild
        assert rebuild is not None  # checked in __init__ for on_failure='reset'
        try:
            env = rebuild(seed)
        except Exception as error:
            raise EnvStepError(
                f"{failure} — rebuilding the env after it failed raised "
                f"{type(error).__name__}: {error}"
            ) from error
        if int(env.num_envs) != self.num_envs:
            raise EnvStepError(
                f"env {self.env_id}: rebuilt with {env.num_envs} envs, was {self.num_envs}"
            )
        self.env = env
        obs = self.reset(seed, self._group_size)
        return EnvRestarted(
            f"{failure} — the envs were rebuilt and reset (env.on_failure='reset')", obs
        )

    def _close_failed(self) -> None:
        """Close the failed vector env, its processes killed (an `AsyncVectorEnv`'s may hang)."""
        from gymnasium.vector import AsyncVectorEnv
        from gymnasium.vector.async_vector_env import AsyncState

        try:
            with time_limit(self.step_timeout_s, f"env {self.env_id} close()"):
                if isinstance(self.env, AsyncVectorEnv):
                    # Its close would first wait for the step that failed (and raise again
                    # where a process died): the step is abandoned, as its own timeout does.
                    self.env._state = AsyncState.DEFAULT
                    self.env.close(terminate=True)
                else:
                    self.env.close()
        except Exception as error:  # the env is replaced either way; say why it did not close
            print(
                f"env {self.env_id}: closing the failed env raised {type(error).__name__}: {error}",
                file=sys.stderr,
                flush=True,
            )

    def _checked_actions(self, actions: Tensor, policy: str | None) -> Any:
        """``actions`` as the env takes them (a tensor on its device, or a numpy array), after
        checking their shape and, for a discrete space, their dtype and range."""
        got = f"{policy} returned" if policy else "got"
        if tuple(actions.shape) != self.action_shape:
            raise ValueError(
                f"env {self.env_id}: {got} actions of shape {tuple(actions.shape)}, expected "
                f"{self.action_shape} (num_envs, *single_action_space.shape)"
            )
        env_actions: Any = (
            actions.to(self._device) if self._torch_env else actions.detach().cpu().numpy()
        )
        if not self._discrete:
            return env_actions
        if actions.is_floating_point() or actions.is_complex():
            raise TypeError(
                f"env {self.env_id}: {self.action_space} takes integer actions, "
                f"{got} {actions.dtype}"
            )
        if self._torch_env:
            low, high = (int(v) for v in torch.aminmax(actions.to(torch.int64)))
        else:
            low, high = int(env_actions.min()), int(env_actions.max())
        space_low, space_high = self._bounds
        if low < space_low or high > space_high:
            raise ValueError(
                f"env {self.env_id}: actions must lie in [{space_low}, {space_high}] "
                f"for {self.action_space}, {got} values in [{low}, {high}]"
            )
        return env_actions

    def _discrete_bounds(self) -> tuple[int, int]:
        from gymnasium import spaces

        space = self.action_space
        if isinstance(space, spaces.Discrete):
            return int(space.start), int(space.start + space.n - 1)
        if isinstance(space, spaces.MultiDiscrete):
            return int(np.min(space.start)), int(np.max(space.start + space.nvec - 1))
        return 0, 1  # MultiBinary

    def _success_flags(self, info: Mapping[str, Any], dones: np.ndarray) -> np.ndarray | None:
        """Success at this step per env; an ended env's comes from its final step's info."""
        current = _flag(info)
        final_info = info.get("final_info")
        final = _flag(final_info) if isinstance(final_info, Mapping) else None
        if current is None and final is None:
            return None
        self._reports_success = True
        success = np.zeros(self.num_envs, dtype=np.bool_)
        if current is not None:
            # An ended env's current info describes its reset, not the step that ended it.
            success = current[0] & ~dones
        if final is not None:
            success = np.where(dones & final[1], final[0], success)
        return success

    def _with_final_obs(self, obs: EnvObs, info: Mapping[str, Any], rows: np.ndarray) -> EnvObs:
        final = next((info[key] for key in _FINAL_OBS_KEYS if key in info), None)
        if final is None:
            raise RuntimeError(
                f"env {self.env_id}: an episode ended but info has no 'final_obs'; build the "
                "env with same-step autoreset (gymnasium AutoresetMode.SAME_STEP)"
            )
        index = torch.from_numpy(rows).to(self._device)
        if isinstance(final, np.ndarray) and final.dtype == object:
            # gymnasium: one single-env observation per ended env, None elsewhere.
            final_rows = self._layout.convert(_stack([final[i] for i in rows]), self._device)
        else:
            # ManiSkill: the whole batch, read at the ended rows.
            final_rows = {
                key: value[index]
                for key, value in self._layout.convert(final, self._device).items()
            }
        self._layout.check_finite(final_rows, "final observation", self._steps)
        next_obs = {}
        for key, value in obs.items():
            merged = value.clone()
            merged[index] = final_rows[key].to(merged.dtype)
            next_obs[key] = merged
        return next_obs

    def _record_episodes(self, rows: np.ndarray, success: np.ndarray | None) -> None:
        finished = self._finished
        finished["return"].extend(self._returns[rows].tolist())
        finished["length"].extend(self._lengths[rows].tolist())
        if self._reports_success:
            at_end = success[rows] if success is not None else np.zeros(len(rows), np.bool_)
            self._last_success[rows] = at_end
            finished["success"].extend(at_end.astype(np.float64).tolist())
            finished["success_once"].extend(self._success_once[rows].astype(np.float64).tolist())
        self._returns[rows] = 0.0
        self._lengths[rows] = 0
        self._success_once[rows] = False
