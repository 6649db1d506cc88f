"""``actor.compile``: PPO's minibatch step compiled, the same maths as the eager one."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlshell.config import EnvConfig
from rlshell.config_loading import ConfigError, load_config
from rlshell.envs.stepper import EnvStepper
from rlshell.models.mlp_policy import MLPPolicy, MLPPolicySpec
from rlshell.rollout.trajectory import Samples, TrajectoryBuffer
from rlshell.runners.embodied import EmbodiedWorker, dummy_samples, ppo_settings
from rlshell.workers.embodied_update import (
    CompiledPPOGradients,
    PPOSettings,
    _default_forward,
    collect_rollout,
    ppo_loss,
    ppo_update,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "ppo_cartpole.py")
CARTPOLE = MLPPolicySpec.from_kwargs({"obs_dim": 4, "action_dim": 2, "action_type": "discrete"})
SETTINGS = PPOSettings(update_epochs=2, num_minibatches=2, clip_vloss=0.2, ent_coef=0.01)


def _window(policy: MLPPolicy) -> Samples:
    """8 steps of 4 CartPole envs: 32 samples, two minibatches of 16."""
    cfg = EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=4)
    stepper, buffer = EnvStepper.from_config(cfg, seed=0), TrajectoryBuffer(4)
    collect_rollout(policy, stepper, buffer, stepper.reset(seed=0), steps=8)
    return buffer.finish(gamma=0.99, lam=0.95)


def _policy() -> MLPPolicy:
    torch.manual_seed(0)
    return MLPPolicy(CARTPOLE)


@pytest.fixture(scope="module")
def compiled_pair() -> tuple[MLPPolicy, CompiledPPOGradients, Samples]:
    policy = _policy()
    samples = _window(policy)
    compiled = CompiledPPOGradients(policy, SETTINGS)
    compiled.warm_up(dummy_samples(policy, {"states": samples.forward_inputs["states"][:4]}, 16))
    return policy, compiled, samples


def test_start_up_compiles_without_changing_parameters_gradients_optimizer_or_rng() -> None:
    policy = _policy()
    samples = _window(policy)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    ppo_update(policy, optimizer, samples, SETTINGS, torch.Generator().manual_seed(0))
    params = {name: p.detach().clone() for name, p in policy.named_parameters()}
    moments = copy.deepcopy(optimizer.state_dict())
    rng = torch.get_rng_state()
    overrides = [
        "actor.compile=true",
        "algorithm.update_epochs=2",
        "algorithm.num_minibatches=2",
        "algorithm.value_clip=0.2",
        "algorithm.entropy_coef=0.01",
        "algorithm.vf_coef=0.5",
    ]
    config = load_config(CONFIG, overrides)
    assert ppo_settings(config) == SETTINGS  # the other tests' graph: compiled once
    worker = EmbodiedWorker(config)
    worker.world_size = 1
    worker.manager = SimpleNamespace(module=policy)  # type: ignore[assignment]
    generator_state = worker.generator.get_state()

    # 4 envs × 8 steps: two minibatches of 16.
    worker._compile_update(32, {"states": samples.forward_inputs["states"][:4]})

    assert worker.compiled is not None
    assert worker.compiled.compiled_rows == [16]
    for name, p in policy.named_parameters():
        assert torch.equal(p, params[name]), name
        assert p.grad is None, name
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(worker.generator.get_state(), generator_state)
    after = optimizer.state_dict()
    for key, state in moments["state"].items():
        for field, value in state.items():
            assert torch.equal(after["state"][key][field], value), (key, field)


def test_compiled_update_matches_eager_parameters_and_metrics(
    compiled_pair: tuple[MLPPolicy, CompiledPPOGradients, Samples],
) -> None:
    policy, compiled, samples = compiled_pair
    eager = copy.deepcopy(policy)
    start = {name: p.detach().clone() for name, p in policy.named_parameters()}

    def update(model: MLPPolicy, step: CompiledPPOGradients | None) -> dict[str, float]:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        generator = torch.Generator().manual_seed(0)
        return ppo_update(model, optimizer, samples, SETTINGS, generator, step)

    eager_metrics = update(eager, None)
    compiled_metrics = update(policy, compiled)

    moved = 0.0
    for (name, p), q in zip(policy.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=name)
        moved = max(moved, float((p - start[name]).abs().max()))
    assert moved > 1e-3  # the update did change the weights
    assert eager_metrics.keys() == compiled_metrics.keys()
    for key, value in eager_metrics.items():
        assert compiled_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_compiled_loss_that_is_not_finite_stops_before_the_gradients(
    compiled_pair: tuple[MLPPolicy, CompiledPPOGradients, Samples],
) -> None:
    policy, compiled, samples = compiled_pair
    rows = samples.select(torch.arange(16))
    broken = Samples(
        rows.forward_inputs,
        rows.logprobs,
        rows.values,
        rows.advantages,
        torch.full_like(rows.returns, float("nan")),
    )
    with pytest.raises(FloatingPointError, match="the loss is nan"):
        compiled.backward(broken)
    assert all(p.grad is None for p in policy.parameters())


def test_compile_takes_true_or_false() -> None:
    with pytest.raises(ConfigError, match=r"actor\.compile: expected true or false, got 'maybe'"):
        load_config(CONFIG, ["actor.compile=maybe"])


def test_compile_refuses_group_estimators_and_several_ranks_by_name() -> None:
    overrides = ["actor.compile=true", "algorithm.adv_type=grpo", "algorithm.group_size=4"]
    config = load_config(CONFIG, overrides)
    worker = EmbodiedWorker(config)
    worker.world_size = 2
    with pytest.raises(ConfigError) as caught:
        worker._compile_update(256, {})
    message = str(caught.value)
    assert "actor.compile: the compiled update needs one actor rank" in message
    assert "algorithm.adv_type 'gae'; got 'grpo'" in message


def test_compiled_step_reads_the_parameters_a_checkpoint_load_put_in_place(
    compiled_pair: tuple[MLPPolicy, CompiledPPOGradients, Samples],
) -> None:
    policy, compiled, samples = compiled_pair
    torch.manual_seed(5)
    policy.load_state_dict(MLPPolicy(CARTPOLE).state_dict(), assign=True)  # new tensors
    batch = samples.select(torch.arange(16))
    compiled.bind(policy)  # as ppo_update does
    eager = ppo_loss(_default_forward(policy, batch.forward_inputs), batch, SETTINGS)
    assert float(compiled(batch)[0].loss) == pytest.approx(float(eager.loss.detach()), rel=1e-5)
    with pytest.raises(ValueError, match="build one per policy"):
        compiled.bind(_policy())
