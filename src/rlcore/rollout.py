"""Pure transforms between generated token batches and the tensors training needs.

Masks, positions, reward placement, DAPO's overlong penalty and dynamic-sampling
filter, Kimi k1.5's length penalty, the weighted total of several rewards, the KL
penalty in the reward and its adaptive coefficient,
variable-length packing (``cu_seqlens``, as flash-attention and
padding-free HF models take it) and token-budget micro-batching.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import attrs
import torch
from jaxtyping import Bool, Float, Int, Shaped
from torch import Tensor

from rlcore._checking import typecheck
from rlcore.losses import KLKind, kl_estimate
from rlcore.types import Mask, as_bool_mask

__all__ = [
    "PackedSequences",
    "adaptive_kl_coef",
    "balanced_micro_batches",
    "broadcast_to_tokens",
    "combine_rewards",
    "filter_informative_groups",
    "group_mini_batches",
    "kl_penalized_rewards",
    "length_penalty",
    "overlong_penalty",
    "pack_sequences",
    "packed_response_predictors",
    "place_on_last_token",
    "position_ids",
    "response_mask",
    "unpack_sequences",
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


@typecheck
def kl_penalized_rewards(
    token_rewards: Float[Tensor, "batch time"],
    logprobs: Float[Tensor, "batch time"],
    ref_logprobs: Float[Tensor, "batch time"],
    mask: Mask[Tensor, "batch time"],
    coef: float,
    kind: KLKind = "k1",
) -> tuple[Float[Tensor, "batch time"], Float[Tensor, "batch time"]]:
    """The KL penalty in the reward (Ziegler et al. 2019, arXiv:1909.08593; InstructGPT):
    (r̃, k) with

    r̃ₜ = rₜ − β·kₜ on valid tokens, rₜ at padding,    kₜ = KL estimate of token t

    where kₜ = `rlcore.losses.kl_estimate` (``kind``) of the sampling policy's
    ``logprobs`` (π_old, before the update) against ``ref_logprobs``, 0 at padding, and
    β = ``coef``. The estimator sees no gradient here: the straight-through ``+`` kinds,
    which differ from their base only in the gradient, are refused. With ``k1`` the
    penalty of a row sums to β·Σₜ log π(yₜ)/π_ref(yₜ), the sampled estimate of
    β·KL(π ‖ π_ref) over the whole response; an outcome estimator (GRPO, RLOO) then
    works on that row's penalised total, GAE and REINFORCE++ on the tokens.
    """
    if kind.endswith("+"):
        raise ValueError(
            f"KL estimator kind {kind!r} is straight-through: it changes the gradient of a KL "
            "loss, and a reward has none; use its base kind "
            f"{kind[:-1]!r}"
        )
    if coef < 0:
        raise ValueError(f"the KL coefficient must be at least 0, got {coef}")
    valid = as_bool_mask(mask)
    with torch.no_grad():
        kl = torch.where(valid, kl_estimate(logprobs, ref_logprobs, kind), 0.0)
        return token_rewards - coef * kl, kl


@typecheck
def adaptive_kl_coef(coef: float, kl: float, target: float, horizon: int, samples: int) -> float:
    """The next KL coefficient of the adaptive controller (Ziegler et al. 2019, §2.2):

    eₜ = clip(KLₜ / KL_target − 1, −0.2, 0.2),    βₜ₊₁ = βₜ · (1 + eₜ · n / H)

    with KLₜ the step's observed KL (``kl``, ≥ 0), n = ``samples`` the responses it
    was measured on and H = ``horizon``: β grows while the policy drifts further from
    the reference than ``target`` and shrinks while it stays closer, by at most a
    factor 1 ± 0.2·n/H a step. n/H must stay below 5, or a step could drive β to 0
    or below.
    """
    if target <= 0 or horizon < 1 or samples < 1:
        raise ValueError(
            f"the adaptive KL controller needs target > 0, horizon ≥ 1 and samples ≥ 1, got "
            f"{target}, {horizon} and {samples}"
        )
    if samples >= 5 * horizon:
        raise ValueError(
            f"{samples} samples a step against a horizon of {horizon}: a step could scale the "
            "KL coefficient by 1 − 0.2·n/H ≤ 0; lengthen the horizon"
        )
    error = min(max(kl / target - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * samples / horizon)


@typecheck
def overlong_penalty(
    lengths: Int[Tensor, "batch"],
    max_length: int,
    buffer_length: int,
    penalty_factor: float = 1.0,
) -> Float[Tensor, "batch"]:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13).

    With L_max = ``max_length`` and L_cache = ``buffer_length``:

    R(L) = 0                                  if L ≤ L_max − L_cache
         = ((L_max − L_cache) − L) / L_cache  if L_max − L_cache < L ≤ L_max
         = −1                                 if L > L_max

    times ``penalty_factor``; added to the task reward.
    """
    if not 0 < buffer_length <= max_length:
        raise ValueError(
            f"buffer_length must lie in (0, max_length={max_length}], got {buffer_length}"
        )
    expected = max_length - buffer_length
    ramp = (expected - lengths).to(torch.get_default_dtype()) / buffer_length
    penalty = ramp.clamp(min=-1.0, max=0.0)
    return penalty * penalty_factor


@typecheck
def filter_informative_groups(
    scores: Float[Tensor, "groups group_size"], tolerance: float = 0.0
) -> Bool[Tensor, "groups"]:
    """DAPO dynamic sampling: keep groups whose scores are not all equal.

    keepᵍ = max(sᵍ) − min(sᵍ) > tolerance. A group where every response is
    right (or every one wrong) has zero group-relative advantage and only
    dilutes the batch.
    """
    spread = scores.amax(dim=-1) - scores.amin(dim=-1)
    return spread > tolerance


@typecheck
def length_penalty(
    lengths: Int[Tensor, "groups group_size"], correct: Bool[Tensor, "groups group_size"]
) -> Float[Tensor, "groups group_size"]:
    """Kimi k1.5's length reward (Kimi Team 2025, arXiv:2501.12599, §2.3.3 "Length Penalty").

    Within a group of responses to one prompt, with Lᵢ the length of response
    i and L_min, L_max the group's shortest and longest:

    λᵢ = 0.5 − (Lᵢ − L_min) / (L_max − L_min)
    Rᵢ = λᵢ             if response i is correct
       = min(0, λᵢ)     otherwise

    and Rᵢ = 0 throughout a group whose responses all have one length. So
    Rᵢ ∈ [−0.5, 0.5]: the shortest correct responses gain 0.5, the longest of
    the group lose 0.5 whether right or wrong, and a wrong response is never
    rewarded for being short (it would teach the policy to give up early).
    Lengths enter only through (Lᵢ − L_min) / (L_max − L_min), so the penalty
    does not change when every length of a group is shifted or scaled.
    Added to the task reward with a weight.
    """
    length = lengths.to(torch.get_default_dtype())
    shortest = length.amin(dim=-1, keepdim=True)
    spread = length.amax(dim=-1, keepdim=True) - shortest
    # Integer lengths: a spread that is not 0 is at least 1, so the clamp only guards 0 / 0.
    lam = 0.5 - (length - shortest) / spread.clamp(min=1.0)
    lam = torch.where(spread > 0, lam, 0.0)
    return torch.where(correct, lam, lam.clamp(max=0.0))


@typecheck
def combine_rewards(
    scores: Float[Tensor, "rewards batch"], weights: Float[Tensor, "rewards"]
) -> Float[Tensor, "batch"]:
    """The weighted total of several reward functions' scores of one batch.

    sᵢ = Σₖ wₖ sₖᵢ, with sₖᵢ the score of reward function k on sample i (TRL's
    ``reward_funcs`` with ``reward_weights``). A weight of 0 leaves its
    function out of the total; one function with weight 1 gives its scores
    unchanged.
    """
    return (weights.to(scores.dtype).unsqueeze(-1) * scores).sum(dim=0)


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
def group_mini_batches(
    rows: int, group_size: int, groups_per_mini_batch: int, seed: int | None = None
) -> list[list[int]]:
    """Split ``rows`` rows (consecutive groups of ``group_size``) into mini-batches of whole
    groups, ``groups_per_mini_batch`` each: one optimizer step per mini-batch (PPO epochs).

    The groups are visited in a random order drawn from ``seed`` (a new seed per epoch gives
    each epoch its own split); None keeps them in order. Every row lands in exactly one
    mini-batch, its group's rows together and in order; ``groups_per_mini_batch`` must divide
    the number of groups, so every mini-batch (and so every optimizer step) has the same size.
    """
    if group_size < 1 or groups_per_mini_batch < 1:
        raise ValueError(
            f"group_size and groups_per_mini_batch must be at least 1, got {group_size} and "
            f"{groups_per_mini_batch}"
        )
    if rows % group_size:
        raise ValueError(f"{rows} rows are not whole groups of {group_size}")
    groups = rows // group_size
    if groups % groups_per_mini_batch:
        raise ValueError(
            f"{groups} groups do not split into mini-batches of {groups_per_mini_batch} groups"
        )
    if seed is None:
        order = list(range(groups))
    else:
        generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(groups, generator=generator).tolist()
    return [
        [
            row
            for group in order[start : start + groups_per_mini_batch]
            for row in range(group * group_size, (group + 1) * group_size)
        ]
        for start in range(0, groups, groups_per_mini_batch)
    ]


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


@typecheck
def balanced_micro_batches(
    lengths: Int[Tensor, "batch"] | Sequence[int],
    max_tokens: int,
    min_micro_batches: int = 1,
) -> list[list[int]]:
    """Split sequence indices into micro-batches of at most ``max_tokens`` tokens each.

    Uses the fewest micro-batches k ≥ ⌈Σ L / max_tokens⌉ (and ≥
    ``min_micro_batches``, e.g. to give every data-parallel rank the same
    count) for which longest-first greedy assignment to the lightest
    micro-batch fits the budget; the loads of that assignment are within
    max(L) of each other. Each micro-batch lists its indices in increasing
    order; micro-batches are ordered by their first index.
    """
    sizes = [int(x) for x in (lengths.tolist() if isinstance(lengths, Tensor) else lengths)]
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if min_micro_batches < 1:
        raise ValueError(f"min_micro_batches must be at least 1, got {min_micro_batches}")
    for index, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"lengths[{index}] is negative ({size})")
        if size > max_tokens:
            raise ValueError(
                f"sequence {index} has {size} tokens, more than max_tokens={max_tokens}: "
                "raise the token budget or truncate the sequence"
            )
    if len(sizes) < min_micro_batches:
        raise ValueError(
            f"cannot make {min_micro_batches} non-empty micro-batches from {len(sizes)} sequences"
        )
    if not sizes:
        return []
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    count = max(min_micro_batches, -(-sum(sizes) // max_tokens))
    while True:
        bins = _longest_first(order, sizes, count, max_tokens)
        if bins is not None:
            return sorted((sorted(b) for b in bins), key=lambda b: b[0])
        count += 1


def _longest_first(
    order: list[int], sizes: list[int], count: int, max_tokens: int
) -> list[list[int]] | None:
    if count > len(order):
        count = len(order)
    heap = [(0, k) for k in range(count)]
    bins: list[list[int]] = [[] for _ in range(count)]
    for index in order:
        load, k = heapq.heappop(heap)
        if load + sizes[index] > max_tokens:
            return None
        bins[k].append(index)
        heapq.heappush(heap, (load + sizes[index], k))
    if any(not b for b in bins):
        return None
    return bins
