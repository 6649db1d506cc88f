"""Where a batch's tokens are: the response mask, position ids, per-sequence values
spread over tokens or placed on the last one."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlcore._checking import typecheck
from rlcore.types import Mask, as_bool_mask

__all__ = [
    "broadcast_to_tokens",
    "place_on_last_token",
    "position_ids",
    "response_mask",
]


@typecheck
def response_mask(
    tokens: Int[Tensor, "batch time"], eos_id: int | Sequence[int]
) -> Bool[Tensor, "batch time"]:
    """Valid response positions: every token up to and including the first EOS.

    mₜ = [no EOS among y₀ … yₜ₋₁]. ``eos_id`` may list several end tokens
    (chat templates often have two). Rows without EOS are valid throughout.
    """
    eos = torch.as_tensor(
        [eos_id] if isinstance(eos_id, int) else list(eos_id), device=tokens.device
    )
    is_eos = torch.isin(tokens, eos).to(torch.int32)
    return (is_eos.cumsum(dim=-1) - is_eos) == 0


@typecheck
def position_ids(mask: Mask[Tensor, "batch time"]) -> Int[Tensor, "batch time"]:
    """Positions counted over valid tokens only: pₜ = Σₛ≤ₜ mₛ − 1, clamped at 0.

    With left padding the first real token gets position 0, as a model saw it
    during generation; padded positions get 0 (they are masked out anyway).
    """
    valid = as_bool_mask(mask)
    return (valid.long().cumsum(dim=-1) - 1).clamp(min=0)


@typecheck
def broadcast_to_tokens(
    sequence_values: Float[Tensor, "batch"], mask: Mask[Tensor, "batch time"]
) -> Float[Tensor, "batch time"]:
    """Copy each sequence's value onto its valid tokens: xᵢₜ = mᵢₜ · vᵢ."""
    return torch.where(as_bool_mask(mask), sequence_values.unsqueeze(-1), 0.0)


@typecheck
def place_on_last_token(
    scores: Float[Tensor, "batch"], mask: Mask[Tensor, "batch time"]
) -> Float[Tensor, "batch time"]:
    """Token rewards with each sequence's score on its last valid token, 0 elsewhere.

    rᵢₜ = sᵢ · [t = max{t : mᵢₜ}]. A row with no valid token cannot carry its
    score and is an error (it would silently drop a reward).
    """
    valid = as_bool_mask(mask)
    has_token = valid.any(dim=-1)
    if not bool(has_token.all()):
        rows = torch.nonzero(~has_token).flatten()[:5].tolist()
        raise ValueError(
            f"mask has rows with no valid token {rows}: their scores have nowhere to go"
        )
    steps = valid.shape[-1]
    # Index of the last valid position: the largest t with mₜ, found on the flipped mask.
    last = steps - 1 - valid.flip(-1).to(torch.int8).argmax(dim=-1)
    rewards = torch.zeros(valid.shape, dtype=scores.dtype, device=scores.device)
    rewards.scatter_(-1, last.unsqueeze(-1), scores.unsqueeze(-1))
    return rewards
