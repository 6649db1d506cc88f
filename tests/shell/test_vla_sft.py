"""``tiny_vla``'s behaviour cloning: actions to bins (the de-normalisation's inverse) and
``sft_forward``, the bins' negative log-likelihood under teacher forcing."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from attrs import evolve

from rlshell.envs.text import encode_texts
from rlshell.models import ForwardType
from rlshell.models.base import MissingInputError
from rlshell.models.tiny_vla import ActionUnnormalizer, TinyVLASpec
from rlshell.workers.embodied_sft import sft_loss_of
from tests.shell.test_vla import make_vla, observation

STATS = {
    # q99 = q01 in the last dimension: every bin acts 1.0 there.
    "plain": {"action": {"q01": [-0.5, 0.0, 1.0], "q99": [0.5, 2.0, 1.0]}},
    "masked": {"action": {"q01": [-2.0, 3.0, -7.0], "q99": [4.0, 3.5, 9.0], "mask": [1, 0, 1]}},
}


def unnormalizer(key: str | None, n_bins: int = 32) -> ActionUnnormalizer:
    norm_stats = None if key is None else json.dumps(STATS)
    return ActionUnnormalizer(
        TinyVLASpec(action_dim=3, n_action_bins=n_bins, norm_stats=norm_stats, unnorm_key=key)
    )


@pytest.mark.parametrize("n_bins", [2, 32, 256])
@pytest.mark.parametrize("key", [None, "plain", "masked"])
def test_nearest_bins_inverts_the_de_normalisation_on_every_bin(
    key: str | None, n_bins: int
) -> None:
    bins = unnormalizer(key, n_bins)
    every = torch.arange(n_bins)[:, None].expand(n_bins, 3)
    actions = bins(every)
    found = bins.nearest_bins(actions)
    assert found.dtype == torch.int64
    assert found.shape == (n_bins, 3)
    assert torch.equal(bins(found), actions)
    # Bin by bin where the bins act differently (not where q99 = q01).
    distinct = slice(0, 2) if key == "plain" else slice(0, 3)
    assert torch.equal(found[:, distinct], every[:, distinct])


@pytest.mark.parametrize("key", [None, "plain", "masked"])
def test_nearest_bins_takes_the_closest_bin_and_clips_outside_the_range(key: str | None) -> None:
    bins = unnormalizer(key)
    gen = torch.Generator().manual_seed(0)
    low = torch.where(bins.mask, bins.q01, -1.0)
    high = torch.where(bins.mask, bins.q99, 1.0)
    # Half again beyond each end: a quarter of the draws lies outside [low, high].
    actions = low + (high - low) * (2 * torch.rand(2000, 3, generator=gen) - 0.5)
    found = bins.nearest_bins(actions)
    # The bin whose action is nearest, by brute force over all 32 (first on a tie).
    every = bins(torch.arange(32)[:, None].expand(32, 3))
    nearest = (actions[:, None, :] - every[None]).abs().argmin(dim=1)
    acted, expected = bins(found), bins(nearest)
    torch.testing.assert_close(acted, expected, atol=1e-5, rtol=0)
    assert torch.equal(found[actions < low], torch.zeros_like(found[actions < low]))
    assert bool((found[actions > high] == 31).all())
    assert bool(((acted >= low) & (acted <= high)).all())


def test_nearest_bins_refuses_nan() -> None:
    with pytest.raises(ValueError, match="NaN or infinity"):
        unnormalizer("masked").nearest_bins(torch.tensor([[0.0, float("nan"), 0.0]]))


def test_the_loss_is_the_mean_nll_of_the_bins_at_temperature_one_with_gradients() -> None:
    """The loss is −mean log π of the actions' bins in `default_forward`'s teacher-forced
    pass at τ = 1 (the policy samples at τ = 0.6); task descriptions as the env's code
    points; the workers' `sft_loss_of` accepts it."""
    torch.manual_seed(0)
    policy = make_vla(temperature=0.6, norm_stats=json.dumps(STATS), unnorm_key="masked")
    obs = observation(4)
    obs["task_descriptions"] = encode_texts(obs["task_descriptions"], width=32)
    actions = torch.randn(4, 3) * 3
    out = policy(ForwardType.SFT, actions=actions, **obs)
    assert set(out) == {"loss", "accuracy"}
    loss = out["loss"]
    assert loss.dim() == 0
    assert bool(torch.isfinite(loss))
    assert loss.requires_grad
    assert 0.0 <= float(out["accuracy"]) <= 1.0
    assert not out["accuracy"].requires_grad
    assert torch.equal(sft_loss_of(policy, obs, actions), loss)

    input_ids, attention_mask = policy.tokenize_prompts(
        ["balance the pole", "go", "pick up the red block", "balance the pole"], torch.device("cpu")
    )
    forward_inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "pixel_values": obs["main_images"],
        "action_tokens": policy.unnormalize.nearest_bins(actions) + policy.first_action_id,
    }
    policy.spec = evolve(policy.spec, temperature=1.0)
    logprobs = policy(forward_inputs=forward_inputs, compute_entropy=False, compute_values=False)
    torch.testing.assert_close(loss, -logprobs["logprobs"].sum() / 12, atol=1e-6, rtol=0)

    loss.backward()
    for part in (policy.vision_tower, policy.projector, policy.language_model):
        grads = [p.grad for p in part.parameters() if p.grad is not None]
        assert any(bool(g.abs().sum() > 0) for g in grads), type(part).__name__
    assert all(p.grad is None for p in policy.value_head.parameters())


def test_wrong_actions_or_observations_are_named() -> None:
    policy = make_vla()
    obs = observation(2)
    for shape in ((2, 4), (2, 1, 3), (3, 3), (6,)):
        with pytest.raises(ValueError, match=r"actions must be \[batch, action_dim\] = \[2, 3\]"):
            policy.sft_forward(torch.zeros(shape), **obs)
    with pytest.raises(MissingInputError, match=r"TinyVLA needs observation\['main_images'\]"):
        policy.sft_forward(torch.zeros(2, 3), task_descriptions=obs["task_descriptions"])
    three_images = observation(3)["main_images"]
    with pytest.raises(ValueError, match="2 task descriptions for 3 images"):
        policy.sft_forward(torch.zeros(3, 3), **{**obs, "main_images": three_images})


def test_a_few_dozen_adam_steps_clone_fixed_demonstrations() -> None:
    """Four (image, task) → action pairs: the bins are learned, and eval acts on them."""
    torch.manual_seed(0)
    policy = make_vla(norm_stats=json.dumps(STATS), unnorm_key="masked")
    obs: dict[str, Any] = observation(4, seed=1)
    targets = torch.tensor([[-1.5, 0.2, 8.0], [3.0, -0.9, -6.0], [0.0, 0.0, 0.0], [2.2, 0.7, 1.0]])
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    policy.train()
    for _ in range(60):
        out = policy.sft_forward(targets, **obs)
        optimizer.zero_grad()
        torch.autograd.backward(out["loss"])
        optimizer.step()
    policy.eval()
    with torch.no_grad():
        final = policy.sft_forward(targets, **obs)
        acted, _ = policy.predict_action_batch(obs, mode="eval", compute_values=False)
    assert float(final["accuracy"]) == 1.0
    assert float(final["loss"]) < 0.3
    torch.testing.assert_close(acted, policy.unnormalize(policy.unnormalize.nearest_bins(targets)))
    # Within half a bin of the target in every dimension the bins reach.
    half_bin = torch.tensor([6.0, 2.0, 16.0]) / 31 / 2
    assert bool(((acted - targets).abs() <= half_bin + 1e-6).all())
