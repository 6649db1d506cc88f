"""The built-in ``hf_causal_lm`` model type: any Hugging Face causal LM, from disk or a config.

With ``cfg.path`` the model is loaded with ``AutoModelForCausalLM.from_pretrained``
from that local directory (nothing is downloaded) or Hub id (through the Hub
cache, `rlshell.hub`).
Without it, a fresh model is built from ``cfg.model_kwargs``: ``config_class``
names a transformers config class (default ``Qwen2Config``) and every other
entry is a field of it, e.g. ``{"hidden_size": 64, "num_hidden_layers": 2}``.
Either way the loading options of ``model_kwargs`` (``attn_implementation``,
``trust_remote_code``, ``low_cpu_mem_usage``) are typed and passed on, and with
``path`` every other entry goes to ``from_pretrained`` as it is
(`rlshell.models.pretrained_options`), unless ``model_kwargs`` names a
``config_class``: its entries then describe a model built from a config, and
with ``path`` the checkpoint's config takes their place (so ``configs/grpo.py
actor.model.path=...`` loads the checkpoint as it is).

LoRA (``actor.model.is_lora``): the model names peft's ``all-linear`` as its
``lora_target_modules``, every linear layer but the output head (for Qwen2
and Llama, the attention's ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and
the MLP's ``gate_proj``, ``up_proj``, ``down_proj``);
``actor.model.lora_target_modules`` names others (`rlshell.models.lora`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlshell.config import ModelConfig
from rlshell.models.pretrained_options import (
    DTYPE_KEYS,
    LOAD_OPTIONS,
    PretrainedOptions,
    refused_option,
)

__all__ = ["LORA_TARGET_MODULES", "build_hf_causal_lm", "build_hf_value_model", "hf_model_config"]

LORA_TARGET_MODULES = ("all-linear",)
"""Where a causal LM's LoRA adapters go unless ``actor.model.lora_target_modules`` says."""


def hf_model_config(cfg: ModelConfig) -> object:
    """The transformers config of the model ``cfg`` describes, without building the model
    (``cfg.path``: read from that directory or the Hub cache, with the config fields
    ``model_kwargs`` sets)."""
    import transformers

    options = _options(cfg, None)
    if cfg.path is not None:
        from rlshell.hub import from_pretrained

        path = cfg.path
        return refused_option(
            lambda: from_pretrained(
                transformers.AutoConfig,
                path,
                "actor.model.path",
                trust_remote_code=options.trust_remote_code,
                **options.passthrough,
            ),
            options.named(),
            f"the config at {path}",
        )
    class_name = str(cfg.model_kwargs.get("config_class", "Qwen2Config"))
    config_class = getattr(transformers, class_name, None)
    if config_class is None or not isinstance(config_class, type):
        raise ValueError(f"actor.model.model_kwargs.config_class: no transformers.{class_name}")
    return refused_option(
        lambda: config_class(**options.passthrough), options.named(), f"transformers.{class_name}"
    )


def build_hf_causal_lm(cfg: ModelConfig, torch_dtype: torch.dtype) -> nn.Module:
    """``hf_causal_lm``'s builder: ``cfg.path`` loaded, or a new model from ``model_kwargs``;
    the loading options ``model_kwargs`` carries go with it (`PretrainedOptions`)."""
    import transformers

    model = _build(transformers.AutoModelForCausalLM, cfg, torch_dtype, "actor.model.path", {})
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

    head: dict[str, object] = {"num_labels": 1, "classifier_dropout": 0.0}
    return _build(
        transformers.AutoModelForTokenClassification,
        cfg,
        torch_dtype,
        "critic.model_path (or actor.model.path)",
        head,
    )


def _options(cfg: ModelConfig, dtype: torch.dtype | None) -> PretrainedOptions:
    kwargs = cfg.model_kwargs
    if cfg.path is not None and "config_class" in kwargs:
        # The entries describe a model built from a config (configs/grpo.py's), which the
        # checkpoint's replaces: `configs/grpo.py actor.model.path=...` loads the checkpoint.
        kwargs = {key: kwargs[key] for key in kwargs if key in (*LOAD_OPTIONS, *DTYPE_KEYS)}
    return PretrainedOptions.read(
        kwargs, dtype, from_path=cfg.path is not None, skip=("config_class",)
    )


def _build(
    auto_class: Any, cfg: ModelConfig, dtype: torch.dtype, key: str, fixed: dict[str, object]
) -> nn.Module:
    """``auto_class`` from ``cfg.path`` or from ``hf_model_config(cfg)``, in ``dtype``, with
    ``model_kwargs``' loading options and the fields in ``fixed`` (which it may not set)."""
    options = _options(cfg, dtype)
    clash = sorted(set(fixed) & set(cfg.model_kwargs))
    if clash:
        raise ValueError(
            f"actor.model.model_kwargs.{clash[0]}: {auto_class.__name__} sets it itself "
            f"({clash[0]}={fixed[clash[0]]!r}); remove it"
        )
    if cfg.path is not None:
        from rlshell.hub import from_pretrained

        path = cfg.path
        loaded: nn.Module = refused_option(
            lambda: from_pretrained(
                auto_class,
                path,
                key,
                dtype=dtype,
                **options.loading(),
                **options.passthrough,
                **fixed,
            ),
            options.named(),
            f"the model at {path}",
        )
        return loaded
    config = hf_model_config(cfg)
    for name, value in fixed.items():
        setattr(config, name, value)
    built: nn.Module = refused_option(
        lambda: auto_class.from_config(config, dtype=dtype, **options.loading()),
        options.named(),
        type(config).__name__,
    )
    return built
