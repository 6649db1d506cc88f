"""``actor.compile``: PPO's whole minibatch step compiled, the same maths as the eager one."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlshell.config import ConfigError, EnvConfig
from rlshell.envs.stepper import EnvStepper
from rlshell.models.mlp_policy import MLPPolicy, MLPPolicySpec
from rlshell.rollout.trajectory import Samples, TrajectoryBuffer
from rlshell.runners.validation import load_config
from rlshell.workers.embodied_actor import EmbodiedWorker, dummy_samples
from rlshell.workers.embodied_update import (
    CompiledPPOStep,
    PPOSettings,
    _default_forward,
    collect_rollout,
    ppo_loss,
    ppo_update,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "ppo_cartpole.py")
CARTPOLE = MLPPolicySpec.from_kwargs({"obs_dim": 4, "action_dim": 2, "action_type": "discrete"})
SETTINGS = PPOSettings(
    ppo_epochs=2, num_minibatches=2, clip_coef=0.2, clip_vloss=0.2, ent_coef=0.01
)
# One xdist worker runs the module: `compiled` is built once, and the graph of SETTINGS compiles
# once for all the tests that build a step of it.
pytestmark = pytest.mark.xdist_group("embodied_fast_update")


def _window(policy: MLPPolicy) -> Samples:
    """8 steps of 4 CartPole envs: 32 samples, two minibatches of 16."""
    cfg = EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=4)
    stepper, buffer = EnvStepper.from_config(cfg, seed=0), TrajectoryBuffer(4)
    collect_rollout(policy, stepper, buffer, stepper.reset(seed=0), steps=8)
    return buffer.finish(gamma=0.99, lam=0.95)


def _policy() -> MLPPolicy:
    torch.manual_seed(0)
    return MLPPolicy(CARTPOLE)


def _adamw(policy: MLPPolicy) -> torch.optim.AdamW:
    return torch.optim.AdamW(policy.parameters(), lr=1e-2, eps=1e-5, weight_decay=0.01)


class Compiled(SimpleNamespace):
    policy: MLPPolicy
    optimizer: torch.optim.AdamW
    step: CompiledPPOStep
    samples: Samples


@pytest.fixture(scope="module")
def compiled() -> Compiled:
    """One compiled step (the graph compiles once per module) on a policy and its AdamW."""
    policy = _policy()
    samples = _window(policy)
    optimizer = _adamw(policy)
    step = CompiledPPOStep(policy, optimizer, SETTINGS)
    step.warm_up(dummy_samples(policy, {"states": samples.forward_inputs["states"][:4]}, 16))
    return Compiled(policy=policy, optimizer=optimizer, step=step, samples=samples)


def _snapshot(policy: MLPPolicy, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    params = {name: p.detach().clone() for name, p in policy.named_parameters()}
    return params, copy.deepcopy(optimizer.state_dict())


def _assert_unchanged(policy: MLPPolicy, optimizer: torch.optim.Optimizer, snap: tuple) -> None:
    params, moments = snap
    for name, p in policy.named_parameters():
        assert torch.equal(p, params[name]), name
        assert p.grad is None, name
    after = optimizer.state_dict()["state"]
    assert after.keys() == moments["state"].keys()
    for key, state in moments["state"].items():
        for field, value in state.items():
            assert torch.equal(after[key][field], value), (key, field)


def test_start_up_compiles_without_changing_weights_gradients_optimizer_or_rng() -> None:
    policy = _policy()
    samples = _window(policy)
    optimizer = _adamw(policy)
    ppo_update(policy, optimizer, samples, SETTINGS, torch.Generator().manual_seed(0))
    snap = _snapshot(policy, optimizer)
    rng = torch.get_rng_state()
    overrides = [
        "actor.compile=true",
        "algorithm.ppo_epochs=2",
        "algorithm.num_minibatches=2",
        "algorithm.value_clip=0.2",
        "algorithm.entropy_coef=0.01",
        "algorithm.vf_coef=0.5",
    ]
    config = load_config(CONFIG, overrides)
    assert PPOSettings.of(config, critic=True) == SETTINGS  # the other tests' graph: compiled once
    worker = EmbodiedWorker(config, critic=True)
    worker.world_size = 1
    worker.manager = SimpleNamespace(  # type: ignore[assignment]
        module=policy, optimizer=optimizer, lr_scheduler=None
    )
    generator_state = worker.generator.get_state()

    # 4 envs × 8 steps: two minibatches of 16.
    worker._compile_update(32, {"states": samples.forward_inputs["states"][:4]})

    assert isinstance(worker.update_step, CompiledPPOStep)
    assert worker.update_step.compiled_rows == [16]
    _assert_unchanged(policy, optimizer, snap)
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(worker.generator.get_state(), generator_state)


def test_compiled_update_matches_eager_parameters_moments_and_metrics(
    compiled: Compiled,
) -> None:
    policy, optimizer = compiled.policy, compiled.optimizer
    eager = copy.deepcopy(policy)
    eager_optimizer = _adamw(eager)
    eager_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    start = {name: p.detach().clone() for name, p in policy.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    eager_metrics = ppo_update(eager, eager_optimizer, compiled.samples, SETTINGS, generator)
    generator = torch.Generator().manual_seed(0)
    compiled_metrics = ppo_update(policy, compiled.step, compiled.samples, SETTINGS, generator)

    moved = 0.0
    for (name, p), q in zip(policy.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=name)
        moved = max(moved, float((p - start[name]).abs().max()))
    assert moved > 1e-3  # the update did change the weights
    eager_state, state = eager_optimizer.state_dict()["state"], optimizer.state_dict()["state"]
    assert state.keys() == eager_state.keys()
    assert len(state) == len(list(policy.parameters()))
    for key, moments in eager_state.items():
        assert float(state[key]["step"]) == float(moments["step"]) == 4.0  # 2 epochs × 2
        for field in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state[key][field], moments[field], atol=1e-6, rtol=1e-4)
    assert eager_metrics.keys() == compiled_metrics.keys()
    for key, value in eager_metrics.items():
        assert compiled_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_compiled_loss_that_is_not_finite_stops_with_weights_and_moments_as_they_were(
    compiled: Compiled,
) -> None:
    rows = compiled.samples.select(torch.arange(16))
    broken = Samples(
        rows.forward_inputs,
        rows.logprobs,
        rows.values,
        rows.advantages,
        torch.full_like(rows.returns, float("nan")),
    )
    compiled.step(rows)  # AdamW's state exists
    snap = _snapshot(compiled.policy, compiled.optimizer)
    with pytest.raises(FloatingPointError, match="the loss is nan"):
        compiled.step(broken)
    _assert_unchanged(compiled.policy, compiled.optimizer, snap)


class KinkedPolicy(MLPPolicy):
    """CartPole's MLP with √(u · [u > 0]) added to its values, u = a critic bias − 10⁶:
    −0 forward (a finite loss), 0 · ∞ backward (a NaN gradient)."""

    def default_forward(
        self,
        forward_inputs: dict[str, torch.Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, torch.Tensor]:
        out = super().default_forward(
            forward_inputs, compute_logprobs, compute_entropy, compute_values
        )
        assert self.critic is not None
        u = self.critic[0].bias[0] - 1e6
        out["values"] = out["values"] + torch.sqrt(u * (u > 0))
        return out


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "eager"])
def test_a_step_whose_gradient_norm_is_not_finite_is_skipped_and_stops_the_update(
    compiled: bool,
) -> None:
    """A finite loss with a NaN gradient: the weights and AdamW's moments stay as they
    were, and the step raises (ppo_update then stops with the minibatch)."""
    from rlshell.workers.embodied_update import EagerPPOStep, torch_optimizer_step

    torch.manual_seed(0)
    policy = KinkedPolicy(CARTPOLE)
    samples = _window(policy).select(torch.arange(16))
    optimizer = _adamw(policy)
    step: CompiledPPOStep | EagerPPOStep = (
        CompiledPPOStep(policy, optimizer, SETTINGS)
        if compiled
        else EagerPPOStep(policy, SETTINGS, torch_optimizer_step(policy, optimizer, SETTINGS))
    )
    # AdamW's state: the compiled step creates it (zeros); the eager one has none yet.
    snap = _snapshot(policy, optimizer)
    with pytest.raises(
        FloatingPointError,
        match=r"^PPO update: the gradient norm is nan; the step was skipped and the update "
        "stops$",
    ):
        step(samples)
    _assert_unchanged(policy, optimizer, snap)


def test_compiled_step_refuses_an_optimizer_it_does_not_run() -> None:
    policy = _policy()
    with pytest.raises(ValueError, match=r"runs torch\.optim\.AdamW's update; got a SGD"):
        CompiledPPOStep(policy, torch.optim.SGD(policy.parameters(), lr=0.1), SETTINGS)
    groups = [{"params": [p]} for p in policy.parameters()]
    with pytest.raises(ValueError, match="needs one param group; got 12"):
        CompiledPPOStep(policy, torch.optim.AdamW(groups), SETTINGS)


def test_compile_takes_true_or_false() -> None:
    with pytest.raises(ConfigError, match=r"actor\.compile: expected true or false, got 'maybe'"):
        load_config(CONFIG, ["actor.compile=maybe"])


def test_compile_refuses_group_estimators_and_several_ranks_by_name() -> None:
    overrides = [
        "actor.compile=true",
        "algorithm.adv_type=grpo",
        "algorithm.group_size=4",
        'cluster.component_placement={"actor,rollout,env": "0:0-1"}',
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(CONFIG, overrides)
    message = str(caught.value)
    assert "actor.compile: the compiled update needs one actor rank" in message
    assert "algorithm.adv_type 'gae'; got 'grpo'" in message


def test_compiled_step_reads_the_weights_and_moments_a_checkpoint_load_put_in_place(
    compiled: Compiled,
) -> None:
    policy, optimizer, step = compiled.policy, compiled.optimizer, compiled.step
    batch = compiled.samples.select(torch.arange(16))
    saved = copy.deepcopy((policy.state_dict(), optimizer.state_dict()))
    eager = ppo_loss(_default_forward(policy, batch.forward_inputs), batch, SETTINGS)
    step.prepare(policy)
    parts, _ = step(batch)
    assert float(parts.loss) == pytest.approx(float(eager.loss.detach()), rel=1e-5)
    first = {name: p.detach().clone() for name, p in policy.named_parameters()}

    # A resume: the weights loaded in place, AdamW's state as new tensors; the same step again.
    policy.load_state_dict(saved[0])
    optimizer.load_state_dict(copy.deepcopy(saved[1]))
    step.prepare(policy)  # as ppo_update does
    step(batch)
    for name, p in policy.named_parameters():
        torch.testing.assert_close(p, first[name], atol=0.0, rtol=0.0, msg=name)
    with pytest.raises(ValueError, match="build one per policy"):
        step.prepare(_policy())
    # The loaded param group is a new dict, which a schedule steps: the step reads its rate.
    later = copy.deepcopy(saved[1])
    later["param_groups"][0]["lr"] = 0.003
    optimizer.load_state_dict(later)
    step.prepare(policy)
    step(batch)
    assert step.lr == 0.003
    # A checkpoint saved with other AdamW constants than the graph holds: said so.
    other = copy.deepcopy(saved[1])
    other["param_groups"][0]["betas"] = (0.8, 0.999)
    optimizer.load_state_dict(other)
    with pytest.raises(ValueError, match=r"AdamW constants are now \{'beta1': 0\.8"):
        step.prepare(policy)
    optimizer.load_state_dict(copy.deepcopy(saved[1]))
    # Weights swapped for new tensors leave the optimizer stepping the old ones: said so.
    policy.load_state_dict(copy.deepcopy(saved[0]), assign=True)
    with pytest.raises(ValueError, match=r"steps 12 parameter\(s\) that are not MLPPolicy's"):
        step.prepare(policy)


def test_target_kl_stops_the_update_at_the_first_minibatch_past_it() -> None:
    from attrs import evolve

    def update(settings: PPOSettings) -> tuple[dict[str, float], MLPPolicy]:
        policy = _policy()
        samples = _window(policy)
        metrics = ppo_update(
            policy, _adamw(policy), samples, settings, torch.Generator().manual_seed(0)
        )
        return metrics, policy

    plain, plain_policy = update(SETTINGS)
    assert "train/optimizer_steps" not in plain
    # A target no minibatch reaches changes nothing but the count it reports.
    loose, loose_policy = update(evolve(SETTINGS, target_kl=1e9))
    assert loose.pop("train/optimizer_steps") == 4.0
    assert loose == plain
    for a, b in zip(plain_policy.parameters(), loose_policy.parameters(), strict=True):
        assert torch.equal(a, b)
    # A target every minibatch exceeds (the first one's KL is ~0): one step, then stop.
    tight, tight_policy = update(evolve(SETTINGS, target_kl=-1.0))
    assert tight["train/optimizer_steps"] == 1.0
    assert abs(tight["train/approx_kl"]) < 1e-6  # measured before the step
    changed = [
        not torch.equal(a, b)
        for a, b in zip(plain_policy.parameters(), tight_policy.parameters(), strict=True)
    ]
    assert any(changed)


def test_an_update_stopped_early_still_moves_the_lr_schedule_a_whole_window() -> None:
    """The schedule counts windows: steps ``target_kl`` saved advance it as if taken."""
    from attrs import evolve

    from rlshell.workers.embodied_update import EagerPPOStep, torch_optimizer_step

    policy = _policy()
    samples = _window(policy)
    optimizer = _adamw(policy)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / 100)
    worker = EmbodiedWorker(load_config(CONFIG, []), critic=True)
    # A target every minibatch exceeds: one optimizer step of the window's planned ones.
    worker.settings = evolve(SETTINGS, target_kl=-1.0)
    worker.manager = SimpleNamespace(  # type: ignore[assignment]
        module=policy, optimizer=optimizer, lr_scheduler=scheduler
    )
    taken: list[int] = []
    optimizer_step = torch_optimizer_step(policy, optimizer, worker.settings)

    def counted() -> tuple[float, float]:
        taken.append(1)
        return optimizer_step()

    worker.update_step = EagerPPOStep(policy, worker.settings, counted)
    metrics = worker._update(samples)
    assert metrics["train/optimizer_steps"] == 1.0
    assert len(taken) == 1
    # This step function leaves the schedule alone: every step it moved is a skipped one.
    assert scheduler.last_epoch == worker.settings.steps_per_window - 1


def test_a_nan_loss_stops_the_update_and_its_minibatch_is_written_to_the_run_dir(
    tmp_path: Path,
) -> None:
    """A policy whose weights went NaN: the update stops before its first step, and the
    worker writes the minibatch to ``<run dir>/nonfinite/`` and names the file."""
    from rlshell.workers.embodied_update import EagerPPOStep, torch_optimizer_step

    policy = _policy()
    samples = _window(policy)
    with torch.no_grad():
        next(policy.parameters()).fill_(float("nan"))
    config = load_config(CONFIG, [f"runner.output_dir={tmp_path}"])
    worker = EmbodiedWorker(config, critic=True)
    worker.settings = SETTINGS
    optimizer = _adamw(policy)
    worker.manager = SimpleNamespace(  # type: ignore[assignment]
        module=policy, optimizer=optimizer, lr_scheduler=None
    )
    worker.update_step = EagerPPOStep(
        policy, SETTINGS, torch_optimizer_step(policy, optimizer, SETTINGS)
    )
    with pytest.raises(FloatingPointError, match=r"PPO update: the loss is nan") as raised:
        worker._update(samples)
    (dump,) = (tmp_path / "ppo_cartpole" / "nonfinite").iterdir()
    assert dump.name == "step_1_rank_0.pt"
    assert f"Its batch is in {dump}" in str(raised.value)
    record = torch.load(dump, weights_only=False)
    assert record["step"] == 1
    assert record["forward_inputs"]["states"].shape == (16, 4)  # a minibatch of the 32
    assert record["advantages"].shape == (16,)
