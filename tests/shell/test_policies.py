"""The embodied policy contract and the built-in ``mlp_policy``.

Properties first: rollout's log-probs are recomputed exactly from the cached
``forward_inputs``; the log-probs and entropies equal torch.distributions';
actions are env-ready and eval is deterministic. Then the errors and the builder.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributions import Categorical, Normal, TanhTransform, TransformedDistribution

from rlshell.config import ModelConfig
from rlshell.models import BasePolicy, ForwardType, get_model
from rlshell.models.base import ActionInfo, MissingInputError
from rlshell.models.mlp_policy import MLPPolicy, MLPPolicySpec, build_mlp_policy

ACTION_TYPES = ("discrete", "gaussian", "tanh_gaussian")


def make_policy(action_type: str, obs_dim: int = 3, action_dim: int = 2, **extra: Any) -> MLPPolicy:
    kwargs = {"obs_dim": obs_dim, "action_dim": action_dim, "action_type": action_type, **extra}
    return build_mlp_policy(ModelConfig(category="embodied", model_kwargs=kwargs), torch.float32)


def states(batch: int, obs_dim: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, obs_dim, generator=torch.Generator().manual_seed(seed))


@given(
    action_type=st.sampled_from(ACTION_TYPES),
    batch=st.integers(1, 16),
    obs_dim=st.integers(1, 8),
    action_dim=st.integers(1, 5),
    hidden=st.sampled_from(["8", "16,16", "4,8,4"]),
    seed=st.integers(0, 2**16),
)
def test_default_forward_recomputes_the_rollout_logprobs(
    action_type: str, batch: int, obs_dim: int, action_dim: int, hidden: str, seed: int
) -> None:
    torch.manual_seed(seed)
    extra: dict[str, Any] = {"hidden_sizes": hidden}
    if action_type == "gaussian":
        extra["init_log_std"] = -0.5
    policy = make_policy(action_type, obs_dim, action_dim, **extra)
    _, info = policy.predict_action_batch({"states": states(batch, obs_dim, seed)})
    recomputed = policy(ForwardType.DEFAULT, forward_inputs=info["forward_inputs"])
    assert info["prev_logprobs"].shape == (batch,)
    torch.testing.assert_close(recomputed["logprobs"], info["prev_logprobs"], atol=1e-5, rtol=0)


def test_tanh_gaussian_default_forward_at_saturated_u_matches_torch() -> None:
    torch.manual_seed(0)
    policy = make_policy("tanh_gaussian", obs_dim=3, action_dim=2)
    obs = states(4, 3, seed=1)
    u = torch.tensor([[10.0, -10.0], [9.5, 0.0], [-7.0, 3.0], [0.1, -9.9]])
    logprobs = policy(forward_inputs={"states": obs, "action": u})["logprobs"]
    mean, log_std = policy.actor(obs).chunk(2, dim=-1)
    tanh = TanhTransform(cache_size=1)
    a = tanh(u)
    dist = TransformedDistribution(Normal(mean, log_std.clamp(-5, 2).exp()), [tanh])
    torch.testing.assert_close(logprobs, dist.log_prob(a).sum(-1), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("action_type", ACTION_TYPES)
def test_actions_are_env_ready_and_eval_is_deterministic(action_type: str) -> None:
    torch.manual_seed(0)
    low, high = "-2.0,0.5", "1.0,3.0"
    extra: dict[str, Any] = (
        {} if action_type == "discrete" else {"action_low": low, "action_high": high}
    )
    if action_type == "gaussian":
        extra["init_log_std"] = 1.5  # wide enough that raw samples leave the box
    policy = make_policy(action_type, obs_dim=4, action_dim=2, **extra)
    obs = {"states": states(256, 4, seed=2)}
    actions, info = policy.predict_action_batch(obs, mode="train")
    if action_type == "discrete":
        assert actions.dtype == torch.int64
        assert actions.shape == (256,)
        assert ((actions >= 0) & (actions < 2)).all()
    else:
        assert actions.dtype == torch.float32
        assert actions.shape == (256, 2)
        lo, hi = torch.tensor([-2.0, 0.5]), torch.tensor([1.0, 3.0])
        assert ((actions >= lo) & (actions <= hi)).all()
    if action_type == "gaussian":
        raw = info["forward_inputs"]["action"]
        assert ((raw < lo) | (raw > hi)).any(), "the cached raw action is the unclipped one"
        torch.testing.assert_close(actions, torch.clamp(raw, lo, hi))
    first, _ = policy.predict_action_batch(obs, mode="eval")
    second, _ = policy.predict_action_batch(obs, mode="eval")
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_eval_actions_are_the_modes() -> None:
    torch.manual_seed(0)
    obs = states(5, 3, seed=3)
    discrete = make_policy("discrete")
    actions, _ = discrete.predict_action_batch({"states": obs}, mode="eval")
    assert torch.equal(actions, discrete.actor(obs).argmax(-1))
    gaussian = make_policy("gaussian", action_low=-0.001, action_high=0.001)
    actions, _ = gaussian.predict_action_batch({"states": obs}, mode="eval")
    torch.testing.assert_close(actions, gaussian.actor(obs).clamp(-0.001, 0.001))
    squashed = make_policy("tanh_gaussian", action_low=0.0, action_high=4.0)
    actions, _ = squashed.predict_action_batch({"states": obs}, mode="eval")
    mean = squashed.actor(obs).chunk(2, dim=-1)[0]
    torch.testing.assert_close(actions, (torch.tanh(mean) + 1) * 2.0)


@given(batch=st.integers(1, 8), actions=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_categorical_entropy_is_analytic(batch: int, actions: int, seed: int) -> None:
    torch.manual_seed(seed)
    policy = make_policy("discrete", obs_dim=3, action_dim=actions)
    obs = states(batch, 3, seed)
    _, info = policy.predict_action_batch({"states": obs})
    entropy = policy(forward_inputs=info["forward_inputs"])["entropy"]
    torch.testing.assert_close(entropy, Categorical(logits=policy.actor(obs)).entropy())


@given(batch=st.integers(1, 16), actions=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_discrete_actions_are_what_torch_multinomial_draws_from_the_policy(
    batch: int, actions: int, seed: int
) -> None:
    policy = make_policy("discrete", obs_dim=3, action_dim=actions)
    obs = states(batch, 3, seed)
    torch.manual_seed(seed)
    drawn, _ = policy.predict_action_batch({"states": obs})
    with torch.no_grad():
        probs = torch.softmax(policy.actor(obs), dim=-1)
    torch.manual_seed(seed)
    assert torch.equal(drawn, torch.multinomial(probs, 1).squeeze(-1))


@given(batch=st.integers(1, 8), action_dim=st.integers(1, 5), log_std=st.floats(-3.0, 2.0))
def test_gaussian_entropy_is_the_normal_entropy_summed_over_dims(
    batch: int, action_dim: int, log_std: float
) -> None:
    policy = make_policy("gaussian", obs_dim=3, action_dim=action_dim, init_log_std=log_std)
    obs = states(batch, 3, seed=4)
    _, info = policy.predict_action_batch({"states": obs})
    out = policy(forward_inputs=info["forward_inputs"])
    expected = Normal(policy.actor(obs), torch.tensor(log_std).exp()).entropy().sum(-1)
    torch.testing.assert_close(out["entropy"], expected)
    normal = Normal(policy.actor(obs), torch.tensor(log_std).exp())
    raw = info["forward_inputs"]["action"]
    torch.testing.assert_close(out["logprobs"], normal.log_prob(raw).sum(-1))


def test_requested_keys_only_and_values_absent_without_a_critic() -> None:
    policy = make_policy("gaussian")
    obs = {"states": states(3, 3, seed=5)}
    _, info = policy.predict_action_batch(obs, compute_values=False)
    assert set(info) == {"prev_logprobs", "forward_inputs"}
    _, info = policy.predict_action_batch(obs)
    assert info["prev_values"].shape == (3,)
    inputs = info["forward_inputs"]
    assert set(inputs) == {"states", "action"}
    assert set(policy(forward_inputs=inputs, compute_entropy=False)) == {"logprobs", "values"}
    assert set(policy(forward_inputs=inputs, compute_logprobs=False, compute_values=False)) == {
        "entropy"
    }
    values_only = {"compute_logprobs": False, "compute_entropy": False}
    assert set(policy(forward_inputs={"states": obs["states"]}, **values_only)) == {"values"}
    sac = make_policy("tanh_gaussian")
    _, info = sac.predict_action_batch(obs)
    assert "prev_values" not in info
    assert "values" not in sac(forward_inputs=info["forward_inputs"])


def test_sac_forward_is_reparameterised_and_sac_q_forward_gives_twin_values() -> None:
    torch.manual_seed(0)
    policy = make_policy("tanh_gaussian", obs_dim=4, action_dim=3)
    obs = states(6, 4, seed=6)
    actions, logprobs = policy(ForwardType.SAC, states=obs)
    assert actions.shape == (6, 3)
    assert logprobs.shape == (6,)
    assert (actions.abs() <= 1).all()
    q1, q2 = policy("sac_q", states=obs, actions=actions)
    assert q1.shape == q2.shape == (6,)
    (0.2 * logprobs - torch.minimum(q1, q2)).mean().backward()
    for name, param in policy.actor.named_parameters():
        assert param.grad is not None, f"actor.{name} got no gradient"
        assert param.grad.abs().sum() > 0, f"actor.{name} got a zero gradient"
    assert policy.q1 is not None
    assert all(p.grad is not None for p in policy.q1.parameters())


def test_orthogonal_init_gains() -> None:
    policy = make_policy("gaussian", obs_dim=8, action_dim=2, hidden_sizes="16,16")
    first, head = policy.actor[0], policy.actor[-1]
    assert isinstance(first, torch.nn.Linear)
    assert isinstance(head, torch.nn.Linear)
    # Orthogonal with gain g: a tall [16, 8] W has Wᵀ W = g² I, a wide [2, 16] one W Wᵀ = g² I.
    torch.testing.assert_close(first.weight.T @ first.weight, 2.0 * torch.eye(8))
    torch.testing.assert_close(head.weight @ head.weight.T, 1e-4 * torch.eye(2))
    assert torch.count_nonzero(first.bias) == 0


def test_unsupported_and_unknown_forward_types() -> None:
    policy = make_policy("discrete")
    with pytest.raises(NotImplementedError, match="MLPPolicy does not support forward_type 'sft'"):
        policy(ForwardType.SFT)
    with pytest.raises(NotImplementedError, match=r"forward_type 'sac'.*'discrete'"):
        policy("sac", states=states(2, 3, seed=0))
    with pytest.raises(ValueError, match=r"unknown forward_type 'sack'.*did you mean 'sac'") as err:
        policy("sack")
    for member in ForwardType:
        assert f"'{member.value}'" in str(err.value)


class MinimalPolicy(BasePolicy):
    """Only the abstract methods: every optional forward type is unsupported."""

    def default_forward(
        self,
        forward_inputs: dict[str, torch.Tensor],
        compute_logprobs: bool = True,
        compute_entropy: bool = True,
        compute_values: bool = True,
    ) -> dict[str, torch.Tensor]:
        return {"logprobs": self.require_input(forward_inputs, "logits").sum(-1)}

    def predict_action_batch(
        self, env_obs: dict[str, Any], mode: str = "train", compute_values: bool = True
    ) -> tuple[torch.Tensor, ActionInfo]:
        raise AssertionError("not called")


@pytest.mark.parametrize("forward_type", ["sft", "sac", "sac_q"])
def test_the_base_optional_forwards_name_the_class(forward_type: str) -> None:
    with pytest.raises(
        NotImplementedError, match=f"MinimalPolicy does not support forward_type '{forward_type}'"
    ):
        MinimalPolicy()(forward_type)
    assert MinimalPolicy()(forward_inputs={"logits": torch.ones(2, 3)})["logprobs"].shape == (2,)


def test_abstract_methods_must_be_implemented() -> None:
    with pytest.raises(TypeError, match="abstract"):
        BasePolicy()  # type: ignore[abstract]


def test_a_missing_input_names_the_key_the_class_and_what_is_there() -> None:
    policy = make_policy("gaussian")
    with pytest.raises(MissingInputError) as err:
        policy(forward_inputs={"states": states(2, 3, seed=0)})
    assert isinstance(err.value, KeyError)
    assert str(err.value) == "MLPPolicy needs forward_inputs['action'], but it holds only 'states'"
    with pytest.raises(KeyError, match=r"MLPPolicy needs env_obs\['states'\].*'main_images'"):
        policy.predict_action_batch({"main_images": torch.zeros(2, 8, 8, 3)})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action_dim": 2, "action_type": "discrete"}, r"model_kwargs\.obs_dim: missing"),
        (
            {"obs_dim": 0, "action_dim": 2, "action_type": "discrete"},
            r"obs_dim: expected a positive int, got 0",
        ),
        (
            {"obs_dim": 3, "action_dim": True, "action_type": "discrete"},
            r"action_dim: expected a positive int",
        ),
        ({"obs_dim": 3, "action_dim": 2}, r"model_kwargs\.action_type: missing"),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "gausian"},
            r"action_type: got 'gausian' \(did you mean 'gaussian'\?\)",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "discrete", "hiden_sizes": "8"},
            r"unknown key '.*model_kwargs\.hiden_sizes' \(did you mean 'hidden_sizes'\?\)",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "discrete", "action_low": -1.0},
            r"model_kwargs\.action_low: not read with action_type 'discrete'",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "tanh_gaussian", "init_log_std": 0.0},
            r"model_kwargs\.init_log_std: not read",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "discrete", "action_hi": 1.0},
            r"unknown key '.*\.action_hi' \(did you mean 'action_high'\?\); mlp_policy reads "
            r"obs_dim, action_dim, action_type, hidden_sizes, activation, orthogonal_init, "
            r"normalize_obs$",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "discrete", "action_high": 1.0},
            r"action_high: not read with action_type 'discrete' \(only with 'gaussian', "
            r"'tanh_gaussian'\)$",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "discrete", "hidden_sizes": "64,x"},
            r"model_kwargs\.hidden_sizes: expected comma-separated positive ints",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "discrete", "activation": "gelu"},
            r"model_kwargs\.activation: got 'gelu'",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "gaussian", "action_low": "0,0,0"},
            r"model_kwargs\.action_low: 3 bounds for action_dim 2",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "gaussian", "action_high": "1,nope"},
            r"model_kwargs\.action_high: expected a finite float",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "gaussian", "action_low": 1.0},
            r"model_kwargs\.action_low: dimension 0 has low 1\.0 >= high 1\.0",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "gaussian", "init_log_std": "big"},
            r"model_kwargs\.init_log_std: expected a finite float",
        ),
        (
            {"obs_dim": 3, "action_dim": 2, "action_type": "discrete", "orthogonal_init": 1},
            r"model_kwargs\.orthogonal_init: expected true or false",
        ),
    ],
)
def test_builder_errors_name_the_key(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MLPPolicySpec.from_kwargs(kwargs)


def test_booleans_may_be_given_as_true_or_false_strings() -> None:
    kwargs = {"obs_dim": 3, "action_dim": 2, "action_type": "discrete"}
    spec = MLPPolicySpec.from_kwargs(
        {**kwargs, "orthogonal_init": "false", "normalize_obs": "True"}
    )
    assert (spec.orthogonal_init, spec.normalize_obs) == (False, True)


def test_get_model_builds_an_mlp_policy_in_the_configured_dtype() -> None:
    cfg = ModelConfig(
        model_type="mlp_policy",
        category="embodied",
        precision="bf16",
        model_kwargs={
            "obs_dim": 4,
            "action_dim": 2,
            "action_type": "tanh_gaussian",
            "hidden_sizes": "32",
            "activation": "relu",
            "action_low": "-2,-1",
            "action_high": 2.0,
        },
    )
    policy = get_model(cfg)
    assert isinstance(policy, MLPPolicy)
    assert policy.spec.hidden_sizes == (32,)
    assert policy.spec.action_low == (-2.0, -1.0)
    assert policy.spec.action_high == (2.0, 2.0)
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    assert policy.action_low.dtype == torch.float32
    actions, info = policy.predict_action_batch({"states": torch.randn(3, 4)})
    assert actions.dtype == torch.float32
    assert info["prev_logprobs"].dtype == torch.float32
    with pytest.raises(ValueError, match="registered as a embodied model"):
        get_model(ModelConfig(model_type="mlp_policy", model_kwargs=cfg.model_kwargs))


# ---------------------------------------------------------------------------
# Observation normalisation (normalize_obs).


@pytest.mark.parametrize("action_type", ["discrete", "gaussian"])
def test_normalize_obs_tracks_every_train_state_and_feeds_the_networks_normalised_states(
    action_type: str,
) -> None:
    policy = make_policy(action_type, obs_dim=3, normalize_obs=True)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(5, 3, generator=g) * 4.0 + 7.0 for _ in range(4)]
    for batch in batches:
        _, info = policy.predict_action_batch({"states": batch}, mode="train")
    seen = torch.cat(batches).double()
    torch.testing.assert_close(policy.obs_mean, seen.mean(0))
    torch.testing.assert_close(policy.obs_m2 / policy.obs_count, seen.var(0, unbiased=False))
    # The last batch was normalised with statistics that include it, clipped to ±10.
    want = (batches[-1].double() - seen.mean(0)) / (seen.var(0, unbiased=False) + 1e-8).sqrt()
    torch.testing.assert_close(info["forward_inputs"]["states"], want.clamp(-10, 10).float())
    # The update recomputes the rollout's log-probs from what it cached.
    out = policy.default_forward(info["forward_inputs"])
    torch.testing.assert_close(out["logprobs"], info["prev_logprobs"])
    # Evaluation reads the statistics without changing them; they live in the state dict.
    count = policy.obs_count.clone()
    policy.predict_action_batch({"states": batches[0] * 100}, mode="eval")
    assert torch.equal(policy.obs_count, count)
    again = make_policy(action_type, obs_dim=3, normalize_obs=True)
    again.load_state_dict(policy.state_dict())
    torch.testing.assert_close(again.obs_mean, policy.obs_mean)


def test_normalize_obs_is_refused_for_sac_policies() -> None:
    with pytest.raises(
        ValueError, match="normalize_obs: not read with action_type 'tanh_gaussian'"
    ):
        make_policy("tanh_gaussian", normalize_obs=True)
