"""The actor's update forward on packed sequences: one row per micro-batch, no padding.

The padded forward (`rlshell.workers.forward.policy_forward`) runs a
``[rows, prompt + response]`` batch, left-padded prompts and right-padded
responses, so every row costs as much as the longest: with responses of 1 to
256 tokens about half the positions are padding, and the linear layers, the
LM head and the backward pass compute them all. `packed_policy_forward`
lays the valid tokens of the rows end to end in one row of Σᵢ Lᵢ tokens
(`rlcore.packing.pack_sequences`) and runs that instead:

- position ids restart at 0 for each sequence, as the padded path counts
  valid tokens (`rlcore.tokens.position_ids`), so RoPE sees the same
  positions;
- attention stays within each sequence through the model's own packed path:
  called with position ids and no attention mask (and no cache),
  transformers finds the sequences where the position ids restart
  (``transformers.masking_utils.find_packed_sequence_indices``) and builds a
  causal mask that is also block-diagonal (``sdpa``, ``eager``,
  ``flex_attention``); its flash-attention paths take the same position ids
  as the varlen kernel's ``cu_seqlens``;
- only the logits that predict a response token are computed (the model's
  ``logits_to_keep`` with `rlcore.packing.packed_response_predictors`), and
  the log-probs and entropies go back to the padded ``[rows, response]``
  layout (`rlcore.packing.unpack_sequences`, 0 at padding) that rlcore's
  losses take.

Same log-probs and gradients as the padded forward to float32 round-off
(tests/shell/test_packing.py). What it saves is every padded position of
the linear layers and the LM head; what it costs, with a dense mask
(``sdpa``, ``eager``), is attention over the whole row, (Σᵢ Lᵢ)² scores
against Σᵢ max(L)² padded: docs/reasoning.md#packed-sequences says when that pays.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from rlcore.logprobs import token_stats
from rlcore.packing import pack_sequences, packed_response_predictors, unpack_sequences
from rlshell.rollout import RolloutBatch

__all__ = ["PACKED_ATTENTION", "PACKED_LAYER_TYPES", "packed_policy_forward", "packing_problem"]

PACKED_ATTENTION = frozenset(
    {"sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"}
)
"""Attention implementations of transformers that keep packed sequences apart: the mask
builders of ``masking_utils`` (``sdpa``, ``eager``, ``flex_attention``) read the restarting
position ids, and the flash-attention ones call the varlen kernel from them. Others (paged
attention, a custom kernel) may get no mask at all and would attend across sequences."""

PACKED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})
"""Layer types whose masks transformers builds per packed sequence; a recurrent or
linear-attention layer (Mamba, gated delta rules) would carry state from one sequence into
the next."""


def packing_problem(model: nn.Module) -> str | None:
    """Why ``model``'s forward cannot run packed sequences, or None when it can."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return (
            f"the model is a {type(model).__name__}, not a transformers PreTrainedModel: the "
            "packed forward relies on transformers' packed-sequence masks"
        )
    config: Any = model.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKED_ATTENTION:
        return (
            f"the model's attention implementation '{attention}' is not one that keeps packed "
            f"sequences apart ({', '.join(sorted(PACKED_ATTENTION))})"
        )
    layer_types = set(getattr(config, "layer_types", None) or ())
    if not layer_types <= PACKED_LAYER_TYPES:
        return (
            f"the model has {sorted(layer_types - PACKED_LAYER_TYPES)} layers, which would "
            "carry state across packed sequences"
        )
    return None


def packed_policy_forward(
    model: nn.Module,
    batch: RolloutBatch,
    temperature: float,
    chunk_size: int | None,
) -> tuple[Tensor, Tensor]:
    """(log-probs, entropies) of the batch's response tokens, ``[rows, response]`` with 0 at
    padding, from one forward over the rows' valid tokens packed into a single row."""
    problem = packing_problem(model)
    if problem is not None:
        raise ValueError(f"actor.pack_sequences: {problem}; set actor.pack_sequences=false")
    device = next(model.parameters()).device
    packed = pack_sequences(batch.input_ids, batch.attention_mask)
    predictors = packed_response_predictors(batch.prompt_mask, batch.response_mask)
    # No attention_mask: transformers then reads the sequences from the position ids.
    logits = model(
        input_ids=packed.values.unsqueeze(0).to(device),
        position_ids=packed.position_ids.unsqueeze(0).to(device),
        use_cache=False,
        logits_to_keep=predictors.to(device),
    ).logits[0]
    mask = batch.response_mask.to(device)
    stats = token_stats(
        logits.float(), batch.response_ids.to(device)[mask], temperature, chunk_size
    )
    return unpack_sequences(stats.logprobs, mask), unpack_sequences(stats.entropy, mask)
