"""Rollout env steps/s on MetaWorld's reach-v3: the flow policy against the Gaussian MLP policy.

What PPO's rollout costs with ``flow_policy`` (configs/ppo_flow_metaworld_reach.py: Flow-SDE,
``num_steps`` 4, hidden 256,256, normalised states) at action chunks of 1 and 5, against the
same PPO's with ``mlp_policy`` (the baseline: gaussian, hidden 256,256, tanh, normalised
states; the MLP benchmarks/metaworld_ppo.py trains). The envs are the config's: MetaWorld
MT1 ``reach-v3`` from its 39-number state, 4 copies in this process, episodes of 100 steps.

- ``rollout``: one PPO window of ``--window`` env steps per env (100: one episode, the
  config's 20 policy steps × chunk 5) collected exactly as the PPO worker collects it
  (`rlshell.workers.embodied_update.collect_rollout`: ``predict_action_batch(mode="train")``
  with its chains recorded, `EnvStepper.step` with the policy's chunk, the reward scaler,
  the value bootstraps, the trajectory buffer), in env steps per second over the 4 envs.
  ``env_only`` is the same envs stepped with zero actions and no policy: what the envs
  alone cost, so ``policy_share_of_rollout`` is the part of a window the policy takes.
- ``policy_call``: ``predict_action_batch(mode="train", compute_values=True)`` alone on a
  fixed ``[4, 39]`` observation, no env: milliseconds per call and per env step (a call
  of a chunk-5 policy covers 5).

Every policy has envs of its own, built from the same config and seed. All run in this
one process at ``--threads`` torch threads (1 by default: the PPO run's actor, placed on
0.5 of a core, runs at one), in ``--repeats`` rounds; each round times every policy once,
in an order rotated round by round, so that other load on the machine falls on all alike.
Each figure is the median over the rounds, after one untimed warm-up window per policy.
Ratios are against the MLP: ``rollout_speed_vs_mlp`` is a policy's env steps/s over the
MLP's (below 1: slower), ``policy_call_time_vs_mlp`` its time per env step over the MLP's.

    .venv/bin/python benchmarks/flow_rollout.py [--quick] [--threads 1] [--repeats 10] \\
        [--window 100] [--calls 200] [--chunks 1 5]

Prints one JSON object. ``--quick`` is a smoke run (a 10-step window, one round, a few
calls; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlshell.config import Config, ModelConfig
    from rlshell.envs.stepper import EnvStepper
    from rlshell.models.base import BasePolicy

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ppo_flow_metaworld_reach.py"
BASELINE = "mlp"
ENV_ONLY = "env_only"
FULL = {"repeats": 10, "window": 100, "calls": 200}
QUICK = {"repeats": 1, "window": 10, "calls": 5}


def mlp_config(flow: ModelConfig) -> ModelConfig:
    """The Gaussian MLP on the flow's observation, actions and widths: the MLP
    benchmarks/metaworld_ppo.py trains."""
    from attrs import evolve

    kwargs = flow.model_kwargs
    return evolve(
        flow,
        model_type="mlp_policy",
        model_kwargs={
            **{key: kwargs[key] for key in ("obs_dim", "action_dim", "action_low", "action_high")},
            "action_type": "gaussian",
            "hidden_sizes": kwargs["hidden_sizes"],
            "activation": "tanh",
            "init_log_std": -0.5,
            "normalize_obs": kwargs["normalize_obs"],
        },
    )


def model_configs(config: Config, chunks: list[int]) -> dict[str, ModelConfig]:
    """The baseline MLP, then the config's flow policy at each chunk."""
    from attrs import evolve

    flow = config.actor.model
    configs = {BASELINE: mlp_config(flow)}
    for chunk in chunks:
        configs[f"flow_chunk{chunk}"] = evolve(
            flow, model_kwargs={**flow.model_kwargs, "action_chunk": chunk}
        )
    return configs


def build_policy(cfg: ModelConfig) -> BasePolicy:
    from rlshell.models import as_policy, get_model

    policy = as_policy(get_model(cfg), cfg)
    policy.eval()  # as the PPO worker's rollout runs it
    return policy


class Rollout:
    """One policy's envs and the observation to continue from; `window` times one PPO window."""

    def __init__(self, config: Config, policy: BasePolicy | None, window: int) -> None:
        from rlshell.envs.stepper import EnvStepper
        from rlshell.rollout.trajectory import RewardScaler

        chunk = 1 if policy is None else policy.action_chunk
        if window % chunk:
            raise SystemExit(f"--window {window}: not a multiple of the policy's chunk {chunk}")
        self.policy, self.chunk, self.window = policy, chunk, window
        self.stepper: EnvStepper = EnvStepper.from_config(config.env, config.runner.seed)
        self.obs = self.stepper.reset(config.runner.seed)
        self.num_envs = self.stepper.num_envs
        self.scaler = (
            RewardScaler(self.num_envs, config.algorithm.gamma)
            if config.algorithm.norm_reward
            else None
        )

    def run(self) -> float:
        """Seconds for one window of ``window`` env steps in every env."""
        import torch

        from rlshell.rollout.trajectory import TrajectoryBuffer
        from rlshell.workers.embodied_update import collect_rollout

        if self.policy is None:
            actions = torch.zeros(self.stepper.action_shape)
            began = time.perf_counter()
            for _ in range(self.window):
                self.stepper.step(actions)
            return time.perf_counter() - began
        buffer = TrajectoryBuffer(self.num_envs)
        began = time.perf_counter()
        self.obs = collect_rollout(
            self.policy, self.stepper, buffer, self.obs, self.window // self.chunk, self.scaler
        )
        return time.perf_counter() - began

    def close(self) -> None:
        self.stepper.close()


def rotated(names: list[str], round_: int) -> list[str]:
    shift = round_ % len(names)
    return names[shift:] + names[:shift]


def alternate(timers: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Each timer once per round, the order rotated round by round; seconds by name."""
    names = list(timers)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in rotated(names, round_):
            seconds[name].append(timers[name]())
    return seconds


def time_calls(policy: BasePolicy, obs: dict[str, Any], calls: int) -> Callable[[], float]:
    def timed() -> float:
        began = time.perf_counter()
        for _ in range(calls):
            policy.predict_action_batch(obs, mode="train", compute_values=True)
        return (time.perf_counter() - began) / calls

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the PPO run's actor's)"
    )
    parser.add_argument("--repeats", type=int, help=f"rounds (default {FULL['repeats']})")
    parser.add_argument(
        "--window", type=int, help=f"env steps per env in a window (default {FULL['window']})"
    )
    parser.add_argument(
        "--calls", type=int, help=f"policy calls per round, timed alone (default {FULL['calls']})"
    )
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 5], help="flow chunks")
    args = parser.parse_args()
    spec = dict(QUICK if args.quick else FULL)
    for key in spec:
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    for key, value in [*spec.items(), ("threads", args.threads)]:
        if value < 1:
            parser.error(f"--{key}: expected a positive number, got {value}")

    import torch

    from rlshell.api import load_config

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = load_config(CONFIG)
    configs = model_configs(config, args.chunks)
    policies = {name: build_policy(cfg) for name, cfg in configs.items()}
    rollouts = {name: Rollout(config, policy, spec["window"]) for name, policy in policies.items()}
    rollouts[ENV_ONLY] = Rollout(config, None, spec["window"])
    try:
        for rollout in rollouts.values():  # warm-up
            rollout.run()
        window_s = alternate(
            {name: rollout.run for name, rollout in rollouts.items()}, spec["repeats"]
        )
        obs = {"states": rollouts[BASELINE].obs["states"].clone()}
        call_s = alternate(
            {name: time_calls(p, obs, spec["calls"]) for name, p in policies.items()},
            spec["repeats"],
        )
    finally:
        for rollout in rollouts.values():
            rollout.close()

    num_envs = rollouts[BASELINE].num_envs
    env_steps = num_envs * spec["window"]
    rate = {name: env_steps / statistics.median(seconds) for name, seconds in window_s.items()}
    speeds = {
        name: {
            "env_steps_per_s": rate[name],
            "env_steps_per_s_by_round": [env_steps / s for s in seconds],
        }
        for name, seconds in window_s.items()
    }
    env_only_step_s = 1.0 / rate[ENV_ONLY]
    per_step_ms = {
        name: 1e3 * statistics.median(seconds) / policies[name].action_chunk
        for name, seconds in call_s.items()
    }
    calls = {
        name: {
            "ms_per_call": 1e3 * statistics.median(seconds),
            "ms_per_env_step": per_step_ms[name],
            "ms_per_call_by_round": [1e3 * s for s in seconds],
        }
        for name, seconds in call_s.items()
    }
    flows = [name for name in policies if name != BASELINE]
    report: dict[str, Any] = {
        "benchmark": "flow_rollout",
        "quick": args.quick,
        "task": f"{config.env.env_id}, {num_envs} envs, episodes of "
        f"{config.env.max_episode_steps} steps, from state",
        "config": str(CONFIG.relative_to(ROOT)),
        "threads": args.threads,
        "window_env_steps_per_env": spec["window"],
        "repeats": spec["repeats"],
        "calls_per_round": spec["calls"],
        "policies": {
            name: {
                "model_type": configs[name].model_type,
                "action_chunk": policy.action_chunk,
                "parameters": sum(p.numel() for p in policy.parameters()),
                "model_kwargs": dict(configs[name].model_kwargs),
            }
            for name, policy in policies.items()
        },
        "rollout": speeds,
        "rollout_speed_vs_mlp": {name: rate[name] / rate[BASELINE] for name in flows},
        "policy_share_of_rollout": {name: 1.0 - env_only_step_s * rate[name] for name in policies},
        "policy_call": calls,
        "policy_call_time_vs_mlp": {
            name: per_step_ms[name] / per_step_ms[BASELINE] for name in flows
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {name: version(name) for name in ("torch", "metaworld", "mujoco")},
        "load_average": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
