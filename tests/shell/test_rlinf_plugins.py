"""RLinf's plug-in signatures (`rlshell.rlinf_plugins`): advantages and policy losses written
RLinf's way, adapted onto rlcore's registries, checked at the boundary, and trained with by
the embodied PPO runner and the reasoning runner.

The plug-ins the runs train with are `tests/shell/rlinf_plugins_ext.py`'s, written as
RLinf's docs describe them (keyword arguments, ``**kwargs``, tuple returns).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlcore.advantages import AdvantageBatch, AdvantageConfig
from rlcore.losses import PolicyLossBatch, PolicyLossConfig, entropy_loss, value_loss
from rlcore.losses import ppo_policy_loss as rlcore_ppo_policy_loss
from rlcore.masked import masked_whiten
from rlcore.registry import ADVANTAGES, POLICY_LOSSES
from rlshell.config import ConfigError, EnvConfig, ModelConfig
from rlshell.envs.stepper import EnvStepper
from rlshell.metrics import read_metrics
from rlshell.models import BasePolicy, get_model
from rlshell.models.base import ForwardType
from rlshell.rlinf_plugins import (
    PluginNonFiniteError,
    PluginOutputError,
    register_advantage,
    register_policy_loss,
)
from rlshell.rollout.trajectory import Samples
from rlshell.runners.validation import load_config
from rlshell.workers.embodied_grpo import collect_group_episodes, group_samples
from rlshell.workers.embodied_update import PPOSettings, ppo_loss, ppo_update
from tests.shell.test_run import cli_env, train

HERE = Path(__file__).parent
CARTPOLE = "configs/ppo_cartpole.py"
CARTPOLE_POLICY = {"obs_dim": 4, "action_dim": 2, "action_type": "discrete"}


@pytest.fixture
def registered() -> Iterator[Callable[[str], None]]:
    """Names registered by a test, unregistered after it (the registries are process-wide)."""
    names: list[tuple[Any, str]] = []

    def note(name: str) -> None:
        for registry in (ADVANTAGES, POLICY_LOSSES):
            if name in registry:
                names.append((registry, name))

    yield note
    for registry, name in names:
        if name in registry:
            registry.unregister(name)


@pytest.fixture
def ext_plugins() -> Iterator[None]:
    """`rlinf_plugins_ext` imported here (its decorators register both plug-ins), and
    unregistered after the test."""
    sys.path.insert(0, str(HERE))
    try:
        sys.modules.pop("rlinf_plugins_ext", None)
        import rlinf_plugins_ext  # noqa: F401

        yield
    finally:
        sys.path.remove(str(HERE))
        sys.modules.pop("rlinf_plugins_ext", None)
        for registry, name in ((ADVANTAGES, "rlinf_sign"), (POLICY_LOSSES, "rlinf_clip")):
            if name in registry:
                registry.unregister(name)


def _token_batch(
    mask: torch.Tensor, group_size: int = 1, values: bool = False, seed: int = 0
) -> AdvantageBatch:
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(mask.shape, generator=generator) * mask
    return AdvantageBatch(
        token_rewards=rewards,
        mask=mask,
        group_size=group_size,
        values=torch.randn(mask.shape, generator=generator) if values else None,
    )


def _lengths_mask(lengths: list[int], steps: int) -> torch.Tensor:
    return torch.arange(steps)[None, :] < torch.tensor(lengths)[:, None]


def _loss_batch(rows: int = 3, steps: int = 4, seed: int = 0) -> PolicyLossBatch:
    generator = torch.Generator().manual_seed(seed)
    logprobs = (-torch.rand(rows, steps, generator=generator)).requires_grad_()
    old = logprobs.detach() + 0.1 * torch.randn(rows, steps, generator=generator)
    advantages = torch.randn(rows, steps, generator=generator)
    mask = _lengths_mask([steps, steps - 1, 1][:rows], steps)
    return PolicyLossBatch(logprobs, old, advantages, mask)


# --------------------------------------------------------------------------- registration


def test_the_decorators_return_the_function_and_register_it_lowercased(
    registered: Callable[[str], None],
) -> None:
    def my_adv(rewards, loss_mask, **kwargs):  # type: ignore[no-untyped-def]
        return rewards * loss_mask, None

    def my_loss(logprobs, advantages, loss_mask, loss_agg_func, **kwargs):  # type: ignore[no-untyped-def]
        return loss_agg_func(-logprobs * advantages, loss_mask), {}

    assert register_advantage("My_Adv")(my_adv) is my_adv
    assert register_policy_loss("My_Loss")(my_loss) is my_loss
    registered("my_adv")
    registered("my_loss")
    assert "my_adv" in ADVANTAGES
    assert "My_Adv" not in ADVANTAGES
    assert "my_loss" in POLICY_LOSSES
    # Registering the same function again (an extension imported twice) changes nothing;
    # another function under the name is refused unless forced.
    register_advantage("my_adv")(my_adv)

    def other(rewards, **kwargs):  # type: ignore[no-untyped-def]
        return rewards, None

    with pytest.raises(KeyError, match="advantage estimator 'my_adv' is already registered"):
        register_advantage("my_adv")(other)
    register_advantage("my_adv", force=True)(other)
    assert ADVANTAGES.get("my_adv").fn is other  # type: ignore[attr-defined]


def test_the_hyperparameters_read_are_those_the_signature_names(
    registered: Callable[[str], None],
) -> None:
    def discounted(rewards, loss_mask, gamma=1.0):  # type: ignore[no-untyped-def]
        return rewards, None

    def low_clip_only(logprobs, old_logprobs, advantages, loss_mask, clip_ratio_low):  # type: ignore[no-untyped-def]
        ratio = torch.exp(logprobs - old_logprobs).clamp(max=1 + clip_ratio_low)
        return -(ratio * advantages)[loss_mask].mean(), {}

    def anything(**kwargs):  # type: ignore[no-untyped-def]
        return kwargs["advantages"].sum() * 0 + kwargs["logprobs"].sum(), {}

    register_advantage("discounted")(discounted)
    register_policy_loss("low_clip_only")(low_clip_only)
    register_policy_loss("anything")(anything)
    for name in ("discounted", "low_clip_only", "anything"):
        registered(name)
    assert ADVANTAGES.reads("discounted") == {"gamma"}
    assert POLICY_LOSSES.reads("low_clip_only") == {"clip_low"}
    assert POLICY_LOSSES.reads("anything") == POLICY_LOSSES.hyperparameters
    # The reasoning runner then refuses the keys of those it does not read.
    with pytest.raises(ConfigError) as error:
        load_config(
            "configs/grpo.py",
            [
                "algorithm.adv_type=discounted",
                "algorithm.loss_type=low_clip_only",
                "algorithm.lam=0.9",
            ],
        )
    assert any(
        problem.startswith("algorithm.lam: the 'discounted' advantage estimator")
        for problem in error.value.problems
    ), error.value.problems


def test_an_argument_rlstack_does_not_pass_is_refused_when_registered() -> None:
    def needs_chunks(rewards, num_action_chunks, **kwargs):  # type: ignore[no-untyped-def]
        return rewards, None

    with pytest.raises(TypeError, match=r"advantage 'chunky' \(.*needs_chunks\) requires "):
        register_advantage("chunky")(needs_chunks)
    assert "chunky" not in ADVANTAGES

    def needs_ratio(logprobs, loss_mask_sum, **kwargs):  # type: ignore[no-untyped-def]
        return logprobs.sum(), {}

    with pytest.raises(TypeError, match=r"\['loss_mask_sum'\], which rlstack does not pass"):
        register_policy_loss("ratioed")(needs_ratio)
    assert "ratioed" not in POLICY_LOSSES


# ------------------------------------------------------------------------ advantages: inputs


def test_an_advantage_gets_rlinfs_time_first_layout() -> None:
    seen: dict[str, Any] = {}

    def recording(**kwargs):  # type: ignore[no-untyped-def]
        seen.update(kwargs)
        return kwargs["rewards"] * 2, kwargs["rewards"] * 3

    register_advantage("recording_adv")(recording)
    try:
        mask = _lengths_mask([3, 1, 2, 3], 3)
        batch = _token_batch(mask, group_size=2, values=True)
        config = AdvantageConfig(gamma=0.9, lam=0.8, whiten=False)
        out = ADVANTAGES.get("recording_adv")(batch, config)
    finally:
        ADVANTAGES.unregister("recording_adv")
    torch.testing.assert_close(seen["rewards"], batch.token_rewards.T)
    assert torch.equal(seen["loss_mask"], mask.T)
    # dones[t + 1] marks each row's last valid step; the values get a zero row to bootstrap from.
    expected_dones = torch.zeros(4, 4, dtype=torch.bool)
    expected_dones[[3, 1, 2, 3], [0, 1, 2, 3]] = True
    assert torch.equal(seen["dones"], expected_dones)
    assert batch.values is not None
    torch.testing.assert_close(seen["values"][:3], batch.values.T)
    assert torch.equal(seen["values"][3], torch.zeros(4))
    torch.testing.assert_close(seen["reward_scores"], batch.token_rewards.sum(1))
    assert (seen["group_size"], seen["gamma"], seen["gae_lambda"]) == (2, 0.9, 0.8)
    assert seen["normalize_advantages"] is False
    assert seen["adv_type"] == "recording_adv"
    assert seen["logprobs"] is None
    assert seen["teacher_logprobs"] is None
    # Back batch first; zero where the mask is not set.
    torch.testing.assert_close(out.advantages, batch.token_rewards * 2)
    torch.testing.assert_close(out.returns, batch.token_rewards * 3)


def test_an_advantage_working_in_place_leaves_the_batch_as_it_was() -> None:
    def in_place(rewards, loss_mask, **kwargs):  # type: ignore[no-untyped-def]
        rewards -= 1.0
        loss_mask.fill_(True)
        return rewards * 0, None

    batch = _token_batch(_lengths_mask([3, 1], 3))
    before = (batch.token_rewards.clone(), batch.mask.clone())
    register_advantage("in_place")(in_place)
    try:
        ADVANTAGES.get("in_place")(batch, AdvantageConfig())
    finally:
        ADVANTAGES.unregister("in_place")
    assert torch.equal(batch.token_rewards, before[0])
    assert torch.equal(batch.mask, before[1])


def rlinf_gae(
    rewards, gamma=1.0, gae_lambda=1.0, values=None, loss_mask=None, dones=None, **kwargs
):  # type: ignore[no-untyped-def]
    """GAE as RLinf's docs show it: a reverse loop over the time-first tensors."""
    advantages = torch.zeros_like(rewards)
    gae = torch.zeros_like(rewards[0])
    for step in reversed(range(rewards.shape[0])):
        delta = rewards[step] + gamma * values[step + 1] * (~dones[step + 1]) - values[step]
        gae = delta + gamma * gae_lambda * (~dones[step + 1]) * gae
        advantages[step] = gae
    return advantages, advantages + values[:-1]


@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=5),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_rlinfs_gae_through_the_adapter_is_rlcores_gae(
    lengths: list[int], gamma: float, lam: float, seed: int
) -> None:
    """The layout is RLinf's: its GAE loop, registered as written, gives rlcore's GAE."""
    mask = _lengths_mask(lengths, max(lengths))
    batch = _token_batch(mask, values=True, seed=seed)
    config = AdvantageConfig(gamma=gamma, lam=lam, whiten=False)
    register_advantage("rlinf_gae")(rlinf_gae)
    try:
        ours = ADVANTAGES.get("rlinf_gae")(batch, config)
    finally:
        ADVANTAGES.unregister("rlinf_gae")
    reference = ADVANTAGES.get("gae")(batch, config)
    torch.testing.assert_close(ours.advantages * mask, reference.advantages * mask)
    torch.testing.assert_close(ours.returns * mask, reference.returns * mask)


def test_an_advantage_that_requires_values_names_the_missing_critic(
    registered: Callable[[str], None],
) -> None:
    register_advantage("needs_values")(_requires_values)
    registered("needs_values")
    with pytest.raises(ValueError, match=r"'needs_values' .* requires values, and this run trains"):
        ADVANTAGES.get("needs_values")(_token_batch(_lengths_mask([2], 2)), AdvantageConfig())


def _requires_values(rewards, values, dones, **kwargs):  # type: ignore[no-untyped-def]
    return rewards - values[:-1], None


# ----------------------------------------------------------------------- advantages: outputs


def _advantage_returning(result: Callable[[dict[str, Any]], Any]) -> Any:
    def plugin(**kwargs):  # type: ignore[no-untyped-def]
        return result(kwargs)

    register_advantage("returns_this", force=True)(plugin)
    try:
        batch = _token_batch(_lengths_mask([3, 2], 3), group_size=2)
        return ADVANTAGES.get("returns_this")(batch, AdvantageConfig())
    finally:
        ADVANTAGES.unregister("returns_this")


@pytest.mark.parametrize(
    ("result", "error", "words"),
    [
        (
            lambda kw: kw["rewards"],
            PluginOutputError,
            "returned a Tensor; RLinf's plug-ins return (advantages, returns)",
        ),
        (lambda kw: (kw["rewards"],), PluginOutputError, "returned a 1-tuple"),
        (
            lambda kw: (kw["rewards"].T, None),
            PluginOutputError,
            "advantages of shape (2, 3); expected (3, 2) ([T, B], as rewards) (batch first",
        ),
        (
            lambda kw: (kw["rewards"][:2], None),
            PluginOutputError,
            "advantages of shape (2, 2); expected (3, 2)",
        ),
        (
            lambda kw: (kw["loss_mask"].long(), None),
            PluginOutputError,
            "advantages as torch.int64; expected a float dtype",
        ),
        (
            lambda kw: (kw["rewards"], [1.0]),
            PluginOutputError,
            "returns as a list; expected a float tensor",
        ),
        (
            lambda kw: (kw["rewards"] / 0 * kw["loss_mask"] + torch.nan, None),
            PluginNonFiniteError,
            "advantages with 5 NaN or infinite value(s) where loss_mask is set, the first nan at "
            "step 0 of row 0",
        ),
        (
            lambda kw: (
                kw["rewards"],
                torch.where(kw["loss_mask"], 1.0, 0.0).index_put(
                    (torch.tensor([1]), torch.tensor([1])), torch.tensor(float("inf"))
                ),
            ),
            PluginNonFiniteError,
            "returns with 1 NaN or infinite value(s) where loss_mask is set, the first inf at "
            "step 1 of row 1",
        ),
    ],
)
def test_a_wrong_advantage_output_names_the_plugin_and_the_tensor(
    result: Callable[[dict[str, Any]], Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as raised:
        _advantage_returning(result)
    message = str(raised.value)
    assert message.startswith("advantage 'returns_this' (tests.shell.test_rlinf_plugins"), message
    assert words in message, message


def test_nan_where_the_mask_is_unset_is_zeroed_not_refused() -> None:
    out = _advantage_returning(
        lambda kw: (torch.where(kw["loss_mask"], kw["rewards"], torch.nan), None)
    )
    assert torch.isfinite(out.advantages).all()
    assert out.advantages[1, 2] == 0  # row 1's third step is padding
    assert out.returns is out.advantages or torch.equal(out.returns, out.advantages)


# ---------------------------------------------------------------------------- policy losses


def test_a_policy_loss_gets_rlinfs_arguments_and_its_metrics_are_kept(ext_plugins: None) -> None:
    batch = _loss_batch()
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.28)
    out = POLICY_LOSSES.get("rlinf_clip")(batch, config)
    reference = rlcore_ppo_policy_loss(
        batch.logprobs, batch.old_logprobs, batch.advantages, batch.mask, 0.2, 0.28
    )
    # The same clipped surrogate, aggregated by the run's loss_agg_func (token-mean here).
    torch.testing.assert_close(out.loss, reference.loss)
    assert set(out.metrics) == {"policy_loss", "plugin_called", "sign_advantages"}
    assert float(out.metrics["plugin_called"]) == 1.0
    out.loss.backward()
    assert batch.logprobs.grad is not None
    assert batch.logprobs.grad.abs().sum() > 0


def _loss_returning(result: Callable[[dict[str, Any]], Any], **config: Any) -> Any:
    def plugin(**kwargs):  # type: ignore[no-untyped-def]
        return result(kwargs)

    register_policy_loss("returns_this", force=True)(plugin)
    try:
        return POLICY_LOSSES.get("returns_this")(_loss_batch(), PolicyLossConfig(**config))
    finally:
        POLICY_LOSSES.unregister("returns_this")


def _mean_loss(kw: dict[str, Any]) -> torch.Tensor:
    return kw["loss_agg_func"](-kw["logprobs"] * kw["advantages"], kw["loss_mask"])


@pytest.mark.parametrize(
    ("result", "error", "words"),
    [
        (
            _mean_loss,
            PluginOutputError,
            "returned a Tensor; RLinf's plug-ins return (loss, metrics)",
        ),
        (
            lambda kw: (-kw["logprobs"] * kw["advantages"], {}),
            PluginOutputError,
            "a loss of shape (3, 4); expected a scalar",
        ),
        (
            lambda kw: (_mean_loss(kw) * torch.nan, {}),
            PluginNonFiniteError,
            "returned a loss of nan",
        ),
        (
            lambda kw: (_mean_loss(kw).detach(), {}),
            PluginOutputError,
            "a loss with no gradient: it does not depend on logprobs",
        ),
        (lambda kw: (1.0, {}), PluginOutputError, "returned a float as its loss"),
        (
            lambda kw: (_mean_loss(kw), [("kl", 0.1)]),
            PluginOutputError,
            "its metrics as a list; expected a dict",
        ),
        (
            lambda kw: (_mean_loss(kw), {"actor/ratio": kw["logprobs"].detach()}),
            PluginOutputError,
            "metric 'actor/ratio' of shape (3, 4); expected a scalar",
        ),
        (lambda kw: (_mean_loss(kw), {"note": "ok"}), PluginOutputError, "metric 'note' as a str"),
    ],
)
def test_a_wrong_policy_loss_output_names_the_plugin_and_what_was_wrong(
    result: Callable[[dict[str, Any]], Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as raised:
        _loss_returning(result)
    message = str(raised.value)
    assert message.startswith("policy loss 'returns_this' (tests.shell.test_rlinf_plugins"), message
    assert words in message, message


def test_an_error_inside_a_plugin_notes_what_it_was_given() -> None:
    """RLinf's actor-critic loss reads the critic's returns from **kwargs; rlstack adds the
    value loss itself and passes none: the KeyError says what was passed."""
    with pytest.raises(KeyError) as raised:
        _loss_returning(lambda kw: (_mean_loss(kw) + kw["returns"].sum(), {}))
    (note,) = raised.value.__notes__
    assert note.startswith("in policy loss 'returns_this' (tests.shell.test_rlinf_plugins")
    assert note.endswith(
        "called with: logprobs, old_logprobs, advantages, loss_mask, "
        "clip_ratio_low, clip_ratio_high, clip_ratio_c, behave_weight_threshold, "
        "proximal_logprobs, weights, loss_agg_func, loss_type"
    )


def test_a_nan_loss_is_a_floating_point_error_as_the_updates_own_checks_raise() -> None:
    with pytest.raises(FloatingPointError):
        _loss_returning(lambda kw: (_mean_loss(kw) * torch.nan, {}))


def test_the_clip_settings_reach_a_loss_under_rlinfs_names() -> None:
    seen: dict[str, Any] = {}

    def record(kw: dict[str, Any]) -> Any:
        seen.update(kw)
        return _mean_loss(kw), {}

    _loss_returning(record, clip_low=0.1, dual_clip=3.0)
    assert (seen["clip_ratio_low"], seen["clip_ratio_high"], seen["clip_ratio_c"]) == (
        0.1,
        0.1,
        3.0,
    )
    _loss_returning(record)
    assert (seen["clip_ratio_low"], seen["clip_ratio_high"], seen["clip_ratio_c"]) == (
        0.2,
        0.2,
        None,
    )
    assert seen["loss_type"] == "returns_this"
    assert seen["proximal_logprobs"] is None


def test_token_weights_a_loss_cannot_take_are_refused(registered: Callable[[str], None]) -> None:
    def unweighted(logprobs, advantages, loss_mask, loss_agg_func):  # type: ignore[no-untyped-def]
        return loss_agg_func(-logprobs * advantages, loss_mask), {}

    register_policy_loss("unweighted")(unweighted)
    registered("unweighted")
    batch = _loss_batch()
    weighted = PolicyLossBatch(
        batch.logprobs,
        batch.old_logprobs,
        batch.advantages,
        batch.mask,
        weights=torch.ones_like(batch.advantages),
    )
    with pytest.raises(ValueError, match=r"'unweighted' .* takes no weights, and this run weighs"):
        POLICY_LOSSES.get("unweighted")(weighted, PolicyLossConfig())


def test_a_loss_requiring_proximal_logprobs_says_it_needs_them(
    registered: Callable[[str], None],
) -> None:
    def decoupled(logprobs, proximal_logprobs, advantages, loss_mask, loss_agg_func, **kwargs):  # type: ignore[no-untyped-def]
        return loss_agg_func(-(logprobs - proximal_logprobs) * advantages, loss_mask), {}

    register_policy_loss("my_decoupled")(decoupled)
    registered("my_decoupled")
    assert POLICY_LOSSES.needs("my_decoupled") == {"proximal_logprobs"}


# -------------------------------------------------------------------- the embodied PPO update


def _cartpole_policy(seed: int = 0) -> BasePolicy:
    torch.manual_seed(seed)
    model = get_model(
        ModelConfig(model_type="mlp_policy", category="embodied", model_kwargs=CARTPOLE_POLICY)
    )
    assert isinstance(model, BasePolicy)
    return model


def _samples(policy: BasePolicy, size: int = 16, seed: int = 0) -> Samples:
    generator = torch.Generator().manual_seed(seed)
    obs = {"states": torch.randn(size, 4, generator=generator)}
    with torch.no_grad():
        _, info = policy.predict_action_batch(obs, mode="train", compute_values=True)
    return Samples(
        forward_inputs=info["forward_inputs"],
        # Far enough from the policy's that PPO's clip bites on some samples.
        logprobs=info["prev_logprobs"] + 0.5 * torch.randn(size, generator=generator),
        values=info["prev_values"],
        advantages=torch.randn(size, generator=generator),
        returns=torch.randn(size, generator=generator),
    )


def _before_registries(
    out: dict[str, torch.Tensor], batch: Samples, settings: PPOSettings
) -> torch.Tensor:
    """The embodied update's loss as it was written before it called the registry: rlcore's
    ppo_policy_loss directly, clipped symmetrically by clip_coef (0.2 unset)."""
    mask = torch.ones_like(out["logprobs"], dtype=torch.bool)[:, None]
    advantages = masked_whiten(batch.advantages[:, None], mask)
    policy = rlcore_ppo_policy_loss(
        out["logprobs"][:, None],
        batch.logprobs[:, None],
        advantages,
        mask,
        clip_low=settings.clip_coef if settings.clip_coef is not None else 0.2,
    )
    critic = value_loss(
        out["values"][:, None],
        batch.values[:, None],
        batch.returns[:, None],
        mask,
        clip=settings.clip_vloss,
    )
    bonus = entropy_loss(out["entropy"][:, None], mask)
    return policy.loss + settings.vf_coef * critic.loss + settings.ent_coef * bonus.loss


@pytest.mark.parametrize(
    "settings", [PPOSettings(), PPOSettings(clip_coef=0.1, clip_vloss=0.2, ent_coef=0.01)]
)
def test_ppos_clipped_loss_through_the_registry_is_bit_identical(settings: PPOSettings) -> None:
    """The default ``algorithm.loss_type='ppo'`` gives today's loss and gradients, bit for bit."""
    policy = _cartpole_policy()
    batch = _samples(policy)
    grads = []
    losses = []
    for compute in (
        lambda out: ppo_loss(out, batch, settings).loss,
        lambda out: _before_registries(out, batch, settings),
    ):
        policy.zero_grad()
        out = policy(ForwardType.DEFAULT, forward_inputs=batch.forward_inputs)
        loss = compute(out)
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in policy.parameters() if p.grad is not None])
    assert float(ppo_loss(out, batch, settings).policy_metrics["clipfrac"]) > 0
    assert torch.equal(losses[0], losses[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_the_embodied_update_trains_with_a_registered_plugin_loss(ext_plugins: None) -> None:
    policy = _cartpole_policy()
    batch = _samples(policy, size=32)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    settings = PPOSettings(ppo_epochs=2, num_minibatches=2, loss_type="rlinf_clip", norm_adv=False)
    before = [p.detach().clone() for p in policy.parameters()]
    metrics = ppo_update(policy, optimizer, batch, settings, torch.Generator().manual_seed(0))
    assert metrics["train/plugin_called"] == 1.0
    assert "train/clipfrac" not in metrics  # PPO's built-in did not run
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    # target_kl reads the loss's approx_kl, which this one does not report: said so.
    with pytest.raises(ValueError, match=r"'rlinf_clip' \(algorithm.loss_type\) reports none"):
        ppo_update(
            policy,
            optimizer,
            batch,
            PPOSettings(loss_type="rlinf_clip", target_kl=0.01),
            torch.Generator().manual_seed(0),
        )


def test_embodied_group_episodes_are_scored_by_a_registered_plugin(ext_plugins: None) -> None:
    """Embodied GRPO's windows through an RLinf-style advantage: every valid step of an
    episode gets the sign of its return against its group's mean."""
    policy = _cartpole_policy()
    stepper = EnvStepper.from_config(
        EnvConfig(env_type="gymnasium", env_id="CartPole-v1", num_envs=4), 0
    )
    window, _ = collect_group_episodes(policy, stepper, seed=3, group_size=2, max_steps=200)
    samples = group_samples(window, "rlinf_sign", 2)
    returns = window.returns.view(-1, 2)
    signs = torch.sign(returns - returns.mean(-1, keepdim=True)).reshape(-1)
    expected = signs.expand_as(window.valid)[window.valid]  # [time, envs], valid steps in order
    torch.testing.assert_close(samples.advantages, expected)


# -------------------------------------------------------------------------------- validation


def _refusals(*overrides: str) -> list[str]:
    try:
        load_config(CARTPOLE, list(overrides))
    except ConfigError as error:
        return error.problems
    return []


def test_embodied_ppo_takes_any_registered_policy_loss(ext_plugins: None) -> None:
    assert _refusals("algorithm.loss_type=rlinf_clip") == []
    assert _refusals("algorithm.loss_type=gspo") == []
    assert (
        _refusals("algorithm.loss_type=ppo", "algorithm.clip_high=0.28", "algorithm.dual_clip=3")
        == []
    )
    (problem,) = _refusals("algorithm.loss_type=rlinf_clp")
    assert problem.startswith(
        "algorithm.loss_type: unknown policy loss 'rlinf_clp' (did you mean 'rlinf_clip'?)"
    )


def test_embodied_ppo_refuses_a_loss_needing_a_proximal_policy() -> None:
    (problem,) = _refusals("algorithm.loss_type=decoupled_ppo")
    assert problem.startswith("algorithm.loss_type: 'decoupled_ppo' needs a proximal policy's")


def test_embodied_ppo_refuses_compiling_a_plugin_loss(ext_plugins: None) -> None:
    (problem,) = _refusals("algorithm.loss_type=rlinf_clip", "actor.compile=true")
    assert problem.startswith("actor.compile: compiles PPO's update with algorithm.loss_type 'ppo'")


def test_embodied_ppo_refuses_clip_settings_its_loss_does_not_read(
    registered: Callable[[str], None],
) -> None:
    def low_clip_only(logprobs, old_logprobs, advantages, loss_mask, loss_agg_func, clip_ratio_low):  # type: ignore[no-untyped-def]
        ratio = torch.exp(logprobs - old_logprobs).clamp(max=1 + clip_ratio_low)
        return loss_agg_func(-ratio * advantages, loss_mask), {}

    register_policy_loss("low_clip_only")(low_clip_only)
    registered("low_clip_only")
    (problem,) = _refusals("algorithm.loss_type=low_clip_only", "algorithm.clip_high=0.3")
    assert problem.startswith(
        "algorithm.clip_high: the 'low_clip_only' policy loss (algorithm.loss_type) does not use"
    )


def test_embodied_ppo_refuses_an_advantage_needing_values_without_a_critic(
    registered: Callable[[str], None],
) -> None:
    register_advantage("needs_values")(_requires_values)
    registered("needs_values")
    problems = _refusals(
        "algorithm.adv_type=needs_values",
        "algorithm.group_size=2",
        "algorithm.gamma=1",
        "algorithm.lam=1",
        "algorithm.vf_coef=0.5",
    )
    assert [p.split(":")[0] for p in problems] == ["algorithm.adv_type"], problems
    assert "'needs_values' requires the critic's values" in problems[0]


# ------------------------------------------------------------------------------- real runs


@pytest.fixture
def plugin_env() -> Iterator[dict[str, str]]:
    ray_tmp = Path(tempfile.mkdtemp(prefix="rp", dir="/tmp"))
    yield cli_env(
        ray_tmp,
        RLSHELL_EXT_MODULE="rlinf_plugins_ext",
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_an_embodied_ppo_run_trains_with_rlinf_style_plugins(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    """CartPole, two updates: the advantage and the loss written RLinf's way, each called in
    the worker, the loss fed the plug-in advantage's −1/0/+1 (no whitening)."""
    result = train(
        CARTPOLE,
        "algorithm.adv_type=rlinf_sign",
        "algorithm.loss_type=rlinf_clip",
        "algorithm.norm_adv=false",
        "algorithm.group_size=2",
        # What the critic-free estimators leave unread, back to their defaults.
        "algorithm.gamma=1",
        "algorithm.lam=1",
        "algorithm.vf_coef=0.5",
        "runner.rollout_steps=50",
        "runner.max_steps=2",
        "algorithm.ppo_epochs=2",
        "checkpoint.interval=0",
        f"runner.output_dir={tmp_path}",
        env=plugin_env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = read_metrics(tmp_path / "ppo_cartpole" / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [1, 2]
    for record in records:
        assert record["train/plugin_called"] == 1.0
        assert record["train/sign_advantages"] == 1.0
        assert "train/clipfrac" not in record


@pytest.mark.slow
def test_a_reasoning_run_trains_with_rlinf_style_plugins(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    result = train(
        "configs/grpo.py",
        "algorithm.adv_type=rlinf_sign",
        "algorithm.loss_type=rlinf_clip",
        "runner.max_steps=2",
        "runner.prompts_per_step=2",
        "algorithm.group_size=2",
        "runner.eval_interval=0",
        "checkpoint.interval=0",
        f"runner.output_dir={tmp_path}",
        env=plugin_env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run,) = tmp_path.iterdir()
    records = [r for r in read_metrics(run / "metrics.jsonl") if "train/plugin_called" in r]
    assert [int(r["step"]) for r in records] == [1, 2]
    for record in records:
        assert record["train/plugin_called"] == 1.0
        assert record["train/sign_advantages"] == 1.0
