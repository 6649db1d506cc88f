"""The built-in ``hf_causal_lm`` model type: any Hugging Face causal LM, from disk or a config.

With ``cfg.path`` the model is loaded with ``AutoModelForCausalLM.from_pretrained``
from that local directory (nothing is downloaded) or Hub id (through the Hub
cache, `rlshell.hub`).
Without it, a fresh model is built from ``cfg.model_kwargs``: ``config_class``
names a transformers config class (default ``Qwen2Config``) and every other
entry is a field of it, e.g. ``{"hidden_size": 64, "num_hidden_layers": 2}``.

LoRA (``actor.model.is_lora``): the model names peft's ``all-linear`` as its
``lora_target_modules``, every linear layer but the output head (for Qwen2
and Llama, the attention's ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and
the MLP's ``gate_proj``, ``up_proj``, ``down_proj``);
``actor.model.lora_target_modules`` names others (`rlshell.models.lora`).
"""

from __future__ import annotations

import torch
from torch import nn

from rlshell.config import ModelConfig

__all__ = ["LORA_TARGET_MODULES", "build_hf_causal_lm", "build_hf_value_model", "hf_model_config"]

LORA_TARGET_MODULES = ("all-linear",)
"""Where a causal LM's LoRA adapters go unless ``actor.model.lora_target_modules`` says."""


def hf_model_config(cfg: ModelConfig) -> object:
    """The transformers config of the model ``cfg`` describes, without building the model
    (``cfg.path``: read from that directory or the Hub cache)."""
    import transformers

    if cfg.path is not None:
        from rlshell.hub import from_pretrained

        return from_pretrained(transformers.AutoConfig, cfg.path)
    kwargs = dict(cfg.model_kwargs)
    class_name = str(kwargs.pop("config_class", "Qwen2Config"))
    config_class = getattr(transformers, class_name, None)
    if config_class is None or not isinstance(config_class, type):
        raise ValueError(f"actor.model.model_kwargs.config_class: no transformers.{class_name}")
    return config_class(**kwargs)


def build_hf_causal_lm(cfg: ModelConfig, torch_dtype: torch.dtype) -> nn.Module:
    import transformers

    if cfg.path is not None:
        from rlshell.hub import from_pretrained

        model: nn.Module = from_pretrained(
            transformers.AutoModelForCausalLM, cfg.path, "actor.model.path", dtype=torch_dtype
        )
    else:
        model = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            hf_model_config(cfg), dtype=torch_dtype
        )
    model.lora_target_modules = LORA_TARGET_MODULES  # type: ignore[assignment]
    return model


def build_hf_value_model(cfg: ModelConfig, torch_dtype: torch.dtype) -> nn.Module:
    """The ``hf_value_model`` type: ``cfg``'s causal LM with a one-output token head (a
    critic): ``AutoModelForTokenClassification`` with ``num_labels=1``, whose logits
    ``[batch, time, 1]`` are the value of each position's state.

    From ``cfg.path`` the transformer comes from the checkpoint and the head is new (as
    verl's critic starts from the actor's weights); from ``cfg.model_kwargs`` the whole
    model is new. The head's dropout is off: a value is regressed, not classified.
    """
    import transformers

    options: dict[str, object] = {"num_labels": 1, "classifier_dropout": 0.0}
    if cfg.path is not None:
        from rlshell.hub import from_pretrained

        model: nn.Module = from_pretrained(
            transformers.AutoModelForTokenClassification,
            cfg.path,
            "critic.model_path (or actor.model.path)",
            dtype=torch_dtype,
            **options,
        )
        return model
    config = hf_model_config(cfg)
    for key, value in options.items():
        setattr(config, key, value)
    built: nn.Module = transformers.AutoModelForTokenClassification.from_config(  # type: ignore[no-untyped-call]
        config, dtype=torch_dtype
    )
    return built
