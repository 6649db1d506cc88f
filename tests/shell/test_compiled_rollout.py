"""``rollout.compile``: a policy's rollout call as one compiled graph, the eager call's draws.

Properties first: from the same seed the compiled call draws the eager call's
actions, with the same log-probs and values to float rounding, and updates
the same buffers; a whole rollout window collected through it is the eager
window. Then its refusals: another observation layout or mode, a policy it
cannot trace, another policy, and configs that would not read it.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
import torch

from rlshell.config import ConfigError, EnvConfig, ModelConfig
from rlshell.envs.stepper import EnvStepper
from rlshell.models import BasePolicy, get_model
from rlshell.models.base import ActionInfo
from rlshell.models.compiled import CompiledPredict, CompileError
from rlshell.models.mlp_policy import MLPPolicy
from rlshell.rollout.trajectory import TrajectoryBuffer
from rlshell.runners.validation import load_config
from rlshell.workers.embodied_actor import EmbodiedWorker
from rlshell.workers.embodied_grpo import collect_group_episodes
from rlshell.workers.embodied_update import collect_rollout

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE_CONFIG = str(ROOT / "configs" / "ppo_cartpole.py")
SAC_CONFIG = str(ROOT / "configs" / "sac_pendulum.py")


def _policy(model_type: str, **kwargs: Any) -> BasePolicy:
    torch.manual_seed(0)
    model = get_model(ModelConfig(model_type=model_type, category="embodied", model_kwargs=kwargs))
    assert isinstance(model, BasePolicy)
    return model.eval()


def _states(batch: int, dim: int, seed: int) -> dict[str, torch.Tensor]:
    return {"states": 3 * torch.randn(batch, dim, generator=torch.Generator().manual_seed(seed))}


def _images(batch: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"main_images": torch.randint(0, 256, (batch, 64, 64, 3), generator=gen).byte()}


CASES = {
    "discrete": (
        lambda: _policy("mlp_policy", obs_dim=4, action_dim=3, action_type="discrete"),
        lambda seed: _states(8, 4, seed),
        True,
    ),
    "gaussian, normalised states": (
        lambda: _policy(
            "mlp_policy", obs_dim=3, action_dim=2, action_type="gaussian", normalize_obs=True
        ),
        lambda seed: _states(5, 3, seed),
        True,
    ),
    "tanh_gaussian, no values": (
        lambda: _policy("mlp_policy", obs_dim=3, action_dim=2, action_type="tanh_gaussian"),
        lambda seed: _states(6, 3, seed),
        False,
    ),
    "cnn, images": (
        lambda: _policy(
            "cnn_policy",
            action_dim=2,
            action_type="discrete",
            conv_channels="8,16,16",
            feature_dim=32,
            hidden_size=32,
        ),
        lambda seed: _images(4, seed),
        True,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_compiled_call_draws_the_eager_actions_logprobs_values_and_buffer_updates(
    case: str,
) -> None:
    make_policy, make_obs, compute_values = CASES[case]
    eager, compiled_policy = make_policy(), make_policy()
    compiled = CompiledPredict(compiled_policy, make_obs(0), compute_values=compute_values)
    for seed in range(1, 4):
        obs = make_obs(seed)
        torch.manual_seed(seed)
        want_actions, want = eager.predict_action_batch(obs, compute_values=compute_values)
        torch.manual_seed(seed)
        got_actions, got = compiled(obs)
        if want_actions.is_floating_point():
            torch.testing.assert_close(got_actions, want_actions, atol=1e-6, rtol=1e-5)
        else:
            assert torch.equal(got_actions, want_actions)
        assert got.keys() == want.keys()
        torch.testing.assert_close(
            got["prev_logprobs"], want["prev_logprobs"], atol=1e-5, rtol=1e-5
        )
        if compute_values:
            torch.testing.assert_close(
                got["prev_values"], want["prev_values"], atol=1e-5, rtol=1e-5
            )
        assert got["forward_inputs"].keys() == want["forward_inputs"].keys()
        for key, value in want["forward_inputs"].items():
            torch.testing.assert_close(got["forward_inputs"][key], value, atol=1e-6, rtol=1e-5)
    # Running observation statistics (normalize_obs) moved as the eager call moved them.
    for (name, want_buffer), (_, got_buffer) in zip(
        eager.named_buffers(), compiled_policy.named_buffers(), strict=True
    ):
        torch.testing.assert_close(got_buffer, want_buffer, msg=name)


def _collect(policy: BasePolicy, predict: CompiledPredict | None) -> Any:
    cfg = EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=4)
    stepper, buffer = EnvStepper.from_config(cfg, seed=0), TrajectoryBuffer(4)
    torch.manual_seed(7)
    collect_rollout(policy, stepper, buffer, stepper.reset(seed=0), steps=48, predict=predict)
    return buffer.finish(gamma=0.98, lam=0.8), stepper.pop_metrics()


def test_a_window_collected_through_the_compiled_call_is_the_eager_window() -> None:
    policy = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    eager_samples, eager_metrics = _collect(policy, None)
    example = {"states": torch.zeros(4, 4)}
    samples, metrics = _collect(policy, CompiledPredict(policy, example))
    assert torch.equal(samples.forward_inputs["action"], eager_samples.forward_inputs["action"])
    assert torch.equal(samples.forward_inputs["states"], eager_samples.forward_inputs["states"])
    for key in ("logprobs", "values", "advantages", "returns"):
        torch.testing.assert_close(getattr(samples, key), getattr(eager_samples, key))
    assert metrics == eager_metrics
    assert metrics["env/episodes"] > 0  # episodes ended, truncated bootstraps ran eager


def test_group_episodes_collected_through_the_compiled_call_are_the_eager_ones() -> None:
    policy = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    cfg = EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=4)
    windows = []
    for predict in (
        None,
        CompiledPredict(policy, {"states": torch.zeros(4, 4)}, compute_values=False),
    ):
        stepper = EnvStepper.from_config(cfg, seed=0)
        torch.manual_seed(3)
        window, _ = collect_group_episodes(policy, stepper, 5, 2, 200, predict=predict)
        windows.append(window)
    eager, compiled = windows
    assert torch.equal(compiled.forward_inputs["action"], eager.forward_inputs["action"])
    assert torch.equal(compiled.valid, eager.valid)
    torch.testing.assert_close(compiled.logprobs, eager.logprobs)


def test_another_layout_or_mode_is_refused_by_name() -> None:
    policy = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    compiled = CompiledPredict(policy, {"states": torch.zeros(8, 4)})
    with pytest.raises(
        ValueError,
        match=r"MLPPolicy\.predict_action_batch was compiled for env_obs states \[8, 4\] "
        r"float32 on cpu, called with states \[3, 4\] float32 on cpu",
    ):
        compiled({"states": torch.zeros(3, 4)})
    with pytest.raises(ValueError, match=r"called with states \[8, 4\] float64"):
        compiled({"states": torch.zeros(8, 4, dtype=torch.float64)})
    with pytest.raises(TypeError, match=r"env_obs\['states'\] is a list"):
        compiled({"states": [[0.0] * 4] * 8})  # type: ignore[dict-item]
    policy.train()
    with pytest.raises(ValueError, match=r"compiled in eval mode .* called in the other"):
        compiled({"states": torch.zeros(8, 4)})


class _Branching(MLPPolicy):
    """Branches on an observation's value: nothing a traced graph can hold."""

    def predict_action_batch(
        self,
        env_obs: dict[str, Any],
        mode: Literal["train", "eval"] = "train",
        compute_values: bool = True,
    ) -> tuple[torch.Tensor, ActionInfo]:
        if bool(env_obs["states"].sum() > 0):
            mode = "eval"
        return super().predict_action_batch(env_obs, mode, compute_values)


def test_a_policy_it_cannot_trace_is_named_with_the_cause() -> None:
    base = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    assert isinstance(base, MLPPolicy)
    policy = _Branching(base.spec).eval()
    with pytest.raises(CompileError) as caught:
        CompiledPredict(policy, {"states": torch.zeros(8, 4)})
    message = str(caught.value)
    assert "rollout.compile: cannot trace _Branching.predict_action_batch" in message
    assert "Set rollout.compile=false" in message


def test_bind_reads_weights_loaded_in_place_and_refuses_another_policy() -> None:
    policy = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    obs = _states(8, 4, 1)
    compiled = CompiledPredict(policy, obs)
    other = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(-2.0)
    policy.load_state_dict(other.state_dict())  # a resume: copied into the same tensors
    compiled.bind(policy)
    torch.manual_seed(0)
    _, want = other.predict_action_batch(obs)
    torch.manual_seed(0)
    _, got = compiled(obs)
    torch.testing.assert_close(got["prev_values"], want["prev_values"], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="CompiledPredict was built for a MLPPolicy at"):
        compiled.bind(other)


def test_the_worker_refuses_several_ranks_and_fsdp_cast_weights_by_key() -> None:
    two_ranks = 'cluster.component_placement={"actor,rollout,env": "0:0-1"}'
    with pytest.raises(ConfigError, match=r"rollout\.compile: the compiled rollout call needs one"):
        load_config(CARTPOLE_CONFIG, ["rollout.compile=true", two_ranks])
    config = load_config(CARTPOLE_CONFIG, ["rollout.compile=true"])
    worker = EmbodiedWorker(config, critic=True)

    from torch.distributed.fsdp import FSDPModule

    # What fully_shard makes of a policy whose weights it casts: its class under FSDPModule.
    policy = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    policy.__class__ = type("FSDPMLPPolicy", (FSDPModule, MLPPolicy), {})
    worker.world_size = 1
    worker.manager = SimpleNamespace(module=policy)  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"rollout\.compile: the compiled rollout call needs the"):
        worker._compile_rollout({"states": torch.zeros(8, 4)})


def test_the_worker_compiles_the_rollout_call_at_start_up_without_touching_rng() -> None:
    config = load_config(CARTPOLE_CONFIG, ["rollout.compile=true"])
    worker = EmbodiedWorker(config, critic=True)
    policy = _policy("mlp_policy", obs_dim=4, action_dim=2, action_type="discrete")
    before = {name: value.clone() for name, value in policy.state_dict().items()}
    worker.manager = SimpleNamespace(module=policy)  # type: ignore[assignment]
    rng = torch.get_rng_state()
    worker._compile_rollout({"states": torch.zeros(8, 4)})
    assert isinstance(worker.predict, CompiledPredict)
    assert worker.predict.layout[0][:2] == ("states", (8, 4))
    assert torch.equal(torch.get_rng_state(), rng)
    for name, value in policy.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize(
    ("config", "overrides", "reason"),
    [
        (SAC_CONFIG, [], "SAC does not read it"),
        (
            CARTPOLE_CONFIG,
            ['cluster.component_placement={"actor": "0:0-1", "rollout": "0:0", "env": "0:0-1"}'],
            "only the collocated placement",
        ),
    ],
)
def test_configs_that_would_not_read_it_are_refused(
    config: str, overrides: list[str], reason: str
) -> None:
    for key, what in (("rollout.compile", "rollout"), ("actor.compile", "update")):
        with pytest.raises(ConfigError) as caught:
            load_config(config, [*overrides, f"{key}=true"])
        message = str(caught.value)
        assert f"{key}: compiles embodied PPO's {what} step; " in message
        assert reason in message
        assert f"Set {key}=false" in message
