"""RLinf's model options through ``actor.model.model_kwargs``: lists and nested values reach
the builder, the loading options are typed and reach ``from_pretrained``, an option the
model refuses is named, remote code runs only when trusted, and ``_no_split_names`` picks
FSDP units."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from attrs import evolve
from torch import nn

from rlshell.config import ConfigError, ModelConfig, WrapPolicyConfig
from rlshell.config.loading import read_config
from rlshell.engines.training.fsdp import wrap_units
from rlshell.models import MODELS, get_model, register_model
from rlshell.runners.validation import load_config

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 64,
}
ROPE = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 causal LM saved as a Hugging Face directory (no Hub)."""
    directory = tmp_path_factory.mktemp("tiny-qwen2")
    config = transformers.Qwen2Config(**TINY)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


@pytest.fixture
def recording_builder() -> Iterator[list[ModelConfig]]:
    """A registered model type whose builder records the `ModelConfig` it is given."""
    seen: list[ModelConfig] = []

    def build(cfg: ModelConfig, dtype: torch.dtype) -> nn.Module:
        seen.append(cfg)
        return nn.Linear(2, 2, dtype=dtype)

    register_model("recording_policy", build, category="embodied")
    yield seen
    MODELS.unregister("recording_policy")


def test_lists_and_nested_values_reach_the_builder_from_a_file_and_from_overrides(
    recording_builder: list[ModelConfig],
) -> None:
    source = {
        "actor": {
            "model": {
                "model_type": "recording_policy",
                "category": "embodied",
                "model_kwargs": {"image_size": [224, 224], "openpi": {"task": "eval", "n": 3}},
            }
        }
    }
    config = read_config(
        source,
        [
            "actor.model.model_kwargs.unnorm_key=libero_10_no_noops",
            'actor.model.model_kwargs.norm={"mean": [0.5, 0.25], "fixed": null, "on": true}',
            "actor.model.model_kwargs.low_cpu_mem_usage=true",
        ],
    )
    get_model(config.actor.model)
    (seen,) = recording_builder
    assert seen.model_kwargs == {
        "image_size": [224, 224],
        "openpi": {"task": "eval", "n": 3},
        "unnorm_key": "libero_10_no_noops",
        "norm": {"mean": [0.5, 0.25], "fixed": None, "on": True},
        "low_cpu_mem_usage": True,
    }


def test_a_value_no_yaml_could_hold_is_refused_with_its_path() -> None:
    with pytest.raises(ConfigError) as raised:
        read_config({"actor": {"model": {"model_kwargs": {"sizes": [1, {2: 3}], "s": {1, 2}}}}})
    assert raised.value.problems == [
        "actor.model.model_kwargs.sizes: expected string keys, got 2 (at [1])",
        "actor.model.model_kwargs.s: expected a number, string, boolean, null, list or "
        "mapping, got set {1, 2}",
    ]
    with pytest.raises(ConfigError, match=r"actor\.model\.model_kwargs\.x: expected a JSON list"):
        read_config("configs/grpo.py", ["actor.model.model_kwargs.x=[1, 2"])


def test_options_reach_from_pretrained_typed_and_passed_through(saved_model: Path) -> None:
    cfg = ModelConfig(
        path=str(saved_model),
        model_kwargs={
            "attn_implementation": "eager",
            "low_cpu_mem_usage": True,
            "trust_remote_code": False,
            "torch_dtype": "float32",
            "rope_parameters": ROPE,
            "layer_types": ["full_attention", "full_attention"],
        },
    )
    model: Any = get_model(cfg)
    assert model.config._attn_implementation == "eager"
    assert model.config.rope_parameters == ROPE
    assert model.config.layer_types == ["full_attention", "full_attention"]
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, TINY["vocab_size"])


def test_a_model_built_from_its_config_takes_the_loading_options_and_nested_fields() -> None:
    config = load_config(
        "configs/grpo.py",
        [
            "actor.model.model_kwargs.attn_implementation=eager",
            f"actor.model.model_kwargs.rope_parameters={json.dumps(ROPE)}",
        ],
    )
    model: Any = get_model(config.actor.model)
    assert model.config._attn_implementation == "eager"
    assert model.config.rope_parameters == ROPE


def test_an_option_the_model_refuses_is_named(saved_model: Path) -> None:
    cfg = ModelConfig(path=str(saved_model), model_kwargs={"unnorm_key": "libero_10_no_noops"})
    with pytest.raises(ValueError, match="unnorm_key") as raised:
        get_model(cfg)
    message = str(raised.value)
    assert message.startswith(
        f"actor.model.model_kwargs.unnorm_key: the model at {saved_model} refused it: "
    )
    assert "unexpected keyword argument 'unnorm_key'" in message

    built = ModelConfig(model_kwargs={**TINY, "attn_implementation": "no_such_kernel"})
    with pytest.raises(ValueError, match=r"^actor\.model\.model_kwargs\.attn_implementation: "):
        get_model(built)


@pytest.mark.parametrize(
    ("kwargs", "path", "message"),
    [
        (
            {"trust_remote_code": "maybe"},
            True,
            "actor.model.model_kwargs.trust_remote_code: expected true or false, got 'maybe'",
        ),
        (
            {"attn_implementation": 2},
            True,
            "actor.model.model_kwargs.attn_implementation: expected a name such as 'sdpa'",
        ),
        (
            {"torch_dtype": "float16"},
            True,
            "actor.model.model_kwargs.torch_dtype: 'float16' is not actor.model.precision's "
            "dtype (float32)",
        ),
        (
            {"low_cpu_mem_usage": True},
            False,
            "actor.model.model_kwargs.low_cpu_mem_usage: only read when the weights are loaded "
            "from actor.model.path",
        ),
    ],
)
def test_a_bad_loading_option_is_named(
    saved_model: Path, kwargs: dict[str, Any], path: bool, message: str
) -> None:
    cfg = ModelConfig(path=str(saved_model) if path else None, model_kwargs=kwargs)
    with pytest.raises(ValueError, match=r"^actor\.model\.model_kwargs\.") as raised:
        get_model(cfg)
    assert str(raised.value).startswith(message)


def test_a_value_model_refuses_a_field_it_sets_itself() -> None:
    cfg = ModelConfig(model_type="hf_value_model", model_kwargs={**TINY, "num_labels": 3})
    with pytest.raises(ValueError, match=r"model_kwargs\.num_labels: .* sets it itself"):
        get_model(cfg)


REMOTE_CONFIG = """
    import transformers

    class RemoteConfig(transformers.Qwen2Config):
        model_type = "remote_qwen2"
"""
REMOTE_MODEL = """
    import transformers
    from .configuration_remote import RemoteConfig

    class RemoteForCausalLM(transformers.Qwen2ForCausalLM):
        config_class = RemoteConfig
        ran_remote_code = True
"""


@pytest.fixture
def remote_code_model(tmp_path: Path, saved_model: Path) -> Path:
    """A model directory whose config's auto_map names Python files of its own."""
    directory = tmp_path / "remote"
    directory.mkdir()
    for file in saved_model.iterdir():
        (directory / file.name).write_bytes(file.read_bytes())
    (directory / "configuration_remote.py").write_text(textwrap.dedent(REMOTE_CONFIG))
    (directory / "modeling_remote.py").write_text(textwrap.dedent(REMOTE_MODEL))
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "remote_qwen2"
    config["auto_map"] = {
        "AutoConfig": "configuration_remote.RemoteConfig",
        "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_remote_code_runs_only_when_the_config_trusts_it(remote_code_model: Path) -> None:
    untrusted = ModelConfig(path=str(remote_code_model))
    with pytest.raises(ValueError, match="trust_remote_code") as raised:
        get_model(untrusted)
    assert str(raised.value).startswith("actor.model.model_kwargs.trust_remote_code: ")
    assert "custom code" in str(raised.value)

    trusted = evolve(untrusted, model_kwargs={"trust_remote_code": True})
    model = get_model(trusted)
    assert type(model).__name__ == "RemoteForCausalLM"
    assert getattr(model, "ran_remote_code", False)


def test_no_split_names_join_the_wrap_fallback() -> None:
    model: Any = get_model(ModelConfig(model_kwargs=dict(TINY)))
    layers = [type(unit).__name__ for unit in wrap_units(model, WrapPolicyConfig())]
    assert layers == ["Qwen2DecoderLayer"] * TINY["num_hidden_layers"]
    model.model.norm._fsdp_wrap_name = "final_norm"
    model.lm_head._fsdp_wrap_name = "lm_head"
    model._no_split_names = ["final_norm", "lm_head"]
    units = wrap_units(model, WrapPolicyConfig())
    assert units == [*model.model.layers, model.model.norm, model.lm_head]
    model._no_split_modules = None  # the names alone still pick units
    assert wrap_units(model, WrapPolicyConfig()) == [model.model.norm, model.lm_head]
    # a policy that names units replaces the model's own lists
    only = wrap_units(model, WrapPolicyConfig(module_classes_to_wrap=("Qwen2MLP",)))
    assert [type(unit).__name__ for unit in only] == ["Qwen2MLP"] * TINY["num_hidden_layers"]


def test_a_config_class_description_gives_way_to_the_checkpoint_but_options_still_apply(
    saved_model: Path,
) -> None:
    config = load_config(
        "configs/grpo.py",
        [f"actor.model.path={saved_model}", "actor.model.model_kwargs.attn_implementation=eager"],
    )
    assert config.actor.model.model_kwargs["hidden_size"] != TINY["hidden_size"]
    model: Any = get_model(config.actor.model)
    assert model.config.hidden_size == TINY["hidden_size"]  # the checkpoint's, not grpo.py's
    assert model.config._attn_implementation == "eager"
