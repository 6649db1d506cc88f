"""Variable-length packing: rows of a padded batch laid end to end with ``cu_seqlens``
(as flash-attention and padding-free Hugging Face models take them), and back."""

from __future__ import annotations

import attrs
import torch
from jaxtyping import Int, Shaped
from torch import Tensor

from rlcore._checking import typecheck
from rlcore.tokens import position_ids
from rlcore.types import Mask, as_bool_mask

__all__ = [
    "PackedSequences",
    "pack_sequences",
    "packed_response_predictors",
    "unpack_sequences",
]


@attrs.frozen(eq=False)
class PackedSequences:
    """Valid tokens of a batch laid end to end.

    ``cu_seqlens`` (int32, ``[batch + 1]``) are the cumulative lengths:
    sequence i is ``values[cu_seqlens[i]:cu_seqlens[i+1]]``. ``position_ids``
    restart at 0 for each sequence.
    """

    values: Shaped[Tensor, "total *feature"]
    cu_seqlens: Int[Tensor, "batch_plus_one"]
    position_ids: Int[Tensor, "total"]
    max_seqlen: int


@typecheck
def pack_sequences(
    values: Shaped[Tensor, "batch time *feature"], mask: Mask[Tensor, "batch time"]
) -> PackedSequences:
    """Drop the padding: concatenate the valid positions of every row, in order."""
    valid = as_bool_mask(mask)
    lengths = valid.sum(dim=-1)
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(dim=0), (1, 0)).to(torch.int32)
    positions = position_ids(valid)[valid]
    max_seqlen = int(lengths.max()) if lengths.numel() else 0
    return PackedSequences(values[valid], cu_seqlens, positions, max_seqlen)


@typecheck
def unpack_sequences(
    packed: Shaped[Tensor, "total *feature"], mask: Mask[Tensor, "batch time"]
) -> Shaped[Tensor, "batch time *feature"]:
    """Inverse of `pack_sequences`: scatter back to ``[batch, time, ...]``, 0 at padding."""
    valid = as_bool_mask(mask)
    count = int(valid.sum())
    if packed.shape[0] != count:
        raise ValueError(
            f"packed has {packed.shape[0]} tokens but mask has {count} valid positions"
        )
    out = packed.new_zeros((*valid.shape, *packed.shape[1:]))
    out[valid] = packed
    return out


@typecheck
def packed_response_predictors(
    prompt_mask: Mask[Tensor, "batch prompt"], response_mask: Mask[Tensor, "batch response"]
) -> Int[Tensor, "tokens"]:
    """Where the logits that predict each valid response token sit in the packed sequences.

    Row i's sequence is its valid prompt tokens then its valid response
    tokens, ``pack_sequences(cat(prompt, response), cat(prompt_mask,
    response_mask))`` lays the rows end to end, and a causal LM's logits at
    packed position k predict the token at k + 1. The valid response token
    that is row i's j-th (counting valid response tokens only) sits at
    kᵢⱼ = cᵢ + pᵢ + j, with cᵢ = ``cu_seqlens[i]`` and pᵢ = Σₜ prompt_maskᵢₜ, so
    the position predicting it is

        kᵢⱼ − 1 = cᵢ + pᵢ + j − 1,

    listed in the row-major order of ``response_mask``'s valid positions (the
    order `unpack_sequences` scatters back from). With a left-padded prompt and
    a right-padded response this is the padded row's column ``prompt − 1 + j``,
    whose logits the padded forward uses. A row with response tokens needs a
    prompt token: nothing else in its sequence precedes its first response token.
    """
    prompt = as_bool_mask(prompt_mask, "prompt_mask")
    response = as_bool_mask(response_mask, "response_mask")
    unprompted = response.any(dim=-1) & ~prompt.any(dim=-1)
    if bool(unprompted.any()):
        rows = torch.nonzero(unprompted).flatten()[:5].tolist()
        raise ValueError(
            f"rows {rows} have response tokens but no prompt token: nothing in their "
            "sequence precedes the first response token to predict it"
        )
    valid = torch.cat([prompt, response], dim=-1)
    is_response = torch.cat([torch.zeros_like(prompt), response], dim=-1)[valid]
    return torch.nonzero(is_response).flatten() - 1
