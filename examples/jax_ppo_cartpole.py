"""PPO on CartPole-v1 in JAX: a Flax actor-critic, optax, and rlcore.jax's GAE and losses.

A custom trainer on the JAX twins of rlcore, in one process and one screen of
loop. The maths (the categorical's log-probabilities and entropy, GAE, the
clipped surrogate, the value loss, the entropy bonus, advantage whitening)
comes from `rlcore.jax`; the network is a Flax NNX module, the optimizer
optax, the env gymnasium's vector CartPole. Each iteration is

    8 envs × 32 steps with a jitted sampling step → one jitted update:
    values, GAE, then 20 epochs of PPO on the 256 samples (lax.scan)

The env resets a finished copy in the same step (gymnasium's ``SAME_STEP``
autoreset), so a step that ended an episode has two observations: the reset
one the policy acts on next, and the final one in ``info["final_obs"]``.
The final one is kept as ``next_obs``: a truncated step (500 steps reached)
bootstraps from V(final observation), a terminated one (the pole fell) from
nothing, which is what `rlcore.jax.advantages.gae` does with ``next_values``,
``terminated`` and ``truncated``.

Hyperparameters are rl-zoo's for CartPole-v1 (as in ``configs/ppo_cartpole.py``):
8 envs × 32 steps, one 256-sample batch, 20 epochs, γ 0.98, λ 0.8, clip 0.2,
entropy 0, lr 1e-3 decaying linearly to 0 over 100,000 steps, gradient norm
0.5, a 64×64 tanh MLP for the actor and one for the critic. Training stops
when the mean return of the last 20 finished episodes (stochastic policy)
reaches ``--target``; a greedy evaluation over 10 fresh episodes follows. The
last line printed is a JSON summary.

    python examples/jax_ppo_cartpole.py --seed 0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

# A 9k-parameter MLP called once per env step on 8 observations: on an accelerator each call
# would add a launch and two host-device copies for microseconds of work. JAX_PLATFORMS overrides.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped, unused-ignore]
from flax import nnx

from rlcore.jax.advantages import gae
from rlcore.jax.distributions import categorical_entropy, categorical_log_prob
from rlcore.jax.losses import entropy_loss, ppo_policy_loss, value_loss
from rlcore.jax.masked import masked_whiten

ENV_ID = "CartPole-v1"
Params = nnx.State[Any, Any]  # the model's parameters, a pytree


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add = parser.add_argument
    add("--total-steps", type=int, default=100_000, help="env step budget (the lr decays over it)")
    add("--seed", type=int, default=0)
    add("--target", type=float, default=475.0, help="stop when the recent mean return reaches it")
    add("--window", type=int, default=20, help="finished episodes in the recent mean")
    add("--num-envs", type=int, default=8)
    add("--num-steps", type=int, default=32, help="steps per env per rollout")
    add("--epochs", type=int, default=20, help="passes over each rollout")
    add("--minibatches", type=int, default=1, help="minibatches per pass")
    add("--lr", type=float, default=1e-3, help="Adam learning rate, decayed linearly to 0")
    add("--gamma", type=float, default=0.98)
    add("--lam", type=float, default=0.8, help="GAE λ")
    add("--clip", type=float, default=0.2, help="PPO clip ε")
    add("--vf-coef", type=float, default=0.5)
    add("--ent-coef", type=float, default=0.0)
    add("--max-grad-norm", type=float, default=0.5)
    add("--hidden", type=int, default=64)
    add("--eval-episodes", type=int, default=10, help="greedy episodes after training")
    add("--log-every", type=int, default=10, help="rollouts between progress lines")
    add("--quick", action="store_true", help="a 4,096-step smoke run (tests)")
    args = parser.parse_args(argv)
    if args.quick:
        args.total_steps, args.eval_episodes, args.log_every = 4096, 2, 4
    return args


class ActorCritic(nnx.Module):
    """Separate 64×64 tanh MLPs for the logits and the value, orthogonal init (SB3, CleanRL)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int, rngs: nnx.Rngs) -> None:
        def mlp(out: int, head_gain: float) -> nnx.Sequential:
            def linear(fan_in: int, fan_out: int, gain: float) -> nnx.Linear:
                return nnx.Linear(
                    fan_in,
                    fan_out,
                    kernel_init=nnx.initializers.orthogonal(gain),
                    bias_init=nnx.initializers.zeros_init(),
                    rngs=rngs,
                )

            return nnx.Sequential(
                linear(obs_dim, hidden, math.sqrt(2)),
                nnx.tanh,
                linear(hidden, hidden, math.sqrt(2)),
                nnx.tanh,
                linear(hidden, out, head_gain),
            )

        self.actor = mlp(num_actions, 0.01)
        self.critic = mlp(1, 1.0)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Logits ``[..., actions]`` and values ``[...]``."""
        return self.actor(obs), self.critic(obs)[..., 0]


class Rollout(NamedTuple):
    """One rollout, time-major ``[steps, envs, ...]`` as collected."""

    obs: jax.Array  # what the policy acted on
    actions: jax.Array
    rewards: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array  # sₜ₊₁: the final observation where an episode ended at t


class TrainState(NamedTuple):
    params: Params
    opt_state: optax.OptState
    key: jax.Array


def make_optimizer(args: argparse.Namespace, updates: int) -> optax.GradientTransformation:
    schedule = optax.linear_schedule(args.lr, 0.0, updates * args.epochs * args.minibatches)
    return optax.chain(
        optax.clip_by_global_norm(args.max_grad_norm),
        optax.adam(schedule, eps=1e-5),
    )


PolicyStep = Callable[[Params, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def make_policy_step(graphdef: nnx.GraphDef[ActorCritic], greedy: bool = False) -> PolicyStep:
    """``(params, obs, key) → (actions, next key)``, jitted: one compiled call per env step."""

    @jax.jit
    def step(params: Params, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = nnx.merge(graphdef, params).actor(obs)
        if greedy:
            return jnp.argmax(logits, axis=-1), key
        key, sample_key = jax.random.split(key)
        return jax.random.categorical(sample_key, logits), key

    return step


def make_update(
    graphdef: nnx.GraphDef[ActorCritic],
    optimizer: optax.GradientTransformation,
    args: argparse.Namespace,
) -> Callable[[TrainState, Rollout], tuple[TrainState, dict[str, jax.Array]]]:
    """PPO's update on one rollout, as one pure function (jit it, or call it eagerly)."""
    gamma, lam, clip = args.gamma, args.lam, args.clip
    vf_coef, ent_coef = args.vf_coef, args.ent_coef
    epochs, minibatches = args.epochs, args.minibatches

    def evaluate(params: Params, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        return nnx.merge(graphdef, params)(obs)

    def loss_fn(
        params: Params, batch: dict[str, jax.Array]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        logits, values = evaluate(params, batch["obs"])
        # rlcore's losses read [batch, time]: each sample is a row of one step.
        logprobs = categorical_log_prob(logits, batch["actions"])[:, None]
        entropy = categorical_entropy(logits)
        mask = jnp.ones_like(logprobs, dtype=bool)
        advantages = masked_whiten(batch["advantages"][:, None], mask)
        policy = ppo_policy_loss(
            logprobs, batch["logprobs"][:, None], advantages, mask, clip_low=clip
        )
        critic = value_loss(
            values[:, None], batch["values"][:, None], batch["returns"][:, None], mask
        )
        bonus = entropy_loss(entropy[:, None], mask)
        loss = policy.loss + vf_coef * critic.loss + ent_coef * bonus.loss
        metrics = {
            "loss": loss,
            "pg_loss": policy.loss,
            "value_loss": critic.loss,
            "entropy": bonus.metrics["entropy"],
            "clipfrac": policy.metrics["clipfrac"],
            "approx_kl": policy.metrics["approx_kl"],
        }
        return loss, metrics

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def update(state: TrainState, rollout: Rollout) -> tuple[TrainState, dict[str, jax.Array]]:
        steps, envs = rollout.rewards.shape
        # The policy that sampled the rollout, evaluated once on all of it: π_old, V and V'.
        logits, values = evaluate(state.params, rollout.obs)
        _, next_values = evaluate(state.params, rollout.next_obs)
        logprobs = categorical_log_prob(logits, rollout.actions)
        # gae reads [*batch, time]: envs are the batch, so time-major arrays are transposed.
        estimate = gae(
            rollout.rewards.T,
            values.T,
            next_values.T,
            rollout.terminated.T,
            rollout.truncated.T,
            gamma,
            lam,
        )
        samples = {
            "obs": rollout.obs.reshape(steps * envs, -1),
            "actions": rollout.actions.reshape(-1),
            "logprobs": logprobs.reshape(-1),
            "values": values.reshape(-1),
            "advantages": estimate.advantages.T.reshape(-1),
            "returns": estimate.returns.T.reshape(-1),
        }
        size = steps * envs
        per_minibatch = size // minibatches

        def sgd_step(
            carry: tuple[Params, optax.OptState], indices: jax.Array
        ) -> tuple[tuple[Params, optax.OptState], dict[str, jax.Array]]:
            params, opt_state = carry
            batch = {name: value[indices] for name, value in samples.items()}
            (_, metrics), grads = grad_fn(params, batch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            metrics["grad_norm"] = optax.tree.norm(grads)
            return (optax.apply_updates(params, updates), opt_state), metrics

        def epoch(
            carry: tuple[Params, optax.OptState], key: jax.Array
        ) -> tuple[tuple[Params, optax.OptState], dict[str, jax.Array]]:
            order = jax.random.permutation(key, size)[: minibatches * per_minibatch]
            return jax.lax.scan(sgd_step, carry, order.reshape(minibatches, per_minibatch))

        keys = jax.random.split(state.key, epochs + 1)
        (params, opt_state), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state), keys[1:]
        )
        # The last epoch's mean, as rlshell's PPO update reports.
        return TrainState(params, opt_state, keys[0]), {
            name: value[-1].mean() for name, value in metrics.items()
        }

    return update


def make_env(num_envs: int) -> gym.vector.VectorEnv:
    """gymnasium's vector CartPole, resetting a finished copy in the same step."""
    return gym.make_vec(
        ENV_ID,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )


class Collector:
    """Steps the vector env with a policy step, ``steps`` at a time; counts finished episodes."""

    def __init__(self, env: gym.vector.VectorEnv, steps: int, seed: int, window: int) -> None:
        self.env = env
        envs, obs_dim = env.num_envs, int(np.prod(env.single_observation_space.shape or ()))
        self.obs, _ = env.reset(seed=seed)
        self.buffers = {
            "obs": np.zeros((steps, envs, obs_dim), np.float32),
            "actions": np.zeros((steps, envs), np.int32),
            "rewards": np.zeros((steps, envs), np.float32),
            "terminated": np.zeros((steps, envs), bool),
            "truncated": np.zeros((steps, envs), bool),
            "next_obs": np.zeros((steps, envs, obs_dim), np.float32),
        }
        self.running_returns = np.zeros(envs)
        self.recent: deque[float] = deque(maxlen=window)  # returns of the last finished episodes
        self.episodes = 0

    def collect(self, act: PolicyStep, params: Params, key: jax.Array) -> tuple[Rollout, jax.Array]:
        """One rollout from where the last one stopped; returns it and the next sampling key."""
        buffers = self.buffers
        for t in range(len(buffers["obs"])):
            actions, key = act(params, jnp.asarray(self.obs), key)
            actions_np = np.asarray(actions)
            obs, rewards, terminated, truncated, info = self.env.step(actions_np)
            done = terminated | truncated
            buffers["obs"][t] = self.obs
            buffers["actions"][t] = actions_np
            buffers["rewards"][t] = rewards
            buffers["terminated"][t] = terminated
            buffers["truncated"][t] = truncated
            # sₜ₊₁ for the bootstrap: an ended episode's final observation, not the reset one.
            buffers["next_obs"][t] = obs
            for row in np.flatnonzero(done):
                buffers["next_obs"][t, row] = info["final_obs"][row]
            self.running_returns += rewards
            self.recent.extend(self.running_returns[done].tolist())
            self.episodes += int(done.sum())
            self.running_returns[done] = 0.0
            self.obs = obs
        return Rollout(**{name: jnp.asarray(value) for name, value in buffers.items()}), key

    def mean_return(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")


def evaluate_greedy(act: PolicyStep, params: Params, episodes: int, seed: int) -> list[float]:
    """Returns of the first episode of each of ``episodes`` fresh envs, acting on argmax π."""
    env = make_env(episodes)
    obs, _ = env.reset(seed=seed)
    returns, running = np.zeros(episodes), np.ones(episodes, dtype=bool)
    key = jax.random.key(0)  # unused by the greedy step
    while running.any():
        actions, key = act(params, jnp.asarray(obs), key)
        obs, rewards, terminated, truncated, _ = env.step(np.asarray(actions))
        returns += rewards * running
        running &= ~(terminated | truncated)
    env.close()
    return [float(r) for r in returns]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.perf_counter()
    env = make_env(args.num_envs)
    obs_dim = int(np.prod(env.single_observation_space.shape or ()))
    action_space = env.single_action_space
    assert isinstance(action_space, gym.spaces.Discrete), action_space
    model = ActorCritic(obs_dim, int(action_space.n), args.hidden, nnx.Rngs(args.seed))
    graphdef, params = nnx.split(model)
    rollout_size = args.num_envs * args.num_steps
    updates = max(1, args.total_steps // rollout_size)
    optimizer = make_optimizer(args, updates)
    state = TrainState(params, optimizer.init(params), jax.random.key(args.seed))
    act_key = jax.random.key(args.seed + 1)
    collector = Collector(env, args.num_steps, args.seed, args.window)

    # Compile both jitted functions before the clock starts, each once for its shapes.
    compile_started = time.perf_counter()
    act = make_policy_step(graphdef)
    act(params, jnp.asarray(collector.obs), act_key)
    example = Rollout(**{name: jnp.asarray(value) for name, value in collector.buffers.items()})
    update = jax.jit(make_update(graphdef, optimizer, args)).lower(state, example).compile()
    compile_s = time.perf_counter() - compile_started
    startup_s = compile_started - started
    parameters = sum(int(leaf.size) for leaf in jax.tree.leaves(params))
    print(
        f"{ENV_ID}: {parameters:,} parameters, {args.num_envs} envs × {args.num_steps} steps, "
        f"up to {updates} updates of {args.epochs} epochs; start-up {startup_s:.2f} s, "
        f"jit compile {compile_s:.2f} s",
        flush=True,
    )

    reached_at: tuple[int, float] | None = None
    metrics: dict[str, float] = {}
    env_steps = 0
    first_step = time.perf_counter()
    rollout_s = update_s = 0.0
    for iteration in range(1, updates + 1):
        rollout_started = time.perf_counter()
        rollout, act_key = collector.collect(act, state.params, act_key)
        update_started = time.perf_counter()
        state, device_metrics = update(state, rollout)
        metrics = {name: float(value) for name, value in device_metrics.items()}
        rollout_s += update_started - rollout_started
        update_s += time.perf_counter() - update_started
        env_steps = iteration * rollout_size
        mean_return = collector.mean_return()
        hit = len(collector.recent) == args.window and mean_return >= args.target
        if iteration % args.log_every == 0 or hit or iteration == updates:
            print(
                f"steps {env_steps:7,d}  return(last {len(collector.recent)}) {mean_return:6.1f}  "
                f"loss {metrics['loss']:8.4f}  entropy {metrics['entropy']:.3f}  "
                f"{time.perf_counter() - first_step:6.2f} s",
                flush=True,
            )
        if hit:
            reached_at = (env_steps, time.perf_counter() - first_step)
            break
    train_s = time.perf_counter() - first_step
    env.close()

    greedy_act = make_policy_step(graphdef, greedy=True)
    greedy = evaluate_greedy(greedy_act, state.params, args.eval_episodes, args.seed + 10_000)
    summary: dict[str, Any] = {
        "example": "jax_ppo_cartpole",
        "seed": args.seed,
        "quick": args.quick,
        "target": args.target,
        "criterion": f"mean return of the last {args.window} finished training episodes",
        "reached": reached_at is not None,
        "env_steps": env_steps,
        "steps_to_target": None if reached_at is None else reached_at[0],
        "wall_s_to_target": None if reached_at is None else round(reached_at[1], 3),
        "train_wall_s": round(train_s, 3),
        "rollout_s": round(rollout_s, 3),  # env steps and sampling calls
        "update_s": round(update_s, 3),
        "startup_s": round(startup_s, 3),
        "compile_s": round(compile_s, 3),
        "episodes": collector.episodes,
        "mean_return": collector.mean_return() if collector.recent else None,
        "greedy_eval_returns": greedy,
        "final_metrics": metrics,
        "jax": jax.__version__,
        "backend": jax.default_backend(),
    }
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
