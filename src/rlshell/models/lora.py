"""LoRA adapters (peft) on a model, and the model's weights with the adapters merged in.

LoRA (Hu et al. 2021, arXiv:2106.09685) freezes a linear layer's weight W
``[out, in]`` and learns a low-rank update beside it:

    y = W x + s · B A x,    A ``[r, in]``, B ``[out, r]``, s = α / r

A starts random and B zero, so the adapted model starts equal to the
original. peft does the work: `apply_lora` injects its ``LoraLayer``s in
place (the model keeps its class and its forward; an adapted layer's weight
is renamed ``<layer>.base_layer.weight`` and the adapter's matrices are
``<layer>.lora_A.default.weight`` and ``<layer>.lora_B.default.weight``), and
only the adapters (and the modules a model names in
``lora_trainable_modules``) keep ``requires_grad``.

Where the adapters go: ``actor.model.lora_target_modules`` (module-name
suffixes, or ``all-linear``: peft's every linear layer but the output head),
else the model's own ``lora_target_modules`` (``hf_causal_lm``:
``all-linear``, the attention and MLP projections; ``tiny_vla``: its LM's
projections). A model that names none, configured with none, refuses LoRA.

Everything downstream of training sees the plain model: `MergedLoRAWeights`
turns the adapted model's tensors into the base model's names and values
(W + s·BA, with peft's ``get_delta_weight``) one tensor at a time, for the
weight sync to a rollout engine that holds the plain model; `merge_lora`
merges in place with peft's ``merge`` and puts the base layers back, for the
export. `frozen_fingerprint` identifies the frozen weights, which a LoRA
checkpoint does not hold, so a resume can prove it rebuilt the same base.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

__all__ = [
    "ADAPTER",
    "ALL_LINEAR",
    "MergedLoRAWeights",
    "apply_lora",
    "frozen_fingerprint",
    "has_lora",
    "lora_layers",
    "merge_lora",
]

ADAPTER = "default"
"""peft's name of the one adapter `apply_lora` injects."""

ALL_LINEAR = "all-linear"
"""peft's shorthand for every linear layer of the model but its output head."""


def apply_lora(
    model: nn.Module,
    rank: int,
    model_type: str = "the model",
    *,
    alpha: int | None = None,
    target_modules: tuple[str, ...] = (),
) -> nn.Module:
    """``model`` with rank-``rank`` LoRA adapters, in place; every other weight frozen.

    ``alpha``: α of the scale s = α / r (None: α = r, s = 1). ``target_modules``:
    module-name suffixes (``("q_proj", "v_proj")``) or ``("all-linear",)``;
    empty takes the model's ``lora_target_modules``. Dropout is 0: the update's
    forward must give the log-probabilities the rollout's weights give. peft
    gives each adapter the dtype of the weight it adapts (the model's precision).
    """
    configured = bool(target_modules)
    targets = tuple(target_modules) or tuple(getattr(model, "lora_target_modules", None) or ())
    if not targets:
        raise ValueError(
            f"actor.model.is_lora: model type '{model_type}' ({type(model).__name__}) does not "
            "support LoRA: it names no lora_target_modules; set is_lora=false, or name the "
            "layers in actor.model.lora_target_modules"
        )
    if ALL_LINEAR in targets and len(targets) > 1:
        raise ValueError(
            f"actor.model.lora_target_modules: '{ALL_LINEAR}' stands for every linear layer "
            f"and takes no other names beside it, got {list(targets)}"
        )
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else rank,
        lora_dropout=0.0,
        target_modules=ALL_LINEAR if targets == (ALL_LINEAR,) else list(targets),
        bias="none",
    )
    try:
        inject_adapter_in_model(config, model)
    except ValueError as error:  # peft: "Target modules {...} not found in the base model"
        key = "actor.model.lora_target_modules" if configured else "actor.model.is_lora"
        raise ValueError(
            f"{key}: no layer of {type(model).__name__} matches {list(targets)} ({error}); "
            f"linear layers present: {_linear_suffixes(model)}"
        ) from None
    trainable = tuple(getattr(model, "lora_trainable_modules", None) or ())
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    for module_name in trainable:
        for param in model.get_submodule(module_name).parameters():
            param.requires_grad_(True)
    return model


def _linear_suffixes(model: nn.Module) -> list[str]:
    return sorted(
        {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    )


def lora_layers(model: nn.Module) -> dict[str, LoraLayer]:
    """The model's LoRA layers by module name (empty for a model without adapters)."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def has_lora(model: nn.Module) -> bool:
    """Whether `apply_lora` adapted ``model``."""
    return bool(lora_layers(model))


class MergedLoRAWeights(Mapping[str, Tensor]):
    """An adapted model's state as the plain model's: base names, adapters merged, lazily.

    ``tensors`` are the adapted model's state-dict entries by name (full
    tensors: for FSDP2, those of `rlshell.engines.training.fsdp.gathered_named_tensors`
    inside ``unsharded()``, where the LoRA layers' own parameters are the
    gathered ones too). For each adapted layer ``p``:

        p.weight = p.base_layer.weight + s · B A     (peft's ``get_delta_weight``)
        p.bias   = p.base_layer.bias

    the ``lora_A``/``lora_B`` entries disappear, and every other entry passes
    through as it is. A merged weight is computed when it is read, so a
    consumer that takes one tensor at a time (a weight sync) holds at most
    one merged tensor at once.
    """

    def __init__(self, model: nn.Module, tensors: Mapping[str, Tensor]) -> None:
        self.layers = lora_layers(model)
        self.tensors = tensors
        self.sources: dict[str, tuple[str, str | None]] = {}  # plain name → (entry, layer)
        for name in tensors:
            parts = name.split(".")
            owners = (".".join(parts[:i]) for i in range(1, len(parts)))
            prefix = next((owner for owner in owners if owner in self.layers), None)
            if prefix is None:
                self.sources[name] = (name, None)
                continue
            rest = name[len(prefix) + 1 :]
            if rest.startswith("base_layer."):
                leaf = rest.removeprefix("base_layer.")
                self.sources[f"{prefix}.{leaf}"] = (name, prefix if leaf == "weight" else None)
            # else: the adapter's own matrices, merged into the weight above

    @torch.no_grad()
    def __getitem__(self, name: str) -> Tensor:
        entry, layer = self.sources[name]
        tensor = self.tensors[entry]
        if layer is None:
            return tensor
        # Every peft LoRA layer type (Linear, Conv1D, Embedding, ...) defines get_delta_weight.
        adapted: Any = self.layers[layer]
        delta: Tensor = adapted.get_delta_weight(ADAPTER)
        return tensor + delta.to(tensor.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self.sources)

    def __len__(self) -> int:
        return len(self.sources)


def merge_lora(model: nn.Module) -> nn.Module:
    """``model`` with every adapter merged into its base layer and the LoRA layers replaced by
    those base layers, in place (peft's ``merge``): the plain model, without peft."""
    for name, layer in lora_layers(model).items():
        layer.merge(safe_merge=True, adapter_names=[ADAPTER])
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer.get_base_layer())
    for attribute in ("peft_config", "lora_target_modules", "lora_trainable_modules"):
        if attribute in vars(model):
            delattr(model, attribute)
    return model


def frozen_fingerprint(model: nn.Module) -> str:
    """A SHA-256 of the frozen parameters this process holds (names, shapes, dtypes, bytes).

    A LoRA checkpoint holds the adapters only; its frozen base is rebuilt
    from ``actor.model`` (its ``path``, or ``model_kwargs`` and ``actor.seed``).
    The checkpoint records this fingerprint, and a resume compares: a base
    built from another source is refused instead of silently trained on.
    For FSDP2 each rank hashes its own shards.
    """
    from torch.distributed.tensor import DTensor

    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        if param.requires_grad:
            continue
        local: Any = param.to_local() if isinstance(param, DTensor) else param
        data = local.detach().contiguous().cpu()
        digest.update(f"{name}:{tuple(data.shape)}:{data.dtype};".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()
