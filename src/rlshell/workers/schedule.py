"""How an update cuts a batch: epochs and mini-batches of whole groups
(`update_schedule`), each data-parallel share's rows, token-budget micro-batches the same
in number on every rank, and the metrics summed over micro-batches and ranks."""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlcore.batching import balanced_micro_batches, group_mini_batches
from rlshell.config import Config
from rlshell.engines.training import TrainingBackend
from rlshell.rollout import RolloutBatch

__all__ = [
    "accumulate_metrics",
    "combine_steps",
    "update_schedule",
    "with_targets",
]


def accumulate_metrics(
    metrics: dict[str, float], totals: dict[str, float], peaks: dict[str, float]
) -> None:
    """Sum a micro-batch's metrics into ``totals``; its ``*_max`` ones into ``peaks`` (max)."""
    for key, value in metrics.items():
        if key.endswith("_max"):
            peaks[key] = max(peaks.get(key, -math.inf), value)
        else:
            totals[key] = totals.get(key, 0.0) + value


def update_schedule(
    config: Config, rows: int, group_size: int, step: int
) -> list[tuple[int, list[int]]]:
    """(epoch, rows) of each optimizer step of the update on a batch of ``rows`` rows, in
    groups of ``group_size`` (a prompt's samples).

    Each epoch visits the batch's groups in an order drawn from (``runner.seed``, the step,
    the epoch), ``actor.mini_batch_size`` prompts per mini-batch
    (`rlcore.batching.group_mini_batches`); the same on every rank. One mini-batch per epoch
    keeps the rows in order.
    """
    groups = rows // group_size
    per_mini = min(config.actor.mini_batch_size or groups, groups)
    schedule = []
    for epoch in range(config.algorithm.ppo_epochs):
        seed = None if per_mini == groups else _update_seed(config.runner.seed, step, epoch)
        for mini in group_mini_batches(rows, group_size, per_mini, seed):
            schedule.append((epoch, mini))
    return schedule


def _update_seed(*parts: int) -> int:
    return zlib.crc32(repr(("update", *parts)).encode()) & 0x7FFFFFFF


def combine_steps(per_step: list[tuple[int, dict[str, float]]], epochs: int) -> dict[str, float]:
    """One update's metrics from its optimizer steps': means (``*_max``: maxima; ``train/lr``:
    the last step's); with several epochs, each epoch's clip fraction and approximate KL."""
    keys = list(per_step[0][1])
    out: dict[str, float] = {}
    for key in keys:
        values = [metrics[key] for _, metrics in per_step]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key == "train/lr":
            out[key] = values[-1]
        else:
            out[key] = sum(values) / len(values)
    if epochs > 1:
        for name in ("clipfrac", "approx_kl"):
            key = f"train/{name}"
            if key not in keys:
                continue
            for epoch in range(epochs):
                values = [m[key] for e, m in per_step if e == epoch]
                out[f"train/{name}_epoch{epoch}"] = sum(values) / len(values)
    return out


def data_parallel_rows(manager: TrainingBackend, rows: list[int]) -> list[int]:
    """This rank's contiguous share of ``rows``: a data-parallel share holds whole groups
    where it can, whose prompt runs once per micro-batch. FSDP: a share per rank; Megatron:
    a share per tensor × pipeline grid."""
    share, shares = manager.data_parallel_rank, manager.data_parallel_size
    return rows[share * len(rows) // shares : (share + 1) * len(rows) // shares]


def with_targets(
    micro: RolloutBatch,
    rows: list[int],
    advantages: Tensor,
    ref_logprobs: Tensor | None,
    old_logprobs: Tensor | None,
) -> tuple[RolloutBatch, Tensor, Tensor | None, Tensor | None]:
    """The micro-batch ``micro`` (``rows`` of the batch, `RolloutBatch.select`) with its rows of
    the batch-wide advantages, reference and old log-probs, cut to ``micro``'s own response
    width: `select` trims the columns no row of the micro-batch uses, which the batch-wide
    tensors still hold when a longer response sits in another micro-batch."""
    width = micro.response_ids.shape[1]
    index = torch.as_tensor(rows)
    return (
        micro,
        advantages[index, :width],
        None if ref_logprobs is None else ref_logprobs[index, :width],
        None if old_logprobs is None else old_logprobs[index, :width],
    )


def token_micro_batches(batch: RolloutBatch, rows: list[int], budget: int) -> list[list[int]]:
    """``rows`` of ``batch`` in micro-batches of at most ``budget`` valid tokens
    (`rlcore.batching.balanced_micro_batches`), as many on every rank (collective: FSDP's
    collectives pair up pass by pass)."""
    lengths = (batch.prompt_mask.sum(1) + batch.response_mask.sum(1))[rows]
    count = torch.tensor([len(balanced_micro_batches(lengths, budget))])
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    local = balanced_micro_batches(lengths, budget, min_micro_batches=int(count))
    return [[rows[i] for i in micro] for micro in local]


def all_reduce_metrics(
    values: dict[str, float], op: Any, group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """``values`` reduced with ``op`` over ``group`` (every rank holds the same keys)."""
    keys = sorted(values)
    tensor = torch.tensor([values[key] for key in keys], dtype=torch.float64)
    dist.all_reduce(tensor, op=op, group=group)
    return dict(zip(keys, tensor.tolist(), strict=True))
