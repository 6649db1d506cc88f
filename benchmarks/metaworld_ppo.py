"""PPO on MetaWorld's reach-v3 to a success rate: rlstack's runner against Stable-Baselines3.

The task is configs/ppo_flow_metaworld_reach.py's envs: MetaWorld MT1 ``reach-v3`` from
its 39-number state, 4 copies in one process, episodes cut at 100 steps, a new goal at
every reset. Both sides train a Gaussian MLP from scratch:

- rlstack: configs/ppo_flow_metaworld_reach.py with its policy replaced by ``mlp_policy``
  through the config API (`rlshell.api.load_config` with `MLP_OVERRIDES`: gaussian,
  hidden 256,256 as the flow's, tanh, log σ₀ −0.5 and states normalised by running
  statistics as configs/ppo_pushcube_cpu.py's MLP, lr 3e-4 as the config says for a start
  from scratch, 100 steps per env per update so that an update sees the flow's 400 env
  steps). The rest is the config's: configs/ppo_pushcube_cpu.py's PPO (γ 0.8, λ 0.9,
  8 epochs of 4 minibatches stopped at an approximate KL of 0.1, clip 0.2, gradient norm
  0.5, no entropy bonus), rewards scaled by the running return's spread, time limits
  bootstrapped. Run as ``python -m rlshell.train`` runs it: one Ray worker that is env,
  rollout and actor (`rlshell.workers.embodied_actor.EmbodiedWorker`), one call per
  rollout-and-update step, the next queued while one runs
  (`rlshell.runners.embodied_ppo.train_steps`); no checkpoints.
- Stable-Baselines3 (the baseline): ``PPO("MlpPolicy")`` with rl-baselines3-zoo's tuned
  settings for MuJoCo's Reacher (`SB3_SETTINGS`, hyperparams/ppo.yml: the zoo has no
  MetaWorld entry, and Reacher, an arm sent to a random goal for a dense distance
  reward, is the closest task it tuned), under ``VecNormalize`` (observations and rewards,
  the zoo's ``normalize: true``), on a ``DummyVecEnv`` of the very gymnasium envs
  rlstack's env type builds (`rlshell.envs.make_env`'s copies, seeded by SB3), in this
  process. The zoo's 512 steps of one env per rollout become 128 steps of each of the 4.

"Reached" means the mean of success-once (MetaWorld's ``info["success"]`` at any step of
an episode) over the last ``--window`` finished episodes first reached ``--target``.
rlstack: each update's ``env/success_once`` and ``env/episodes``; with ``--window`` a
multiple of the 4 episodes an update finishes the window is exact (otherwise a cut
update's failures stay in it: a cautious reading). SB3: a callback reads every env's
``info["success"]`` at every step. The clock starts at the first env step (envs and
model built: start-up is reported apart) and stops after the update that follows the
episode that reached it; ``env_steps`` counts the env steps up to that episode
(rlstack: to the end of its update's rollout), ``env_steps_run`` those taken in the
timed span (SB3 finishes the rollout the episode ended in). A side that does not reach it within
``--budget`` env steps reports ``reached: false``, its time for the budget and its best
window. ``--seeds`` seeds on each side, one run at a time, SB3 then rlstack for each
seed, on the same cores with the same torch threads: rlstack's worker is placed on half
a core, which `rlshell.cluster.worker_base` turns into one torch thread, and SB3's
process is set to the same. One Ray cluster serves every rlstack seed (its start is
reported apart); its daemons idle while SB3 runs.

Reported for each side: per seed, and over the seeds that reached the target the mean,
standard deviation, minimum and maximum of wall time and env steps; env steps per second
over every run (``env_steps_run`` over ``wall_s``, reached or not: the pace alone);
``rlstack_over_sb3_wall``, mean wall time over mean wall time when every seed on both
sides reached the target, and ``rlstack_over_sb3_env_steps_per_s``. No target is asserted.

    .venv/bin/python benchmarks/metaworld_ppo.py [--quick] [--seeds 3] [--budget 500000] \\
        [--window 20] [--target 0.9] [--sides rlstack sb3] [key=value ...]

``key=value``: overrides of rlstack's config after `MLP_OVERRIDES` (``actor.compile=true``).
Prints one JSON object; ``--quick`` is a smoke run (one seed, 1,024 env steps, a target
of 0 over 4 episodes, so that the reached path runs; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.config import Config

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ppo_flow_metaworld_reach.py"
SIDES = ("rlstack", "sb3")
BUDGET = 500_000
WINDOW = 20  # finished episodes: 5 updates of 4
TARGET = 0.9
SEEDS = 3
QUICK = {"seeds": 1, "budget": 1024, "window": 4, "target": 0.0}

# rl-baselines3-zoo, hyperparams/ppo.yml, "Reacher" (tuned; one env × 512 steps a rollout,
# which here is 4 envs × 128). Its policy is SB3's default: 64×64 tanh, log σ₀ 0.
SB3_SETTINGS: dict[str, Any] = {
    "n_steps": 128,
    "batch_size": 32,
    "gamma": 0.9,
    "learning_rate": 0.000104019,
    "ent_coef": 7.52585e-08,
    "clip_range": 0.3,
    "n_epochs": 5,
    "gae_lambda": 1.0,
    "max_grad_norm": 0.9,
    "vf_coef": 0.950368,
}


def mlp_overrides(flow: Config) -> list[str]:
    """The flow config turned into the Gaussian MLP's (see the module docstring)."""
    kwargs = flow.actor.model.model_kwargs
    chunk = int(kwargs.get("action_chunk", 1))
    mlp = {
        **{key: kwargs[key] for key in ("obs_dim", "action_dim", "action_low", "action_high")},
        "action_type": "gaussian",
        "hidden_sizes": kwargs["hidden_sizes"],
        "activation": "tanh",
        "init_log_std": -0.5,
        "normalize_obs": kwargs["normalize_obs"],
    }
    return [
        "actor.model.model_type=mlp_policy",
        f"actor.model.model_kwargs={json.dumps(mlp)}",
        "actor.optim.lr=3e-4",
        # One action a policy step where the flow plays `chunk`: the same env steps an update.
        f"runner.rollout_steps={flow.runner.rollout_steps * chunk}",
        "runner.experiment_name=ppo_mlp_metaworld_reach",
    ]


def rlstack_overrides(extra: list[str]) -> list[str]:
    from rlshell.api import load_config

    return [*mlp_overrides(load_config(CONFIG, for_run=False)), *extra]


class SuccessWindow:
    """Success-once of the last ``size`` finished episodes; whether their mean is at ``target``."""

    def __init__(self, size: int, target: float) -> None:
        self.episodes: deque[float] = deque(maxlen=size)
        self.target = target
        self.finished = 0
        self.best: float | None = None

    def add(self, successes: Iterable[float]) -> bool:
        """Episodes finished in order; whether the full window is now at the target."""
        reached = False
        for success in successes:
            self.episodes.append(success)
            self.finished += 1
            if len(self.episodes) == self.episodes.maxlen:
                mean = statistics.fmean(self.episodes)
                self.best = mean if self.best is None else max(self.best, mean)
                reached = reached or mean >= self.target
        return reached

    def add_update(self, metrics: dict[str, float]) -> bool:
        """An update's episodes from its mean success-once and count (failures last)."""
        count = round(metrics.get("env/episodes", 0.0))
        successes = round(metrics.get("env/success_once", 0.0) * count)
        return self.add([1.0] * successes + [0.0] * (count - successes))


def run_rlstack(
    cluster: Cluster, seed: int, overrides: list[str], budget: int, window: SuccessWindow
) -> dict[str, Any]:
    from rlshell.api import load_config
    from rlshell.runners.embodied_ppo import train_steps
    from rlshell.runners.spec import resolve_spec
    from rlshell.runners.validation import plan_for
    from rlshell.workers.embodied_actor import EmbodiedWorker

    config = load_config(CONFIG, [*overrides, f"runner.seed={seed}"])
    started = time.perf_counter()
    plan = plan_for(config, cluster.spec())
    critic = resolve_spec(config).critic
    group = EmbodiedWorker.create_group(config, critic).launch(cluster, plan.component("actor"))
    try:
        group.init_worker().wait()
        startup = time.perf_counter() - started
        per_update = config.env.num_envs * config.runner.rollout_steps
        steps = train_steps(group, -(-budget // per_update))
        first = time.perf_counter()
        env_steps = 0
        for metrics in steps:
            env_steps += int(metrics["env/steps"])
            if window.add_update(metrics):
                wall = time.perf_counter() - first
                return outcome(True, wall, env_steps, env_steps, startup, window)
        wall = time.perf_counter() - first
        return outcome(False, wall, env_steps, env_steps, startup, window)
    finally:
        group.shutdown()


def rlstack_threads(cluster: Cluster, overrides: list[str]) -> int:
    """The torch threads rlstack's worker runs at (`rlshell.cluster.worker_base`'s rule)."""
    from rlshell.api import load_config
    from rlshell.runners.validation import plan_for

    plan = plan_for(load_config(CONFIG, overrides), cluster.spec())
    return max(1, int(plan.component("actor").workers[0].cpus))


def run_sb3(seed: int, budget: int, window: SuccessWindow, threads: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from gymnasium.vector import SyncVectorEnv
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from rlshell.api import load_config
    from rlshell.envs import make_env

    torch.set_num_threads(threads)
    started = time.perf_counter()
    vector = make_env(load_config(CONFIG, for_run=False).env, seed)
    if not isinstance(vector, SyncVectorEnv):
        raise TypeError(f"expected the metaworld env type's SyncVectorEnv, got {type(vector)}")
    copies: list[Callable[[], Any]] = [
        functools.partial(lambda env: env, env) for env in vector.envs
    ]
    env = VecNormalize(DummyVecEnv(copies), gamma=SB3_SETTINGS["gamma"])
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **SB3_SETTINGS)
    startup = time.perf_counter() - started

    class Watch(BaseCallback):
        """Success-once per episode into ``window``; stops after the update that reached it."""

        def __init__(self) -> None:
            super().__init__()
            self.success_once = np.zeros(env.num_envs, dtype=bool)
            self.first: float | None = None
            self.reached_at: int | None = None  # env steps
            self.stopped: tuple[float, int] | None = None  # time, env steps run

        def _on_rollout_start(self) -> None:
            now = time.perf_counter()
            if self.first is None:
                self.first = now
            if self.reached_at is not None and self.stopped is None:
                # The update after the rollout that reached it has run.
                self.stopped = (now, int(self.num_timesteps))

        def _on_step(self) -> bool:
            if self.stopped is not None:
                return False
            infos, dones = self.locals["infos"], self.locals["dones"]
            for i, info in enumerate(infos):
                self.success_once[i] |= float(info.get("success", 0.0)) > 0
                if dones[i]:
                    reached = window.add([float(self.success_once[i])])
                    self.success_once[i] = False
                    if reached and self.reached_at is None:
                        self.reached_at = int(self.num_timesteps)
            return True

    watch = Watch()
    model.learn(total_timesteps=budget, callback=watch)
    ended = time.perf_counter()
    assert watch.first is not None
    ran = int(model.num_timesteps)
    if watch.reached_at is None:
        return outcome(False, ended - watch.first, ran, ran, startup, window)
    stopped, ran = watch.stopped if watch.stopped is not None else (ended, ran)  # or the budget
    return outcome(True, stopped - watch.first, watch.reached_at, ran, startup, window)


def outcome(
    reached: bool,
    wall_s: float,
    env_steps: int,
    env_steps_run: int,
    startup_s: float,
    window: SuccessWindow,
) -> dict[str, Any]:
    """One run: ``env_steps`` to the target (or all, unreached), ``env_steps_run`` in ``wall_s``."""
    return {
        "reached": reached,
        "wall_s": wall_s,
        "env_steps": env_steps,
        "env_steps_run": env_steps_run,
        "episodes": window.finished,
        "best_window_mean": window.best,
        "startup_s": startup_s,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def over_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Spread of wall time and env steps over the seeds that reached the target."""
    reached = [run for run in runs if run["reached"]]
    return {
        "seeds_reached": len(reached),
        "seeds": len(runs),
        "wall_s": spread([run["wall_s"] for run in reached]) if reached else None,
        "env_steps": spread([run["env_steps"] for run in reached]) if reached else None,
        # Throughput over every run, reached or not: the pace apart from what it reached.
        "env_steps_per_s": sum(run["env_steps_run"] for run in runs)
        / sum(run["wall_s"] for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of rlstack's config")
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="seeds 0..N-1 on each side")
    parser.add_argument("--budget", type=int, default=BUDGET, help="env steps a run may take")
    parser.add_argument("--window", type=int, default=WINDOW, help="finished episodes averaged")
    parser.add_argument("--target", type=float, default=TARGET, help="success-once to reach")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    for key in ("seeds", "budget", "window"):
        if getattr(args, key) < 1:
            parser.error(f"--{key}: expected a positive number, got {getattr(args, key)}")
    if not 0.0 <= args.target <= 1.0:
        parser.error(f"--target: a success rate in [0, 1], got {args.target}")
    os.environ.setdefault("RAY_worker_niceness", "0")  # as this process: the same priority
    started = time.perf_counter()
    overrides = rlstack_overrides(args.overrides)
    seeds = list(range(args.seeds))
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
    from rlshell.cluster.ray_cluster import Cluster

    temp_dir = tempfile.mkdtemp(prefix="rb", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
    cluster_started = time.perf_counter()
    with Cluster(num_cpus=2, temp_dir=temp_dir) as cluster:
        cluster_s = time.perf_counter() - cluster_started
        threads = rlstack_threads(cluster, overrides)
        for seed in seeds:
            if "sb3" in results:
                window = SuccessWindow(args.window, args.target)
                run = run_sb3(seed, args.budget, window, threads)
                results["sb3"].append({"seed": seed, **run})
            if "rlstack" in results:
                window = SuccessWindow(args.window, args.target)
                run = run_rlstack(cluster, seed, overrides, args.budget, window)
                results["rlstack"].append({"seed": seed, **run})

    summary = {side: over_seeds(runs) for side, runs in results.items()}
    every = all(s["seeds_reached"] == s["seeds"] for s in summary.values())
    ratio = None
    if every and set(summary) == set(SIDES):
        ratio = summary["rlstack"]["wall_s"]["mean"] / summary["sb3"]["wall_s"]["mean"]
    pace = None
    if set(summary) == set(SIDES):
        pace = summary["rlstack"]["env_steps_per_s"] / summary["sb3"]["env_steps_per_s"]
    report = {
        "benchmark": "metaworld_ppo",
        "quick": args.quick,
        "task": "MetaWorld reach-v3 from state, 4 envs, episodes of 100 steps: success-once "
        f"over the last {args.window} finished episodes ≥ {args.target}, within "
        f"{args.budget} env steps",
        "rlstack": {"config": str(CONFIG.relative_to(ROOT)), "overrides": overrides},
        "sb3": {
            "settings": "rl-baselines3-zoo Reacher (4 envs × 128 steps), VecNormalize",
            **SB3_SETTINGS,
        },
        "torch_threads": threads,
        "seeds": seeds,
        "results": results,
        "over_seeds": summary,
        "rlstack_over_sb3_wall": ratio,
        "rlstack_over_sb3_env_steps_per_s": pace,
        "ray_cluster_start_s": cluster_s,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {
            name: version(name) for name in ("torch", "stable_baselines3", "metaworld", "mujoco")
        },
        "load_average": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
