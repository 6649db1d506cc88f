"""Hugging Face Qwen2 / Llama weights ↔ Megatron-core GPT shards (tensor and pipeline parallel).

Pure functions over state dicts; no process group, no Megatron import. One
rank of a Megatron model holds tensor-parallel rank ``t`` of ``T`` and
pipeline stage ``p`` of ``P``; `megatron_shard` computes that rank's tensors
from a whole Hugging Face state dict, `hf_from_shards` rebuilds the whole
Hugging Face state dict from every rank's. The round trip is exact: tensors
are only sliced, reordered and concatenated.

Layouts (Megatron-core's local GPT spec, ``gated_linear_unit=True``):

- ``linear_qkv`` fuses q, k and v **per query group**: for each of the ``G``
  key/value heads, the ``H/G`` query heads that share it, then its key head,
  then its value head (``d`` rows each). Tensor rank ``t`` holds groups
  ``t·G/T … (t+1)·G/T − 1`` (so ``G`` must be a multiple of ``T``), and with
  them the query heads whose output columns ``linear_proj`` holds.
- ``linear_fc1`` fuses gate and up: rank ``t`` holds rows ``[gate_t; up_t]``,
  its slices of both (Megatron applies the activation to the first half).
- ``linear_proj`` and ``linear_fc2`` are row-parallel: split along inputs.
- Embedding and output rows are vocabulary-parallel over a vocabulary padded
  to a multiple of ``T`` (zero rows; `GPTLayout.vocab_size` is the real one).
- Stage ``p`` holds layers ``p·L/P … (p+1)·L/P − 1`` under local indices
  ``0 … L/P − 1``; the first stage the embedding, the last the final norm and
  the output layer. With tied embeddings and ``P > 1`` the last stage keeps its
  own copy of the embedding as ``output_layer.weight`` (Megatron's layout;
  their gradients are summed across the two stages).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch
from torch import Tensor

__all__ = ["GPTLayout", "hf_from_shards", "megatron_shard"]

_LAYER = "model.layers.{i}."
_MEGATRON_LAYER = "decoder.layers.{i}."


@attrs.frozen
class GPTLayout:
    """The shapes of one GPT model and how it is split over ``tp`` × ``pp`` ranks."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    tp: int = 1
    pp: int = 1

    def __attrs_post_init__(self) -> None:
        problems = []
        if self.num_heads % self.num_kv_heads:
            problems.append(
                f"{self.num_heads} attention heads do not split into {self.num_kv_heads} groups"
            )
        if self.num_kv_heads % self.tp:
            problems.append(
                f"tensor parallel size {self.tp} must divide the {self.num_kv_heads} key/value "
                "heads (each rank holds whole query groups)"
            )
        if self.ffn_hidden_size % self.tp:
            problems.append(
                f"tensor parallel size {self.tp} must divide the MLP width {self.ffn_hidden_size}"
            )
        if self.num_layers % self.pp:
            problems.append(
                f"pipeline parallel size {self.pp} must divide the {self.num_layers} layers"
            )
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def padded_vocab_size(self) -> int:
        """The vocabulary rounded up to a multiple of ``tp`` (vocabulary-parallel rows)."""
        return -(-self.vocab_size // self.tp) * self.tp

    @property
    def layers_per_stage(self) -> int:
        return self.num_layers // self.pp

    def stage_layers(self, pp_rank: int) -> range:
        """The global indices of the layers stage ``pp_rank`` holds."""
        return range(pp_rank * self.layers_per_stage, (pp_rank + 1) * self.layers_per_stage)

    @classmethod
    def of(cls, hf_config: object, tp: int = 1, pp: int = 1) -> GPTLayout:
        """The layout of a Qwen2 or Llama transformers config; anything else is refused."""
        kind = getattr(hf_config, "model_type", None)
        if kind not in ("qwen2", "llama"):
            raise ValueError(
                f"the Megatron backend maps Qwen2 and Llama models; this one is {kind!r}"
            )
        heads = int(getattr(hf_config, "num_attention_heads"))  # noqa: B009
        hidden = int(getattr(hf_config, "hidden_size"))  # noqa: B009
        head_dim = getattr(hf_config, "head_dim", None) or hidden // heads
        if kind == "llama" and getattr(hf_config, "mlp_bias", False):
            raise ValueError("Llama with mlp_bias=True: the Megatron mapping has no MLP biases")
        return cls(
            num_layers=int(getattr(hf_config, "num_hidden_layers")),  # noqa: B009
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(getattr(hf_config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            ffn_hidden_size=int(getattr(hf_config, "intermediate_size")),  # noqa: B009
            vocab_size=int(getattr(hf_config, "vocab_size")),  # noqa: B009
            tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=kind == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
            tp=tp,
            pp=pp,
        )


def _split(tensor: Tensor, parts: int, index: int, dim: int = 0) -> Tensor:
    return torch.chunk(tensor, parts, dim=dim)[index]


def _padded_rows(tensor: Tensor, rows: int) -> Tensor:
    if tensor.shape[0] == rows:
        return tensor
    pad = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, pad])


def _fused_qkv(q: Tensor, k: Tensor, v: Tensor, layout: GPTLayout, tp_rank: int) -> Tensor:
    """Rows of q, k, v (or their biases) → rank ``tp_rank``'s rows of ``linear_qkv``."""
    groups, d = layout.num_kv_heads, layout.head_dim
    per_group = layout.num_heads // groups
    q = q.reshape(groups, per_group * d, *q.shape[1:])
    k = k.reshape(groups, d, *k.shape[1:])
    v = v.reshape(groups, d, *v.shape[1:])
    fused = torch.cat([q, k, v], dim=1)  # (groups, (per_group + 2)·d, ...)
    mine = _split(fused, layout.tp, tp_rank)
    return mine.reshape(-1, *q.shape[2:])


def _unfused_qkv(shards: list[Tensor], layout: GPTLayout) -> tuple[Tensor, Tensor, Tensor]:
    """Every rank's ``linear_qkv`` rows → the rows of q, k and v."""
    groups, d = layout.num_kv_heads, layout.head_dim
    per_group = layout.num_heads // groups
    fused = torch.cat(shards).reshape(groups, (per_group + 2) * d, *shards[0].shape[1:])
    q, k, v = torch.split(fused, [per_group * d, d, d], dim=1)
    rest = shards[0].shape[1:]
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def megatron_shard(
    hf: Mapping[str, Tensor], layout: GPTLayout, tp_rank: int, pp_rank: int
) -> dict[str, Tensor]:
    """The tensors Megatron rank (``tp_rank``, ``pp_rank``) holds, from a whole HF state dict.

    Raises ``KeyError`` naming a tensor the HF state dict lacks.
    """
    out: dict[str, Tensor] = {}
    tp = layout.tp
    first, last = pp_rank == 0, pp_rank == layout.pp - 1
    vocab_rows = layout.padded_vocab_size
    embedding = _padded_rows(hf["model.embed_tokens.weight"], vocab_rows)
    if first:
        out["embedding.word_embeddings.weight"] = _split(embedding, tp, tp_rank)
    for local, i in enumerate(layout.stage_layers(pp_rank)):
        src, dst = _LAYER.format(i=i), _MEGATRON_LAYER.format(i=local)
        attn = src + "self_attn."
        out[dst + "input_layernorm.weight"] = hf[src + "input_layernorm.weight"]
        for kind in ("weight", "bias") if layout.qkv_bias else ("weight",):
            q, k, v = (hf[f"{attn}{head}_proj.{kind}"] for head in "qkv")
            out[f"{dst}self_attention.linear_qkv.{kind}"] = _fused_qkv(q, k, v, layout, tp_rank)
        out[dst + "self_attention.linear_proj.weight"] = _split(
            hf[attn + "o_proj.weight"], tp, tp_rank, dim=1
        )
        out[dst + "pre_mlp_layernorm.weight"] = hf[src + "post_attention_layernorm.weight"]
        mlp = src + "mlp."
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [
                _split(hf[mlp + "gate_proj.weight"], tp, tp_rank),
                _split(hf[mlp + "up_proj.weight"], tp, tp_rank),
            ]
        )
        out[dst + "mlp.linear_fc2.weight"] = _split(hf[mlp + "down_proj.weight"], tp, tp_rank, 1)
    if last:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        if not layout.tied_embeddings:
            head = _padded_rows(hf["lm_head.weight"], vocab_rows)
            out["output_layer.weight"] = _split(head, tp, tp_rank)
        elif not first:  # the last stage's copy of the tied embedding
            out["output_layer.weight"] = _split(embedding, tp, tp_rank)
    return out


def hf_from_shards(
    shards: Mapping[tuple[int, int], Mapping[str, Tensor]], layout: GPTLayout
) -> dict[str, Tensor]:
    """The whole HF state dict from every rank's tensors, keyed by (``tp_rank``, ``pp_rank``).

    With tied embeddings the result has ``model.embed_tokens.weight`` and, as
    `transformers` saves tied models, also ``lm_head.weight`` (the same tensor).
    """
    expected = {(t, p) for t in range(layout.tp) for p in range(layout.pp)}
    if set(shards) != expected:
        raise ValueError(
            f"expected the shards of all {layout.tp}×{layout.pp} (tp, pp) ranks, got "
            f"{sorted(shards)}"
        )

    def gathered(name: str, pp_rank: int, dim: int = 0) -> Tensor:
        return torch.cat([shards[(t, pp_rank)][name] for t in range(layout.tp)], dim=dim)

    hf: dict[str, Tensor] = {}
    last = layout.pp - 1
    embedding = gathered("embedding.word_embeddings.weight", 0)[: layout.vocab_size]
    hf["model.embed_tokens.weight"] = embedding
    for p in range(layout.pp):
        for local, i in enumerate(layout.stage_layers(p)):
            src, dst = _MEGATRON_LAYER.format(i=local), _LAYER.format(i=i)
            attn = dst + "self_attn."
            hf[dst + "input_layernorm.weight"] = shards[(0, p)][src + "input_layernorm.weight"]
            for kind in ("weight", "bias") if layout.qkv_bias else ("weight",):
                name = f"{src}self_attention.linear_qkv.{kind}"
                fused = [shards[(t, p)][name] for t in range(layout.tp)]
                for head, tensor in zip("qkv", _unfused_qkv(fused, layout), strict=True):
                    hf[f"{attn}{head}_proj.{kind}"] = tensor
            hf[attn + "o_proj.weight"] = gathered(src + "self_attention.linear_proj.weight", p, 1)
            hf[dst + "post_attention_layernorm.weight"] = shards[(0, p)][
                src + "pre_mlp_layernorm.weight"
            ]
            fc1 = [
                torch.chunk(shards[(t, p)][src + "mlp.linear_fc1.weight"], 2)
                for t in range(layout.tp)
            ]
            hf[dst + "mlp.gate_proj.weight"] = torch.cat([gate for gate, _ in fc1])
            hf[dst + "mlp.up_proj.weight"] = torch.cat([up for _, up in fc1])
            hf[dst + "mlp.down_proj.weight"] = gathered(src + "mlp.linear_fc2.weight", p, 1)
    hf["model.norm.weight"] = shards[(0, last)]["decoder.final_layernorm.weight"]
    if layout.tied_embeddings:
        hf["lm_head.weight"] = embedding
    else:
        hf["lm_head.weight"] = gathered("output_layer.weight", last)[: layout.vocab_size]
    return hf
