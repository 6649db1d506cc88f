"""Model registry: ``register_model(model_type, builder, category)`` and ``get_model(cfg)``.

RLinf's pattern, kept so models port with renamed imports: a builder is
``builder(cfg, torch_dtype) -> nn.Module``, registered under a model type and
a category (``"embodied"`` or ``"reasoning"``); `get_model` looks the type up
and builds with the dtype named by ``cfg.precision``. An extension module
(``RLSHELL_EXT_MODULE``) registers its own models in every process.

``cfg.is_lora`` adds LoRA adapters of rank ``cfg.lora_rank`` and scale
``cfg.lora_alpha`` / rank (peft) where ``cfg.lora_target_modules`` says, else
where the model names them: its ``lora_target_modules`` (module-name
suffixes such as ``q_proj``, or peft's ``all-linear``), with
``lora_trainable_modules`` (e.g. a value head) trained in full and every
other weight frozen (`rlshell.models.lora.apply_lora`). A model that names
no targets, configured with none, refuses ``is_lora``.

``cfg.checkpoint`` (``actor.model.checkpoint``) starts the built model from
an earlier run's policy weights (`rlshell.checkpoint.load_policy_weights`),
before any adapters are added: every process that builds the policy (actor,
rollout, reference) builds the same one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from attrs import frozen
from torch import nn

from rlcore.registry import Registry
from rlshell.checkpoint import load_policy_weights
from rlshell.config import ModelConfig, Precision
from rlshell.models.base import BasePolicy, ForwardType
from rlshell.models.lora import apply_lora

__all__ = [
    "MODELS",
    "BasePolicy",
    "ForwardType",
    "ModelBuilder",
    "ModelEntry",
    "apply_lora",
    "as_policy",
    "get_model",
    "register_model",
    "torch_dtype",
]

ModelBuilder = Callable[[ModelConfig, torch.dtype], nn.Module]
Category = Literal["embodied", "reasoning"]

_DTYPES: dict[Precision, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


@frozen
class ModelEntry:
    """A registered builder and the family of runs it serves."""

    builder: ModelBuilder
    category: Category


MODELS: Registry[ModelEntry] = Registry("model type")


def register_model(
    model_type: str, builder: ModelBuilder, category: Category = "embodied", force: bool = False
) -> ModelBuilder:
    """Register ``builder`` under ``model_type``; ``force=True`` replaces an existing entry."""
    if category not in ("embodied", "reasoning"):
        raise ValueError(
            f"register_model('{model_type}'): category must be 'embodied' or 'reasoning', "
            f"got {category!r}"
        )
    MODELS.register(model_type, ModelEntry(builder, category), force=force)
    return builder


def torch_dtype(precision: Precision) -> torch.dtype:
    """The torch dtype a precision name stands for."""
    return _DTYPES[precision]


def get_model(cfg: ModelConfig) -> nn.Module:
    """Build the model ``cfg.model_type`` names, in the dtype ``cfg.precision`` names.

    With ``cfg.checkpoint`` its weights are that checkpoint's policy's; with
    ``cfg.is_lora`` the model then gets LoRA adapters (`apply_lora`).
    """
    entry = MODELS.get(cfg.model_type)
    if entry.category != cfg.category:
        raise ValueError(
            f"model type '{cfg.model_type}' is registered as a {entry.category} model, "
            f"but the config asks for category '{cfg.category}'"
        )
    model = entry.builder(cfg, torch_dtype(cfg.precision))
    if cfg.checkpoint is not None:
        load_policy_weights(Path(cfg.checkpoint), model)
    if not cfg.is_lora:
        return model
    return apply_lora(
        model,
        cfg.lora_rank,
        cfg.model_type,
        alpha=cfg.lora_alpha,
        target_modules=cfg.lora_target_modules,
    )


def as_policy(
    model: nn.Module, cfg: ModelConfig, error: type[Exception] = TypeError, why: str = ""
) -> BasePolicy:
    """``model``, which ``cfg`` built, as a `BasePolicy`; otherwise ``error`` saying what
    ``actor.model.model_type`` builds instead (``why``: what a policy was needed for)."""
    if not isinstance(model, BasePolicy):
        raise error(
            f"actor.model.model_type '{cfg.model_type}' builds a {type(model).__name__}, "
            f"not a rlshell.models.BasePolicy{why}"
        )
    return model


def build_tiny_vla(cfg: ModelConfig, dtype: torch.dtype) -> nn.Module:
    """``tiny_vla``'s builder (`rlshell.models.tiny_vla`), imported when first used.

    The module imports transformers' generation classes; importing it only
    here keeps ``import rlshell.models`` light.
    """
    from rlshell.models.tiny_vla import build_tiny_vla as build

    return build(cfg, dtype)


def _register_builtins() -> None:
    from rlshell.models.cnn_policy import build_cnn_policy
    from rlshell.models.flow_policy import build_flow_policy
    from rlshell.models.hf_causal_lm import build_hf_causal_lm, build_hf_value_model
    from rlshell.models.mlp_policy import build_mlp_policy

    register_model("hf_causal_lm", build_hf_causal_lm, category="reasoning")
    register_model("hf_value_model", build_hf_value_model, category="reasoning")
    register_model("mlp_policy", build_mlp_policy, category="embodied")
    register_model("cnn_policy", build_cnn_policy, category="embodied")
    register_model("tiny_vla", build_tiny_vla, category="embodied")
    register_model("flow_policy", build_flow_policy, category="embodied")


_register_builtins()
