"""The RL update of a language-model policy on its training backend, and the guard on its numbers.

`PolicyUpdate.run` is the actor's update on a batch: ``algorithm.ppo_epochs``
passes over mini-batches, one optimizer step each, losses from
``rlcore.registry.POLICY_LOSSES[algorithm.loss_type]`` and the KL and entropy
terms of `rlcore.losses`, through the backend's pipeline schedule where it has
stages. `PolicyUpdate.logprobs` is π_old before it. `NonFiniteGuard` stops
on a NaN or infinite loss or gradient norm, after writing the batch that gave
it into the run directory. The actor worker
(`rlshell.workers.actor.ActorWorker`) owns one of each.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import Tensor

from rlcore.logprobs import token_stats
from rlcore.losses import PolicyLossBatch, PolicyLossConfig, entropy_loss, kl_estimate
from rlcore.masked import aggregate, aggregation_normalizer, masked_mean
from rlcore.registry import POLICY_LOSSES
from rlshell.config import Config, RunnerConfig
from rlshell.engines.training import TrainingBackend, pipelined
from rlshell.hyperparameters import LOSS_KEYS, read_for
from rlshell.rollout import RolloutBatch
from rlshell.rundir import write_nonfinite
from rlshell.workers.common import NonFiniteLossError
from rlshell.workers.forward import old_logprobs_and_weights, policy_forward
from rlshell.workers.schedule import (
    accumulate_metrics,
    all_reduce_metrics,
    combine_steps,
    data_parallel_rows,
    token_micro_batches,
    update_schedule,
    with_targets,
)

__all__ = ["NonFiniteGuard", "PolicyUpdate"]


def _named_inputs(inputs: tuple[Any, ...]) -> dict[str, Any]:
    """A micro-batch's inputs (the batch, its advantages, reference and old log-probs, as
    many as given) by name, on the CPU."""
    names = ("batch", "advantages", "ref_logprobs", "old_logprobs")
    return {name: _to_cpu(item) for name, item in zip(names, inputs, strict=False)}


def _to_cpu(item: Any) -> Any:
    """``item`` with every tensor in it (an attrs record's fields too) moved to the CPU."""
    if isinstance(item, Tensor):
        return item.detach().cpu()
    if attrs.has(type(item)):
        return {f.name: _to_cpu(getattr(item, f.name)) for f in attrs.fields(type(item))}
    if isinstance(item, dict):
        return {key: _to_cpu(value) for key, value in item.items()}
    if isinstance(item, list | tuple):
        return type(item)(_to_cpu(value) for value in item)
    return item


class NonFiniteGuard:
    """Stops an update on a non-finite loss or gradient norm, naming the step and the rank,
    after writing what gave it to ``<run dir>/nonfinite/``. ``updates_done``: how many
    updates the worker has made (the step in question is the next)."""

    def __init__(self, runner: RunnerConfig, rank: int, updates_done: Callable[[], int]) -> None:
        self.runner = runner
        self.rank = rank
        self.updates_done = updates_done

    def check_loss(self, loss: Tensor, index: int, inputs: tuple[Any, ...] = ()) -> None:
        """NonFiniteLossError where ``loss`` is NaN or infinite, after writing the
        micro-batch that gave it (``inputs``: the batch, its advantages, reference and old
        log-probs) to ``<run dir>/nonfinite/`` and naming the file."""
        value = float(loss.detach())
        if not math.isfinite(value):
            dumped = self._dump(f"micro_{index}", {"loss": value, **_named_inputs(inputs)})
            raise NonFiniteLossError(
                f"step {self.updates_done() + 1}: the loss is {value} on actor rank "
                f"{self.rank} (micro-batch {index}); stopping before the update. {dumped}"
            )

    def check_gradient(self, grad_norm: float, micro_batches: Sequence[tuple[Any, ...]]) -> None:
        """NonFiniteLossError where the gradient norm (of every rank's gradients) is NaN or
        infinite: the optimizer skipped the update; this rank's micro-batches of the step
        (each as `check_loss`'s ``inputs``) go to ``<run dir>/nonfinite/`` first."""
        if math.isfinite(grad_norm):
            return
        dumped = self._dump(
            "grad",
            {
                "grad_norm": grad_norm,
                "micro_batches": [_named_inputs(inputs) for inputs in micro_batches],
            },
        )
        raise NonFiniteLossError(
            f"step {self.updates_done() + 1}: the gradient norm is {grad_norm} on actor rank "
            f"{self.rank}; the update was skipped. {dumped}"
        )

    def _dump(self, name: str, record: dict[str, Any]) -> str:
        """Write ``record`` (the offending batch, on the CPU) into the run directory as
        ``step_<step>_rank_<rank>_<name>.pt``."""
        runner = self.runner
        step = self.updates_done() + 1
        # The run directory as this worker's working directory resolves it (the driver's, on
        # one machine; give an absolute runner.output_dir on a cluster).
        run_dir = Path(runner.output_dir) / runner.experiment_name
        return write_nonfinite(
            run_dir,
            f"step_{step}_rank_{self.rank}_{name}",
            {"step": step, "rank": self.rank, **record},
        )


class PolicyUpdate:
    """The RL update of ``manager``'s module as ``config`` says; ``updates_done``: how many
    updates the worker has made (the learning-rate schedule and the messages count on it)."""

    def __init__(
        self,
        config: Config,
        manager: TrainingBackend,
        guard: NonFiniteGuard,
        updates_done: Callable[[], int],
    ) -> None:
        self.config = config
        self.manager = manager
        self.guard = guard
        self.updates_done = updates_done

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch) -> Tensor:
        """π_old: the log-probs of the batch's response tokens under the weights before the
        update (``[rows, response width]``, 0 at padding), on every rank (collective).

        Each data-parallel share runs the forward on its rows, in the micro-batches the update
        uses; one SUM all-reduce over the data-parallel group fills in the others'. Runs
        where the update makes several optimizer steps per batch
        (`rlshell.runners.rules.reasoning.optimizer_steps_per_batch`) or needs π_old before it
        (a KL penalty in the reward): every step's ratio is then taken against these, not
        against weights an earlier step already moved.
        """
        manager = self.manager
        if manager.pipeline_stages > 1:
            raise NotImplementedError(
                "log-probs before the update through a Megatron pipeline are not built: "
                "validation refuses several optimizer steps per batch with "
                "pipeline_model_parallel_size > 1"
            )
        model = self.manager.module
        model.train()  # the mode the update's forward runs in: the first ratio is exactly 1
        mine = data_parallel_rows(manager, list(range(batch.rows)))
        out = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
        for rows in token_micro_batches(batch, mine, self.config.actor.micro_batch_max_tokens):
            logprobs, _ = self.forward(batch.select(rows))
            out[torch.as_tensor(rows), : logprobs.shape[1]] = logprobs.float().cpu()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=manager.data_parallel_group)
        return out

    def run(
        self,
        batch: RolloutBatch,
        advantages: Tensor,
        ref_logprobs: Tensor | None = None,
        old_logprobs: Tensor | None = None,
    ) -> dict[str, float]:
        """The update on ``batch``: ``algorithm.ppo_epochs`` passes over mini-batches of
        ``actor.mini_batch_size`` prompts, one optimizer step each; the ``train/`` metrics.

        ``advantages``: the batch's token advantages
        (`rlshell.rollout.advantages.compute_advantages`, run by the trainer).
        ``old_logprobs``: π_old from `compute_logprobs`; without them (one optimizer step per
        batch) the step's own forward, detached, is π_old at no extra pass. Each mini-batch's
        losses, over micro-batches and data-parallel ranks, are normalised by the
        mini-batch's aggregation normaliser, so its gradient is the whole mini-batch's
        whatever the split (`rlcore.masked.aggregate`). Metrics are means over
        the optimizer steps (``*_max`` their maxima); with several epochs
        ``train/clipfrac_epoch<e>`` and ``train/approx_kl_epoch<e>`` follow each pass.
        """
        started = time.perf_counter()
        algorithm = self.config.algorithm
        steps = update_schedule(self.config, batch.rows, batch.group_size, self.updates_done())
        if old_logprobs is None and len(steps) > 1:
            raise ValueError(
                f"{len(steps)} optimizer steps on one batch need π_old from before the first "
                "(ActorWorker.compute_logprobs)"
            )
        self.manager.module.train()
        per_step: list[tuple[int, dict[str, float]]] = []
        for epoch, rows in steps:
            per_step.append(
                (epoch, self._optimizer_step(batch, rows, advantages, ref_logprobs, old_logprobs))
            )
        out = combine_steps(per_step, algorithm.ppo_epochs)
        out["train/optimizer_steps"] = float(len(steps))
        out["time/actor_prepare"] = out.pop("time/actor_prepare_step") * len(steps)
        out["time/actor_forward_backward"] *= len(steps)
        out["time/actor_optimizer"] *= len(steps)
        out["time/actor_update"] = time.perf_counter() - started
        return out

    def _optimizer_step(
        self,
        batch: RolloutBatch,
        rows: list[int],
        advantages: Tensor,
        ref_logprobs: Tensor | None,
        old_logprobs: Tensor | None,
    ) -> dict[str, float]:
        """Forward, backward and one optimizer step on the mini-batch ``rows`` of ``batch``."""
        manager = self.manager
        started = time.perf_counter()
        algorithm = self.config.algorithm
        horizon = self.config.rollout.max_new_tokens
        index = torch.as_tensor(rows)
        normalizer = aggregation_normalizer(
            batch.trained_mask[index], algorithm.loss_agg_mode, horizon
        )
        shares = manager.data_parallel_size
        micro_batches = token_micro_batches(
            batch, data_parallel_rows(manager, rows), self.config.actor.micro_batch_max_tokens
        )
        model = self.manager.module
        passes_started = time.perf_counter()
        # Gradients are averaged over the shares: scaled up by their number, the losses (each
        # normalised by the whole mini-batch) sum to the mini-batch's.
        inputs = [
            with_targets(batch.select(micro), micro, advantages, ref_logprobs, old_logprobs)
            for micro in micro_batches
        ]
        if manager.pipeline_stages > 1:
            totals, peaks = self._pipeline_passes(inputs, normalizer, scale=float(shares))
        else:
            totals, peaks = {}, {}
            for position, (micro, micro_adv, micro_ref, micro_old) in enumerate(inputs):
                manager.before_micro_batch(model, is_last=position == len(inputs) - 1)
                loss, metrics = self.loss(micro, micro_adv, micro_ref, micro_old, normalizer)
                self.guard.check_loss(loss, position, inputs[position])
                manager.backward(loss * shares)
                accumulate_metrics(metrics, totals, peaks)
        optimizer_started = time.perf_counter()
        grad_norm, lrs = manager.optimizer_step()
        scale = manager.loss_scale
        if scale is None:  # with fp16's loss scale an overflow is skipped and the scale lowered
            self.guard.check_gradient(grad_norm, inputs)
        group = manager.data_parallel_group
        reduced = all_reduce_metrics(totals, dist.ReduceOp.SUM, group)
        # Loss terms are normalised by the whole mini-batch already: their sum is its loss.
        # The rest are per-micro-batch means, averaged over every micro-batch of every share;
        # maxima are the maxima over all of them.
        reduced.update(all_reduce_metrics(peaks, dist.ReduceOp.MAX, group))
        passes = len(micro_batches) * shares
        summed = {"pg_loss", "kl_loss", "entropy_loss", "loss"}
        out = {
            # rollout/mismatch_* keep their section; the rest are the actor's train/ metrics.
            key if "/" in key else f"train/{key}": (
                value if key in summed or key in peaks else value / passes
            )
            for key, value in reduced.items()
        }
        out["train/grad_norm"] = grad_norm
        out["train/lr"] = lrs[0]
        if scale is not None:
            out["train/loss_scale"] = scale
        out["train/micro_batches"] = float(len(micro_batches))
        # This rank's own clock (rank 0's is what the runner logs).
        out["time/actor_prepare_step"] = passes_started - started
        out["time/actor_forward_backward"] = optimizer_started - passes_started
        out["time/actor_optimizer"] = time.perf_counter() - optimizer_started
        return out

    def _pipeline_passes(
        self,
        inputs: list[tuple[RolloutBatch, Tensor, Tensor | None, Tensor | None]],
        normalizer: Tensor,
        scale: float,
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Forward and backward of every micro-batch through the backend's pipeline schedule.

        The last stage computes the same loss as the one-stage path from its
        logits; every stage gets its metrics (the backend hands them on).
        """
        temperature = self.config.rollout.temperature
        chunk = self.config.actor.logprob_chunk_size

        def loss_of(index: int, logits: Tensor) -> tuple[Tensor, dict[str, float]]:
            micro, micro_adv, micro_ref, micro_old = inputs[index]
            width = micro.prompt_ids.shape[1]
            stats = token_stats(
                logits[:, width - 1 : -1, :].float(),
                micro.response_ids.to(logits.device),
                temperature,
                chunk,
            )
            loss, metrics = self.loss(
                micro,
                micro_adv,
                micro_ref,
                micro_old,
                normalizer,
                forward=(stats.logprobs, stats.entropy),
            )
            self.guard.check_loss(loss, index)
            return loss * scale, metrics

        per_micro = pipelined(self.manager).pipeline_passes(
            [(micro.input_ids, micro.attention_mask) for micro, *_ in inputs], loss_of
        )
        totals: dict[str, float] = {}
        peaks: dict[str, float] = {}
        for metrics in per_micro:
            accumulate_metrics(metrics, totals, peaks)
        return totals, peaks

    def forward(self, micro: RolloutBatch) -> tuple[Tensor, Tensor]:
        """(log-probs, entropies) of ``micro``'s response tokens under the actor's module."""
        return policy_forward(
            self.manager.module,
            micro,
            self.config.rollout.temperature,
            self.config.actor.logprob_chunk_size,
            # Packing runs every row's prompt: it takes the shared prompt forward's place.
            share_prompts=not self.config.actor.pack_sequences
            and self.config.actor.share_prompt_forward,
            pack=self.config.actor.pack_sequences,
        )

    def loss(
        self,
        micro: RolloutBatch,
        advantages: Tensor,
        ref_logprobs: Tensor | None,
        old_logprobs: Tensor | None,
        normalizer: Tensor,
        forward: tuple[Tensor, Tensor] | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        """The micro-batch's loss and metrics; ``old_logprobs``: π_old from before the update
        (None: this forward's, detached); ``forward``: its (log-probs, entropies) when a
        pipeline schedule computed them, else this runs `policy_forward`."""
        algorithm = self.config.algorithm
        mode = algorithm.loss_agg_mode
        logprobs, entropy = forward or self.forward(micro)
        mask = micro.trained_mask.to(logprobs.device)
        recomputed = logprobs.detach() if old_logprobs is None else old_logprobs.to(logprobs)
        ratio_base, proximal, weights, metrics = old_logprobs_and_weights(
            recomputed, micro.logprobs.to(logprobs.device), mask, algorithm
        )
        policy_loss = POLICY_LOSSES.get(algorithm.loss_type)(
            PolicyLossBatch(
                logprobs=logprobs,
                old_logprobs=ratio_base,
                advantages=advantages.to(logprobs.device),
                mask=mask,
                proximal_logprobs=proximal,
                normalizer=normalizer,
                weights=weights,
            ),
            PolicyLossConfig(
                agg=mode, **read_for(POLICY_LOSSES, algorithm.loss_type, self.config, LOSS_KEYS)
            ),
        )
        loss = policy_loss.loss
        metrics.update({f"{key}": float(value) for key, value in policy_loss.metrics.items()})
        metrics["pg_loss"] = float(policy_loss.loss.detach())
        metrics["entropy"] = float(masked_mean(entropy.detach(), mask))
        if algorithm.entropy_coef > 0:
            bonus = entropy_loss(entropy, mask, mode, normalizer)
            loss = loss + algorithm.entropy_coef * bonus.loss
            metrics["entropy_loss"] = float(bonus.loss.detach())
        if ref_logprobs is not None:
            kl = kl_estimate(logprobs, ref_logprobs.to(logprobs.device), algorithm.kl_kind)
            kl_loss = aggregate(kl, mask, mode, normalizer)
            metrics["kl"] = float(masked_mean(kl.detach(), mask))
            metrics["kl_loss"] = float(kl_loss.detach())
            if algorithm.kl_coef > 0:
                loss = loss + algorithm.kl_coef * kl_loss
        metrics["loss"] = float(loss.detach())
        return loss, metrics
