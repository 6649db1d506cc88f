"""The supervised (SFT) update and evaluation of a language model on its training backend.

`sft_step`: the negative log-likelihood of a batch's trained tokens, one optimizer step;
`sft_evaluation`: its loss and greedy token accuracy. The actor worker
(`rlshell.workers.actor.ActorWorker.run_sft`, ``evaluate_sft``) calls them with its
backend and its checks of non-finite losses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from rlcore.logprobs import token_logprobs
from rlcore.losses import sft_loss
from rlcore.masked import AggregationMode, aggregate, aggregation_normalizer
from rlcore.tokens import position_ids
from rlshell.config import ActorConfig
from rlshell.engines.training import TrainingBackend
from rlshell.rollout import RolloutBatch
from rlshell.workers.forward import policy_forward
from rlshell.workers.schedule import all_reduce_metrics, data_parallel_rows, token_micro_batches

__all__ = ["sft_evaluation", "sft_step"]


def sft_step(
    manager: TrainingBackend,
    batch: RolloutBatch,
    actor: ActorConfig,
    loss_agg_mode: AggregationMode,
    check_loss: Callable[[Tensor, int], None],
    check_gradient: Callable[[float, Sequence[tuple[Any, ...]]], None],
) -> dict[str, float]:
    """One supervised step on ``batch``: the negative log-likelihood of its trained tokens
    (``batch.trained_mask``), rlcore's ``sft_loss`` aggregated with
    ``algorithm.loss_agg_mode``, then one optimizer step; the ``train/`` metrics.

    Every micro-batch's loss is normalised by the whole batch's normaliser (its horizon
    the batch's response width), so the gradient is the whole batch's whatever the
    micro-batches and data-parallel shares (`rlcore.masked.aggregate`). Collective.
    """
    started = time.perf_counter()
    mode = loss_agg_mode
    trained = batch.trained_mask
    normalizer = aggregation_normalizer(trained, mode, trained.shape[1])
    shares = manager.data_parallel_size
    mine = data_parallel_rows(manager, list(range(batch.rows)))
    micro_batches = token_micro_batches(batch, mine, actor.micro_batch_max_tokens)
    if manager.pipeline_stages > 1:
        raise NotImplementedError(
            "the sft update through a Megatron pipeline is not supported: validation refuses "
            "actor.megatron.pipeline_model_parallel_size > 1 for the sft runner"
        )
    model = manager.module
    model.train()
    loss_sum = 0.0
    for position, rows in enumerate(micro_batches):
        micro = batch.select(rows)
        manager.before_micro_batch(model, is_last=position == len(micro_batches) - 1)
        logprobs, _ = policy_forward(
            model,
            micro,
            temperature=1.0,
            chunk_size=actor.logprob_chunk_size,
            pack=actor.pack_sequences,
        )
        mask = micro.trained_mask.to(logprobs.device)
        loss = sft_loss(logprobs, mask, mode, normalizer.to(logprobs.device)).loss
        check_loss(loss, position)
        # Gradients are averaged over the shares: scaled by their number, the losses
        # (each normalised by the whole batch) sum to the batch's.
        manager.backward(loss * shares)
        loss_sum += float(loss.detach())
    backward_done = time.perf_counter()
    grad_norm, lrs = manager.optimizer_step()
    if manager.loss_scale is None:  # with fp16's loss scale an overflow is skipped
        check_gradient(grad_norm, [(batch.select(rows),) for rows in micro_batches])
    loss_total = all_reduce_metrics(
        {"loss": loss_sum}, dist.ReduceOp.SUM, manager.data_parallel_group
    )["loss"]
    return {
        "train/loss": loss_total,
        "train/grad_norm": grad_norm,
        "train/lr": lrs[0],
        "train/trained_tokens": float(trained.sum()),
        "train/micro_batches": float(len(micro_batches)),
        "time/actor_forward_backward": backward_done - started,
        "time/actor_optimizer": time.perf_counter() - backward_done,
    }


@torch.no_grad()
def sft_evaluation(
    manager: TrainingBackend, batch: RolloutBatch, actor: ActorConfig
) -> dict[str, float]:
    """``eval/loss``: the mean negative log-likelihood per trained token of ``batch``
    (rlcore's ``sft_loss``, token-mean over the whole batch); ``eval/token_accuracy``:
    the share of trained tokens the greedy prediction (the argmax of the logits that
    predict it) gets right. No gradient; collective over the data-parallel shares."""
    if manager.pipeline_stages > 1:
        raise NotImplementedError(
            "sft evaluation through a Megatron pipeline is not supported: validation refuses "
            "actor.megatron.pipeline_model_parallel_size > 1 for the sft runner"
        )
    model = manager.module
    model.eval()
    count = batch.trained_mask.sum().to(torch.float32)
    mine = data_parallel_rows(manager, list(range(batch.rows)))
    totals = {"loss": 0.0, "token_accuracy": 0.0}
    for rows in token_micro_batches(batch, mine, actor.micro_batch_max_tokens):
        micro = batch.select(rows)
        device = next(model.parameters()).device
        attention_mask = micro.attention_mask
        width = micro.prompt_ids.shape[1]
        logits = model(
            input_ids=micro.input_ids.to(device),
            attention_mask=attention_mask.to(device).long(),
            position_ids=position_ids(attention_mask).to(device),
            use_cache=False,
        ).logits[:, width - 1 : -1, :]
        targets = micro.response_ids.to(device)
        mask = micro.trained_mask.to(device)
        logprobs = token_logprobs(logits.float(), targets, chunk_size=actor.logprob_chunk_size)
        nll = sft_loss(logprobs, mask, "token-mean", count.to(device)).loss
        hits = (logits.argmax(dim=-1) == targets).to(torch.float32)
        totals["loss"] += float(nll)
        totals["token_accuracy"] += float(aggregate(hits, mask, "token-mean", count))
    model.train()
    reduced = all_reduce_metrics(totals, dist.ReduceOp.SUM, manager.data_parallel_group)
    return {f"eval/{key}": value for key, value in reduced.items()}
