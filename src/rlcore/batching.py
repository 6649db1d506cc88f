"""How a batch is cut for the update: whole groups into mini-batches, rows into
token-budget micro-batches balanced across data-parallel ranks."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from rlcore._checking import typecheck

__all__ = [
    "balanced_micro_batches",
    "group_mini_batches",
]


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
