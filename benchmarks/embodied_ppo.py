"""PPO on CartPole-v1 to a mean return of 475: rlstack's embodied runner against Stable-Baselines3.

Both sides use rl-zoo's CartPole-v1 hyperparameters (8 envs, 32 steps per
env per rollout, one 256-sample batch, 20 epochs, λ 0.8, γ 0.98, clip 0.2,
lr 1e-3 decaying linearly over 100,000 steps, gradient norm 0.5, entropy 0):

- rlstack: `rlshell.workers.embodied_actor.EmbodiedWorker` from
  ``configs/ppo_cartpole.py`` (one Ray worker that is env, rollout and actor;
  one Ray call per rollout-and-update step, the next queued while one runs, as
  ``python -m rlshell.train`` does: `rlshell.runners.embodied_ppo.train_steps`);
- Stable-Baselines3 (the baseline): ``PPO("MlpPolicy", make_vec_env(...))``
  with the same settings and a 64×64 tanh MLP as rlstack's ``mlp_policy``,
  in this process (``DummyVecEnv``).

"Reached" means the mean of the last five rollouts' finished-episode mean
returns is ≥ 475 (SB3: its ``ep_info_buffer`` read after each rollout, the
same window). The clock starts at the first env step (workers up and the
model built: start-up is reported apart) and stops after the update that
reached it. One torch thread per process. rlstack runs with ``actor.compile``
and ``rollout.compile`` (its PPO step and its per-env-step policy call
compiled at worker start-up, which ``startup_s`` includes; one Ray cluster
serves every seed, its start reported apart); ``--no-compile`` runs both
eager. ``--seeds`` seeds each, 10 by default (the issue asks for at
least 3: the env steps a seed needs vary about 3×, which a median of 3
barely damps). Target (reported, not asserted): rlstack's median wall time
≤ 0.5× SB3's. Prints one JSON object; ``--quick`` is a smoke run (one seed,
a few thousand steps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlshell.cluster.ray_cluster import Cluster


ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "ppo_cartpole.py"
TARGET_RETURN = 475.0
WINDOW = 5  # rollouts averaged
TIME_TARGET = 0.5  # rlstack wall time ≤ 0.5× SB3's
TOTAL_STEPS = 100_000
# Seeds per side. How many env steps a seed needs to reach 475 varies about 3x (9k-49k for
# SB3 over 40 seeds here) and a median of 3 moves with it; 10 keep the ratio steadier.
SEEDS = 10


def run_rlstack(cluster: Cluster, seed: int, max_env_steps: int, compile_: bool) -> dict[str, Any]:
    from rlshell.runners.embodied_ppo import train_steps
    from rlshell.runners.spec import resolve_spec
    from rlshell.runners.validation import load_config, plan_for
    from rlshell.workers.embodied_actor import EmbodiedWorker

    config = load_config(
        CONFIG,
        [f"runner.seed={seed}", f"actor.compile={compile_}", f"rollout.compile={compile_}"],
    )
    started = time.perf_counter()
    plan = plan_for(config, cluster.spec())
    critic = resolve_spec(config).critic
    group = EmbodiedWorker.create_group(config, critic).launch(cluster, plan.component("actor"))
    try:
        group.init_worker().wait()
        startup = time.perf_counter() - started
        # As `python -m rlshell.train` runs them: the next step queued while one runs.
        steps = train_steps(group, max_env_steps // config.env.num_envs + 1)
        return _loop(lambda: next(steps), max_env_steps, startup)
    finally:
        group.shutdown()


def sb3_settings() -> dict[str, Any]:
    """SB3's PPO arguments, read from ``configs/ppo_cartpole.py`` so the two sides cannot drift."""
    import torch

    from rlshell.runners.validation import load_config

    config = load_config(CONFIG, [])
    algorithm, optim = config.algorithm, config.actor.optim
    kwargs = config.actor.model.model_kwargs
    samples = config.env.num_envs * config.runner.rollout_steps
    lr = optim.lr
    hidden = [int(size) for size in str(kwargs.get("hidden_sizes", "64,64")).split(",")]
    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[
        str(kwargs.get("activation", "tanh"))
    ]
    if optim.lr_scheduler not in ("constant", "linear") or optim.lr_warmup_steps:
        raise ValueError(f"no SB3 equivalent of lr_scheduler {optim.lr_scheduler!r} with warm-up")
    return {
        "n_envs": config.env.num_envs,
        "n_steps": config.runner.rollout_steps,
        "batch_size": samples // algorithm.num_minibatches,
        "n_epochs": algorithm.ppo_epochs,
        "gae_lambda": algorithm.lam,
        "gamma": algorithm.gamma,
        "clip_range": algorithm.clip_low if algorithm.clip_low is not None else 0.2,
        "ent_coef": algorithm.entropy_coef,
        # rlcore's value loss is ½ (V − R)², SB3's the plain squared error: half the coefficient.
        "vf_coef": algorithm.vf_coef / 2,
        "normalize_advantage": algorithm.norm_adv,
        # SB3 passes the remaining fraction of training, 1 → 0.
        "learning_rate": (lambda progress: lr * progress) if optim.lr_scheduler == "linear" else lr,
        "max_grad_norm": optim.clip_grad if optim.clip_grad is not None else float("inf"),
        "policy_kwargs": {"net_arch": hidden, "activation_fn": activation},
    }


def run_sb3(seed: int, max_env_steps: int) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    started = time.perf_counter()
    settings = sb3_settings()
    env = make_vec_env("CartPole-v1", n_envs=settings.pop("n_envs"), seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **settings)
    startup = time.perf_counter() - started

    class Watch(BaseCallback):
        """Per-rollout mean of the episodes that finished in it; stops once the window is there."""

        def __init__(self) -> None:
            super().__init__()
            self.recent: deque[float] = deque(maxlen=WINDOW)
            self.rollout: list[float] = []
            self.first_step: float | None = None
            self.reached_at: int | None = None
            self.reached: dict[str, float] | None = None

        def _on_step(self) -> bool:
            if self.first_step is None:
                self.first_step = time.perf_counter()
            if self.reached_at is not None:  # the update after the rollout that reached it ran
                self.reached = {"steps": float(self.reached_at), "time": time.perf_counter()}
                return False
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.rollout.append(float(info["episode"]["r"]))
            return True

        def _on_rollout_end(self) -> None:
            if self.rollout:
                self.recent.append(statistics.fmean(self.rollout))
                self.rollout = []
            if len(self.recent) == WINDOW and statistics.fmean(self.recent) >= TARGET_RETURN:
                self.reached_at = int(self.num_timesteps)

    watch = Watch()
    model.learn(total_timesteps=max_env_steps, callback=watch)
    assert watch.first_step is not None
    if watch.reached is None:
        return {"reached": False, "startup_s": startup, "env_steps": model.num_timesteps}
    return {
        "reached": True,
        "wall_s": watch.reached["time"] - watch.first_step,
        "env_steps": int(watch.reached["steps"]),
        "startup_s": startup,
    }


def _loop(step: Any, max_env_steps: int, startup: float) -> dict[str, Any]:
    recent: deque[float] = deque(maxlen=WINDOW)
    first = time.perf_counter()
    env_steps = 0
    while env_steps < max_env_steps:
        metrics = step()
        env_steps += int(metrics["env/steps"])
        if "env/episode_return" in metrics:
            recent.append(metrics["env/episode_return"])
        if len(recent) == WINDOW and statistics.fmean(recent) >= TARGET_RETURN:
            return {
                "reached": True,
                "wall_s": time.perf_counter() - first,
                "env_steps": env_steps,
                "startup_s": startup,
            }
    return {"reached": False, "env_steps": env_steps, "startup_s": startup}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, a few thousand steps")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rlstack with actor.compile and rollout.compile (compiled at start-up; the default)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=SEEDS,
        help=f"seeds 0..N-1 on each side (default {SEEDS}; the issue's floor is 3)",
    )
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds: expected a positive number, got {args.seeds}")
    os.environ.setdefault("RAY_worker_niceness", "0")
    seeds = [0] if args.quick else list(range(args.seeds))
    budget = 4096 if args.quick else TOTAL_STEPS
    started = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {"rlstack": [], "sb3": []}
    from rlshell.cluster.ray_cluster import Cluster

    temp_dir = tempfile.mkdtemp(prefix="rb", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
    cluster_started = time.perf_counter()
    with Cluster(num_cpus=2, temp_dir=temp_dir) as cluster:
        cluster_s = time.perf_counter() - cluster_started
        for seed in seeds:
            results["sb3"].append({"seed": seed, **run_sb3(seed, budget)})
            run = run_rlstack(cluster, seed, budget, args.compile)
            results["rlstack"].append({"seed": seed, **run})

    def reached(side: str, key: str) -> list[float] | None:
        values = [r[key] for r in results[side] if r.get("reached")]
        return values if len(values) == len(seeds) else None

    def median(side: str, key: str) -> float | None:
        values = reached(side, key)
        return statistics.median(values) if values is not None else None

    rl_wall, sb3_wall = median("rlstack", "wall_s"), median("sb3", "wall_s")
    ratio = rl_wall / sb3_wall if rl_wall is not None and sb3_wall else None
    rates: dict[str, float | None] = {}
    for side in ("rlstack", "sb3"):
        steps, walls = reached(side, "env_steps"), reached(side, "wall_s")
        rates[side] = sum(steps) / sum(walls) if steps is not None and walls else None
    import stable_baselines3

    print(
        json.dumps(
            {
                "benchmark": "embodied_ppo",
                "quick": args.quick,
                "task": f"CartPole-v1 to a mean return of {TARGET_RETURN} over {WINDOW} rollouts",
                "settings": "rl-zoo: 8 envs x 32 steps, batch 256, 20 epochs, lambda 0.8, "
                "gamma 0.98, clip 0.2, lr 1e-3 linear, max_grad_norm 0.5",
                "sb3": stable_baselines3.__version__,
                "rlstack_compile": args.compile,
                "seeds": seeds,
                "results": results,
                "median_wall_s": {"rlstack": rl_wall, "sb3": sb3_wall},
                "median_env_steps": {
                    "rlstack": median("rlstack", "env_steps"),
                    "sb3": median("sb3", "env_steps"),
                },
                "env_steps_per_s": rates,
                "ray_cluster_start_s": cluster_s,
                "rlstack_over_sb3_wall": ratio,
                "target": {"rlstack_over_sb3_wall_at_most": TIME_TARGET},
                "met": ratio is not None and ratio <= TIME_TARGET,
                "wall_s": time.perf_counter() - started,
                "load_average": os.getloadavg(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
