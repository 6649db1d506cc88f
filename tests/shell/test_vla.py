"""The built-in ``tiny_vla``: action tokens, log-prob agreement, LoRA, FSDP units, PPO on pixels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from attrs import evolve
from torch.distributed.fsdp import FSDPModule
from transformers import TemperatureLogitsWarper

from rlshell.config import ActorConfig, EnvConfig, FSDPConfig, ModelConfig, WrapPolicyConfig
from rlshell.engines.training.fsdp import FSDPModelManager, wrap_units
from rlshell.envs.stepper import EnvStepper
from rlshell.envs.text import encode_texts
from rlshell.models import ForwardType, get_model
from rlshell.models.base import MissingInputError
from rlshell.models.tiny_vla import ActionTokenLogitsProcessor, TinyVLA
from rlshell.rollout.trajectory import TrajectoryBuffer
from rlshell.tokenizer import build_char_tokenizer
from rlshell.workers.embodied_update import PPOSettings, collect_rollout, ppo_update

TINY = {
    "n_action_bins": 32,
    "image_size": 32,
    "patch_size": 8,
    "vision_width": 16,
    "vision_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
}
TASKS = ["balance the pole", "go", "pick up the red block", "balance the pole", "x"]
UNITS = ("vision_tower", "projector", "decoder_layer", "value_head")


def model_config(action_dim: int = 3, **extra: Any) -> ModelConfig:
    options = {k: extra.pop(k) for k in ("is_lora", "lora_rank", "precision", "path") if k in extra}
    kwargs = {"action_dim": action_dim, **TINY, **extra}
    return ModelConfig(model_type="tiny_vla", category="embodied", model_kwargs=kwargs, **options)


def make_vla(action_dim: int = 3, **extra: Any) -> TinyVLA:
    model = get_model(model_config(action_dim, **extra))
    assert isinstance(model, TinyVLA)
    return model


def observation(batch: int = 5, seed: int = 0, size: int = 32) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (batch, size, size, 3), generator=gen).byte()
    return {"main_images": images, "task_descriptions": (TASKS * batch)[:batch]}


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_rollout_logprobs_and_values_match_the_teacher_forced_forward(
    temperature: float, mode: str
) -> None:
    """Prompts of different lengths (left padding) and three action tokens per row, fp32."""
    torch.manual_seed(0)
    policy = make_vla(temperature=temperature)
    actions, info = policy.predict_action_batch(observation(), mode=mode)  # type: ignore[arg-type]
    inputs = info["forward_inputs"]
    assert set(inputs) == {"input_ids", "attention_mask", "pixel_values", "action_tokens"}
    tokens = inputs["action_tokens"]
    assert tokens.shape == (5, 3)
    assert bool((tokens >= policy.vocab_size - 32).all() and (tokens < policy.vocab_size).all())
    out = policy(ForwardType.DEFAULT, forward_inputs=inputs)
    assert info["prev_logprobs"].shape == out["logprobs"].shape == (5,)
    torch.testing.assert_close(out["logprobs"], info["prev_logprobs"], atol=1e-5, rtol=0)
    torch.testing.assert_close(out["values"], info["prev_values"], atol=1e-5, rtol=0)
    # Each token's entropy is at most log(32 bins), the uniform's.
    assert bool(
        (out["entropy"] > 0).all()
        and (out["entropy"] <= 3 * torch.log(torch.tensor(32.0)) + 1e-4).all()
    )
    assert actions.shape == (5, 3)


def test_the_processor_and_temperature_sample_the_distribution_the_logprobs_score() -> None:
    """HF's processed scores (mask, then temperature) give log-softmax over the bins of z/τ."""
    logits = torch.randn(4, 50)
    processed = TemperatureLogitsWarper(0.7)(
        torch.zeros(4, 1, dtype=torch.long),
        ActionTokenLogitsProcessor(first_id=40, count=10)(
            torch.zeros(4, 1, dtype=torch.long), logits
        ),
    )
    assert bool(torch.isinf(processed[:, :40]).all())
    expected = torch.log_softmax(logits[:, 40:] / 0.7, dim=-1)
    torch.testing.assert_close(torch.log_softmax(processed, dim=-1)[:, 40:], expected)


def test_actions_are_the_bins_de_normalised_with_q01_and_q99(tmp_path: Path) -> None:
    stats = {
        "robot_a": {"action": {"q01": [-0.5, 0.0, 1.0], "q99": [0.5, 2.0, 1.0]}},
        "robot_b": {"action": {"q01": [-2.0] * 3, "q99": [4.0] * 3, "mask": [True, True, False]}},
    }
    path = tmp_path / "dataset_statistics.json"
    path.write_text(json.dumps(stats))
    torch.manual_seed(0)
    for key, source in (("robot_a", json.dumps(stats)), ("robot_b", str(path))):
        policy = make_vla(norm_stats=source, unnorm_key=key)
        actions, info = policy.predict_action_batch(observation(64), mode="train")
        x = -1.0 + 2.0 * (info["forward_inputs"]["action_tokens"] - policy.first_action_id) / 31
        low, high = (torch.tensor(stats[key]["action"][q]) for q in ("q01", "q99"))
        expected = 0.5 * (x + 1.0) * (high - low) + low
        if key == "robot_b":
            expected[:, 2] = x[:, 2]  # the mask leaves the last dimension in [-1, 1]
        torch.testing.assert_close(actions, expected)
        assert bool(
            (
                (actions >= torch.minimum(low, -torch.ones(3))) & (actions <= high.clamp(min=1.0))
            ).all()
        )
    with pytest.raises(ValueError, match=r"unnorm_key: norm_stats holds 2 datasets"):
        make_vla(norm_stats=json.dumps(stats))
    with pytest.raises(ValueError, match=r"q01: expected 2 numbers \(action_dim\)"):
        make_vla(action_dim=2, norm_stats=json.dumps(stats), unnorm_key="robot_a")


def test_eval_is_deterministic_and_reads_encoded_task_descriptions() -> None:
    torch.manual_seed(0)
    policy = make_vla()
    obs = observation()
    first, _ = policy.predict_action_batch(obs, mode="eval")
    encoded = {**obs, "task_descriptions": encode_texts(obs["task_descriptions"], width=32)}
    second, _ = policy.predict_action_batch(encoded, mode="eval")
    assert torch.equal(first, second)
    assert bool((first.abs() <= 1.0).all())  # no norm_stats: bins on [-1, 1]


def test_missing_inputs_and_bad_kwargs_name_the_key() -> None:
    policy = make_vla()
    obs = observation(2)
    with pytest.raises(MissingInputError, match=r"TinyVLA needs env_obs\['task_descriptions'\]"):
        policy.predict_action_batch({"main_images": obs["main_images"]})
    _, info = policy.predict_action_batch(obs)
    inputs = {k: v for k, v in info["forward_inputs"].items() if k != "action_tokens"}
    with pytest.raises(MissingInputError, match=r"forward_inputs\['action_tokens'\]"):
        policy(forward_inputs=inputs)
    with pytest.raises(ValueError, match=r"images must be uint8 \[batch, 32, 32, 3\]"):
        policy.predict_action_batch({**obs, "main_images": obs["main_images"].float()})
    with pytest.raises(ValueError, match=r"prompt_length: the prompt for task 'go' has 41 tokens"):
        make_vla(prompt_length=40).predict_action_batch({**obs, "task_descriptions": ["go", "go"]})
    with pytest.raises(ValueError, match=r"unknown key.*hiden_size.*did you mean 'hidden_size'"):
        make_vla(hiden_size=8)
    with pytest.raises(ValueError, match=r"patch_size: 5 does not divide image_size 32"):
        make_vla(patch_size=5)
    with pytest.raises(ValueError, match=r"vocab_size: 40 is too small"):
        make_vla(vocab_size=40)


def test_lora_trains_the_adapters_and_the_value_head_only() -> None:
    torch.manual_seed(0)
    plain = make_vla()
    torch.manual_seed(0)
    policy = make_vla(is_lora=True, lora_rank=4)
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable, "nothing to train"
    assert all("lora_" in name or name.startswith("value_head.") for name in trainable)
    assert {n for n in trainable if n.startswith("value_head.")} == {
        n for n, _ in policy.value_head.named_parameters(prefix="value_head")
    }
    adapted = {name.split(".")[-4] for name in trainable if "lora_A" in name}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    frozen = {
        name: p.detach().clone() for name, p in policy.named_parameters() if not p.requires_grad
    }
    # B starts at zero: the adapted model computes what the plain one does.
    obs = observation()
    _, info = plain.predict_action_batch(obs, mode="eval")
    torch.testing.assert_close(
        policy(forward_inputs=info["forward_inputs"])["logprobs"],
        plain(forward_inputs=info["forward_inputs"])["logprobs"],
    )
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        out = policy(forward_inputs=info["forward_inputs"])
        (out["logprobs"].mean() + out["values"].square().mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(p, frozen[n]) for n, p in policy.named_parameters() if n in frozen)
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in policy.named_parameters())
    with pytest.raises(
        ValueError, match=r"is_lora: model type 'mlp_policy'.*does not support LoRA"
    ):
        get_model(
            ModelConfig(
                model_type="mlp_policy",
                category="embodied",
                is_lora=True,
                model_kwargs={"obs_dim": 2, "action_dim": 2, "action_type": "discrete"},
            )
        )


def test_the_wrap_policy_finds_the_vla_units_by_name_class_or_default() -> None:
    policy = make_vla()
    expected = [
        *policy.language_model.model.layers,  # type: ignore[union-attr]
        policy.vision_tower,
        policy.projector,
        policy.value_head,
    ]
    by_name = wrap_units(policy, WrapPolicyConfig(no_split_names=UNITS))
    by_class = wrap_units(
        policy,
        WrapPolicyConfig(
            transformer_layer_cls_to_wrap=("LlamaDecoderLayer",),
            module_classes_to_wrap=("VisionTower", "VisionProjector", "ValueHead"),
        ),
    )
    default = wrap_units(policy, WrapPolicyConfig())
    for units in (by_name, by_class, default):
        assert sorted(map(id, units)) == sorted(map(id, expected))


def test_the_fsdp_manager_shards_the_vla_units_and_trains_after_a_rollout(
    process_group: None,
) -> None:
    """bf16 FSDP units on one gloo rank; rollout first (through predict_action_batch), then PPO."""
    actor = ActorConfig(
        model=model_config(action_dim=1),
        fsdp_config=FSDPConfig(
            mixed_precision="bf16", wrap_policy=WrapPolicyConfig(no_split_names=UNITS)
        ),
    )
    manager = FSDPModelManager(actor, total_steps=2, device=torch.device("cpu"))
    manager.setup_model_and_optimizer()
    model = manager.module
    sharded = {name for name, module in model.named_modules() if isinstance(module, FSDPModule)}
    assert sharded == {
        "",
        "language_model.model.layers.0",
        "language_model.model.layers.1",
        "vision_tower",
        "projector",
        "value_head",
    }
    with manager.unsharded() as policy:
        actions, info = policy.predict_action_batch(observation(4))
    assert actions.shape == (4, 1)
    out = model(ForwardType.DEFAULT, forward_inputs=info["forward_inputs"])
    torch.testing.assert_close(out["logprobs"], info["prev_logprobs"], atol=0.05, rtol=0)
    (-(out["logprobs"].mean()) + out["values"].square().mean()).backward()
    grad_norm, _ = manager.optimizer_step()
    assert grad_norm > 0


def test_the_language_model_loads_from_a_local_directory(tmp_path: Path) -> None:
    """A saved LM and tokenizer: the action ids are the last bins of that vocabulary."""
    torch.manual_seed(0)
    built = make_vla(action_dim=2)
    built.language_model.save_pretrained(tmp_path)  # type: ignore[operator]
    build_char_tokenizer("abcdefghijklmnopqrstuvwxyz ?").save_pretrained(tmp_path)
    kwargs = {
        k: v
        for k, v in TINY.items()
        if k in ("n_action_bins", "image_size", "patch_size", "vision_width", "vision_layers")
    }
    cfg = evolve(
        model_config(action_dim=2), path=str(tmp_path), model_kwargs={"action_dim": 2, **kwargs}
    )
    loaded = get_model(cfg)
    assert isinstance(loaded, TinyVLA)
    assert loaded.first_action_id == built.first_action_id
    _, info = loaded.predict_action_batch(observation(2))
    out = loaded(forward_inputs=info["forward_inputs"])
    torch.testing.assert_close(out["logprobs"], info["prev_logprobs"], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"hidden_size: the LM is loaded from actor.model.path"):
        get_model(evolve(cfg, model_kwargs={**cfg.model_kwargs, "hidden_size": 8}))


def test_ppo_trains_the_vla_on_pixel_cartpole() -> None:
    """Two PPO iterations, 4 envs × 8 steps, episodes cut at 6 steps (the truncation bootstrap)."""
    torch.manual_seed(0)
    policy = make_vla(action_dim=1, image_size=64, patch_size=16)
    cfg = EnvConfig(
        env_type="gymnasium_pixels",
        env_id="CartPole-v1",
        num_envs=4,
        max_episode_steps=6,
        control_mode="continuous",
    )
    stepper = EnvStepper.from_config(cfg, seed=0)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    buffer, generator = TrajectoryBuffer(4), torch.Generator().manual_seed(0)
    obs = stepper.reset(seed=0)
    for _ in range(2):
        obs = collect_rollout(policy, stepper, buffer, obs, steps=8)
        metrics = ppo_update(
            policy,
            optimizer,
            buffer.finish(gamma=0.99, lam=0.95),
            PPOSettings(ppo_epochs=2, num_minibatches=2),
            generator,
        )
        assert all(torch.isfinite(torch.tensor(value)) for value in metrics.values())
    assert stepper.pop_metrics()["env/episodes"] > 0
    changed = [name for name, p in policy.named_parameters() if not torch.equal(before[name], p)]
    assert len(changed) == len(before)
