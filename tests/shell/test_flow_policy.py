"""The built-in ``flow_policy``: a flow-matching action policy under OpenPI's contract.

Properties first: the chain a rollout records has OpenPI's fields and shapes; its
log-probabilities recompute bitwise from ``forward_inputs`` before any update; the steps
not drawn stochastic are the ODE's Euler steps and the drawn ones are the Gaussians their
log-probabilities say; eval is deterministic. Then learning signals (a PPO-style step
raises the log-likelihood of an advantaged chain; the flow-matching SFT loss clones a
demonstrated map) and the errors.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributions import Normal

from rlcore.distributions import flow_euler_step, flow_sde_step
from rlshell.config import ModelConfig
from rlshell.models import get_model
from rlshell.models.flow_policy import FlowPolicy, build_flow_policy

METHODS = (
    {"noise_method": "flow_sde"},
    {"noise_method": "flow_sde", "joint_logprob": True},
    {"noise_method": "flow_noise"},
)


def make_policy(obs_dim: int = 4, action_dim: int = 2, **extra: Any) -> FlowPolicy:
    kwargs = {"obs_dim": obs_dim, "action_dim": action_dim, "hidden_sizes": "32,32", **extra}
    return build_flow_policy(ModelConfig(category="embodied", model_kwargs=kwargs), torch.float32)


@settings(deadline=None, max_examples=30)
@given(
    method=st.sampled_from(METHODS),
    batch=st.integers(1, 12),
    chunk=st.integers(1, 4),
    steps=st.integers(1, 6),
    normalize=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_a_recorded_chain_recomputes_its_logprobs_bitwise(
    method: dict[str, Any], batch: int, chunk: int, steps: int, normalize: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    policy = make_policy(action_chunk=chunk, num_steps=steps, normalize_obs=normalize, **method)
    actions, info = policy.predict_action_batch({"states": torch.randn(batch, 4)})
    inputs = info["forward_inputs"]
    assert set(inputs) == {"states", "chains", "denoise_inds", "model_action", "action"}
    assert inputs["chains"].shape == (batch, steps + 1, chunk, 2)
    stochastic = steps if method != METHODS[0] else 1
    assert inputs["denoise_inds"].shape == (batch, stochastic)
    assert inputs["denoise_inds"].dtype == torch.int64
    assert torch.equal(inputs["model_action"], inputs["chains"][:, -1])
    assert actions.shape == ((batch, 2) if chunk == 1 else (batch, chunk, 2))
    out = policy.default_forward(inputs)
    assert torch.equal(out["logprobs"], info["prev_logprobs"])  # bitwise, in fp32
    assert torch.equal(out["values"], info["prev_values"])
    assert out["entropy"].shape == (batch,)


@pytest.mark.parametrize("method", METHODS, ids=["sde", "sde-joint", "noise"])
def test_each_step_is_euler_or_the_gaussian_its_logprob_scores(method: dict[str, Any]) -> None:
    torch.manual_seed(0)
    policy = make_policy(action_chunk=3, num_steps=4, **method)
    _, info = policy.predict_action_batch({"states": torch.randn(16, 4)})
    chains, inds = info["forward_inputs"]["chains"], info["forward_inputs"]["denoise_inds"]
    context = policy.encoder(info["forward_inputs"]["states"])
    delta = torch.full((16,), 0.25)
    total = torch.zeros(16)
    with torch.no_grad():
        for k in range(4):
            t = torch.full((16,), 1.0 - k / 4)
            velocity, hidden = policy._velocity(chains[:, k], t, context)
            euler = flow_euler_step(chains[:, k], velocity, delta)
            drawn = (inds == k).any(-1)
            torch.testing.assert_close(chains[~drawn, k + 1], euler[~drawn], rtol=0, atol=0)
            if method["noise_method"] == "flow_sde":
                mean, log_std = flow_sde_step(chains[:, k], velocity, t, delta, 0.5)
                std = log_std.exp()[:, None, None].expand_as(mean)
            else:
                low, high = 0.08, 0.16
                mean = euler
                std = low + (high - low) * torch.sigmoid(policy.noise_head(hidden)).view_as(mean)
            step = Normal(mean, std).log_prob(chains[:, k + 1]).sum((-2, -1))
            total += torch.where(drawn, step, 0.0)
    torch.testing.assert_close(info["prev_logprobs"], total)


def test_eval_runs_the_ode_from_the_noise_mode_and_is_deterministic() -> None:
    torch.manual_seed(0)
    policy = make_policy(action_low=-0.05, action_high=0.05)
    states = {"states": torch.randn(6, 4)}
    first, info = policy.predict_action_batch(states, mode="eval")
    second, _ = policy.predict_action_batch(states, mode="eval")
    assert torch.equal(first, second)
    assert torch.equal(info["forward_inputs"]["chains"][:, 0], torch.zeros(6, 1, 2))
    assert info["forward_inputs"]["denoise_inds"].shape == (6, 0)
    assert torch.equal(info["prev_logprobs"], torch.zeros(6))
    # The env gets the model action clipped to its bounds; the chain keeps it as it was.
    model_action = info["forward_inputs"]["model_action"][:, 0]
    assert torch.equal(first, model_action.clamp(-0.05, 0.05))


@pytest.mark.parametrize("method", METHODS, ids=["sde", "sde-joint", "noise"])
def test_a_policy_gradient_step_makes_an_advantaged_chain_more_likely(
    method: dict[str, Any],
) -> None:
    torch.manual_seed(1)
    policy = make_policy(**method)
    _, info = policy.predict_action_batch({"states": torch.randn(32, 4)})
    inputs = info["forward_inputs"]
    advantages = torch.where(torch.arange(32) % 2 == 0, 1.0, -1.0)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-3)
    before = policy.default_forward(inputs)["logprobs"]
    (-(advantages * before).mean()).backward()
    optimizer.step()
    with torch.no_grad():
        change = policy.default_forward(inputs)["logprobs"] - before.detach()
    assert float((advantages * change).mean()) > 0


def test_sft_forward_clones_a_demonstrated_map() -> None:
    # Demonstrations a = W s (a chunk of 2 steps): flow matching should reproduce them.
    torch.manual_seed(0)
    policy = make_policy(obs_dim=3, action_chunk=2, num_steps=8, hidden_sizes="64,64")
    weights = torch.randn(3, 4) * 0.5
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(400):
        states = torch.randn(64, 3)
        loss = policy.sft_forward(states=states, actions=(states @ weights).view(64, 2, 2))["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    states = torch.randn(256, 3)
    acted, _ = policy.predict_action_batch({"states": states}, mode="eval")
    error = (acted - (states @ weights).view(256, 2, 2)).abs().mean()
    spread = (states @ weights).abs().mean()
    assert float(error) < 0.2 * float(spread), (float(error), float(spread))


def test_get_model_builds_the_registered_type() -> None:
    cfg = ModelConfig(
        model_type="flow_policy",
        category="embodied",
        precision="bf16",
        model_kwargs={"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise"},
    )
    policy = get_model(cfg)
    assert isinstance(policy, FlowPolicy)
    assert policy.velocity_out.weight.dtype == torch.bfloat16
    _, info = policy.predict_action_batch({"states": torch.randn(2, 3)})
    assert info["prev_logprobs"].dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action_dim": 2}, "obs_dim: missing"),
        (
            {"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise", "noise_level": 0.3},
            "noise_level",
        ),
        ({"obs_dim": 3, "action_dim": 2, "noise_std_range": "0.1,0.2"}, "noise_std_range"),
        (
            {"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise", "noise_std_range": "2"},
            "expected 'low,high'",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "noise_method": "flow_noise", "noise_std_range": "2,1"},
            "0 < low <= high",
        ),
        ({"obs_dim": 3, "action_dim": 2, "time_embed_dim": 7}, "must be even"),
        ({"obs_dim": 3, "action_dim": 2, "noise_method": "ddpm"}, "noise_method"),
        ({"obs_dim": 3, "action_dim": 2, "num_step": 4}, "did you mean 'num_steps'"),
    ],
)
def test_builder_errors_name_the_key(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_flow_policy(ModelConfig(category="embodied", model_kwargs=kwargs), torch.float32)


def test_a_chain_of_another_shape_or_a_bad_step_index_is_refused() -> None:
    policy = make_policy(num_steps=3)
    _, info = policy.predict_action_batch({"states": torch.randn(2, 4)})
    inputs = dict(info["forward_inputs"])
    with pytest.raises(ValueError, match=r"\[batch, 4, 1, 2\]"):
        policy.default_forward({**inputs, "chains": inputs["chains"][:, :3]})
    with pytest.raises(ValueError, match=r"steps 0..2, got values in \[3, 3\]"):
        policy.default_forward({**inputs, "denoise_inds": torch.full((2, 1), 3)})
    with pytest.raises(KeyError, match="chains"):
        policy.default_forward({"states": inputs["states"]})
