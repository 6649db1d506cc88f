"""The actor: training of the policy on its backend, and (collocated) the rollout engine beside it.

Every rank of the actor group builds the same model from ``actor.seed``,
shards it with the training backend ``actor.backend`` names
(`rlshell.engines.training`: FSDP2, Megatron-core, or a plug-in) and trains on its
share of each batch:
log-probs recomputed with `rlcore.logprobs`, advantages from
``rlcore.registry.ADVANTAGES[algorithm.adv_type]``, the policy loss from
``rlcore.registry.POLICY_LOSSES[algorithm.loss_type]``, the KL and entropy
terms from `rlcore.losses`, micro-batches from
`rlcore.batching.balanced_micro_batches`. The rlshell side only moves tensors.

When the rollout shares the actor's placement (``"actor,rollout": ...``)
each actor rank also holds the rollout engine ``rollout.backend`` names: a full
copy of the policy synced in memory (``bucket``, ``patch``), or, with
``weight_sync='shared'``, a `BorrowingEngine` without weights of its own that
borrows the rank's gathered parameters while it generates
(`TrainingBackend.unsharded`). Otherwise the
rollout is a separate worker group and rank 0 streams the weights to it
through the Ray object store. A LoRA actor (``actor.model.is_lora``) sends
its weights with the adapters merged in, under the plain model's names
(`rlshell.models.lora.MergedLoRAWeights`), to engines that hold the plain model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import Tensor, nn

from rlcore.logprobs import token_stats
from rlcore.losses import PolicyLossBatch, PolicyLossConfig, entropy_loss, kl_estimate
from rlcore.masked import aggregate, aggregation_normalizer, masked_mean
from rlcore.registry import POLICY_LOSSES
from rlshell.cluster.worker import Worker
from rlshell.config import Config
from rlshell.engines.rollout import BorrowingEngine, RolloutEngine, make_rollout_engine
from rlshell.engines.rollout.multi_turn import AgentLoop, make_agent_loop, sample
from rlshell.engines.training import TrainingBackend, make_training_backend, pipelined
from rlshell.hyperparameters import LOSS_KEYS, read_for
from rlshell.models import torch_dtype
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.rundir import write_nonfinite
from rlshell.sync.codec import FlatBuckets
from rlshell.sync.transfer import WeightSender
from rlshell.workers.common import (
    NonFiniteLossError,
    build_rollout_model,
    rollout_precision,
    worker_device,
)
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
from rlshell.workers.sft_update import sft_evaluation, sft_step
from rlshell.workers.weight_publishing import WeightPublisher

__all__ = [
    "ActorWorker",
]


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


class ActorWorker(Worker):
    """One rank of the trained policy; with ``rollout_in_actor``
    (`rlshell.runners.spec.RunSpec.rollout_in_actor`) also a rollout engine in its process."""

    def __init__(self, config: Config, total_steps: int, rollout_in_actor: bool) -> None:
        self.config = config
        self.total_steps = total_steps
        self.rollout_in_actor = rollout_in_actor
        self.global_step = 0
        self.manager: TrainingBackend | None = None
        self.engine: RolloutEngine | None = None
        self.agent: AgentLoop | None = None  # agent.tools: multi-turn rollouts with tool calls
        # weight_sync='shared': the engine, lent this rank's gathered weights to generate.
        self.borrowing_engine: BorrowingEngine | None = None
        self.publisher: WeightPublisher | None = None  # None with weight_sync='shared'

    # -- set-up

    def init_worker(self, tokenizer_path: str) -> None:
        """Join the group's process group, build and shard the model (and the engine)."""
        self.init_training()
        device = worker_device()
        rollout = self.config.rollout
        sender = WeightSender(
            mode="patch" if rollout.weight_sync == "patch" else "bucket",
            bucket_size_mb=rollout.bucket_size_mb,
            dtype=torch_dtype(rollout_precision(self.config)),
        )
        flat: FlatBuckets | None = None
        if self.rollout_in_actor:
            from rlshell.tokenizer import load_tokenizer

            # A LoRA actor's 'shared' engine borrows its parameters, adapters included, by name;
            # a copy holds the plain model and receives the merged weights.
            model = build_rollout_model(self.config, merged_lora=not self.shared)
            tokenizer = load_tokenizer(tokenizer_path)
            self.agent = make_agent_loop(self.config, tokenizer)
            self.engine = make_rollout_engine(rollout, model, tokenizer, device)
            if self.shared:
                if not isinstance(self.engine, BorrowingEngine):
                    raise TypeError(
                        f"rollout.weight_sync='shared': the '{rollout.backend}' engine "
                        f"({type(self.engine).__name__}) cannot borrow the actor's weights "
                        "(it has no release_weights/borrowing)"
                    )
                self.engine.release_weights()  # it borrows this rank's own, gathered
                self.borrowing_engine = self.engine
            elif rollout.weight_sync == "bucket":
                # The engine's weights become the bucket layout: syncs pack straight into them.
                flat = FlatBuckets(self.engine.weight_targets(), sender.bucket_bytes)
        if not self.shared:  # 'shared' sends nothing: its engine borrows the weights
            self.publisher = WeightPublisher(
                sender,
                rank=self.rank,
                lora=self.config.actor.model.is_lora,
                engine=self.engine,
                flat=flat,
            )

    def init_training(self) -> None:
        """Join the group's process group, build and shard the model and its optimizer: all
        that a rank which only trains needs (the sft runner's; `init_worker` adds the weight
        sender and the collocated engine)."""
        device = worker_device()
        self.init_process_group("nccl" if device.type == "cuda" else "gloo")
        self.manager = make_training_backend(
            self.config.actor, total_steps=self.total_steps, device=device
        )
        self.manager.setup_model_and_optimizer()

    @property
    def shared(self) -> bool:
        """Whether the engine generates with this rank's own FSDP module (no copy, no sync)."""
        return self.rollout_in_actor and self.config.rollout.weight_sync == "shared"

    def set_rollout_handles(self, handles: Sequence[Any]) -> None:
        """The rollout workers rank 0 sends weights to (disaggregated placement)."""
        self._publisher().rollout_handles = tuple(handles)

    @property
    def model(self) -> nn.Module:
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        return self.manager.module

    # -- offload (the trainer calls these where `rlshell.runners.offload` says so)

    def offload(self, params: bool) -> float:
        """Move the optimizer state and, with ``params``, the parameters and gradients to host
        memory, making room on a GPU the rollout shares; the seconds it took."""
        manager = self._manager()
        started = time.perf_counter()
        manager.offload_optimizer()
        if params:
            manager.offload_param_and_grad(offload_grad=True)
        return time.perf_counter() - started

    def reload(self, params: bool) -> float:
        """Undo `offload` before the update (``params`` as given to it); the seconds it took."""
        manager = self._manager()
        started = time.perf_counter()
        device = worker_device()
        if params:
            manager.load_param_and_grad(device, load_grad=True)
        manager.load_optimizer(device)
        return time.perf_counter() - started

    def _manager(self) -> TrainingBackend:
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        return self.manager

    # -- rollout (collocated)

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> RolloutBatch:
        """Sample responses with the in-process engine (collocated placement only)."""
        if self.engine is None:
            raise RuntimeError(
                "this actor has no rollout engine: the rollout runs in its own worker group"
            )
        if self.borrowing_engine is not None:
            assert self.manager is not None
            with (
                self.manager.unsharded() as model,
                self.borrowing_engine.borrowing(dict(model.named_parameters())),
            ):
                return sample(self.borrowing_engine, self.agent, prompts, params, seed)
        return sample(self.engine, self.agent, prompts, params, seed)

    # -- weights

    def sync_model_to_rollout(self, full: bool = False) -> dict[str, float]:
        """Send the current weights to the rollout (`WeightPublisher.sync`): in memory to the
        engine in this process, or rank 0 → rollout workers. Collective. ``full=True``
        sends everything even in ``patch`` mode (start, resume)."""
        if self.shared:
            return {"bytes": 0.0, "seconds": 0.0, "messages": 0.0}
        return self._publisher().sync(self._manager(), full)

    def stage_weights(self, full: bool = False) -> tuple[list[Any], dict[str, float]]:
        """One sync to the rollout workers, put in the object store without waiting for them
        (`WeightPublisher.stage`, ``runner.mode='async'``). Collective."""
        return self._publisher().stage(self._manager(), full)

    def _publisher(self) -> WeightPublisher:
        if self.publisher is None:
            raise RuntimeError("init_worker() has not run")
        return self.publisher

    def rollout_weights(self) -> dict[str, Tensor]:
        """The in-process rollout engine's weights (tests compare them with the actor's)."""
        if self.engine is None:
            raise RuntimeError("this actor has no rollout engine")
        return {name: t.detach().clone() for name, t in self.engine.weight_targets().items()}

    def full_weights(self) -> dict[str, Tensor]:
        """The actor's full weights in the checkpoint (HF) layout, on every rank (collective)."""
        manager = self._manager()
        with manager.unsharded() as model:
            return {
                name: t.detach().clone().cpu() for name, t in manager.full_tensors(model).items()
            }

    # -- training

    @torch.no_grad()
    def compute_logprobs(self, batch: RolloutBatch) -> Tensor:
        """π_old: the log-probs of the batch's response tokens under the weights before the
        update (``[rows, response width]``, 0 at padding), on every rank (collective).

        Each data-parallel share runs the forward on its rows, in the micro-batches the update
        uses; one SUM all-reduce over the data-parallel group fills in the others'. Runs
        where the update makes several optimizer steps per batch
        (`rlshell.runners.rules.reasoning.optimizer_steps_per_batch`) or needs π_old before it
        (a KL penalty in the reward): every step's ratio is then taken against these, not
        against weights an earlier step already moved.
        """
        manager = self._manager()
        if manager.pipeline_stages > 1:
            raise NotImplementedError(
                "log-probs before the update through a Megatron pipeline are not built: "
                "validation refuses several optimizer steps per batch with "
                "pipeline_model_parallel_size > 1"
            )
        model = self.model
        model.train()  # the mode the update's forward runs in: the first ratio is exactly 1
        mine = data_parallel_rows(manager, list(range(batch.rows)))
        out = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
        for rows in token_micro_batches(batch, mine, self.config.actor.micro_batch_max_tokens):
            logprobs, _ = self._policy_forward(batch.select(rows))
            out[torch.as_tensor(rows), : logprobs.shape[1]] = logprobs.float().cpu()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=manager.data_parallel_group)
        return out

    def run_training(
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
        steps = update_schedule(self.config, batch.rows, batch.group_size, self.global_step)
        if old_logprobs is None and len(steps) > 1:
            raise ValueError(
                f"{len(steps)} optimizer steps on one batch need π_old from before the first "
                "(ActorWorker.compute_logprobs)"
            )
        self.model.train()
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
        self.global_step += 1
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
        manager = self._manager()
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
        model = self.model
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
                loss, metrics = self._loss(micro, micro_adv, micro_ref, micro_old, normalizer)
                self._check_finite(loss, position, inputs[position])
                torch.autograd.backward(loss * shares)
                accumulate_metrics(metrics, totals, peaks)
        optimizer_started = time.perf_counter()
        grad_norm, lrs = manager.optimizer_step()
        self._check_finite_gradient(grad_norm, inputs)
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
        out["train/micro_batches"] = float(len(micro_batches))
        # This rank's own clock (rank 0's is what the runner logs).
        out["time/actor_prepare_step"] = passes_started - started
        out["time/actor_forward_backward"] = optimizer_started - passes_started
        out["time/actor_optimizer"] = time.perf_counter() - optimizer_started
        return out

    def _check_finite(self, loss: Tensor, index: int, inputs: tuple[Any, ...] = ()) -> None:
        """NonFiniteLossError where ``loss`` is NaN or infinite, after writing the
        micro-batch that gave it (``inputs``: the batch, its advantages, reference and old
        log-probs) to ``<run dir>/nonfinite/`` and naming the file."""
        value = float(loss.detach())
        if not math.isfinite(value):
            dumped = self._dump_nonfinite(
                f"micro_{index}", {"loss": value, **_named_inputs(inputs)}
            )
            raise NonFiniteLossError(
                f"step {self.global_step + 1}: the loss is {value} on actor rank "
                f"{self.rank} (micro-batch {index}); stopping before the update. {dumped}"
            )

    def _check_finite_gradient(
        self, grad_norm: float, micro_batches: Sequence[tuple[Any, ...]]
    ) -> None:
        """NonFiniteLossError where the gradient norm (of every rank's gradients) is NaN or
        infinite: the optimizer skipped the update; this rank's micro-batches of the step
        (each as `_check_finite`'s ``inputs``) go to ``<run dir>/nonfinite/`` first."""
        if math.isfinite(grad_norm):
            return
        dumped = self._dump_nonfinite(
            "grad",
            {
                "grad_norm": grad_norm,
                "micro_batches": [_named_inputs(inputs) for inputs in micro_batches],
            },
        )
        raise NonFiniteLossError(
            f"step {self.global_step + 1}: the gradient norm is {grad_norm} on actor rank "
            f"{self.rank}; the update was skipped. {dumped}"
        )

    def _dump_nonfinite(self, name: str, record: dict[str, Any]) -> str:
        """Write ``record`` (the offending batch, on the CPU) into the run directory as
        ``step_<step>_rank_<rank>_<name>.pt``."""
        runner = self.config.runner
        step = self.global_step + 1
        # The run directory as this worker's working directory resolves it (the driver's, on
        # one machine; give an absolute runner.output_dir on a cluster).
        run_dir = Path(runner.output_dir) / runner.experiment_name
        return write_nonfinite(
            run_dir,
            f"step_{step}_rank_{self.rank}_{name}",
            {"step": step, "rank": self.rank, **record},
        )

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
            loss, metrics = self._loss(
                micro,
                micro_adv,
                micro_ref,
                micro_old,
                normalizer,
                forward=(stats.logprobs, stats.entropy),
            )
            self._check_finite(loss, index)
            return loss * scale, metrics

        per_micro = pipelined(self._manager()).pipeline_passes(
            [(micro.input_ids, micro.attention_mask) for micro, *_ in inputs], loss_of
        )
        totals: dict[str, float] = {}
        peaks: dict[str, float] = {}
        for metrics in per_micro:
            accumulate_metrics(metrics, totals, peaks)
        return totals, peaks

    def _policy_forward(self, micro: RolloutBatch) -> tuple[Tensor, Tensor]:
        """(log-probs, entropies) of ``micro``'s response tokens under the actor's module."""
        return policy_forward(
            self.model,
            micro,
            self.config.rollout.temperature,
            self.config.actor.logprob_chunk_size,
            # Packing runs every row's prompt: it takes the shared prompt forward's place.
            share_prompts=not self.config.actor.pack_sequences
            and self.config.actor.share_prompt_forward,
            pack=self.config.actor.pack_sequences,
        )

    def _loss(
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
        logprobs, entropy = forward or self._policy_forward(micro)
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

    # -- supervised fine-tuning (the sft runner)

    def run_sft(self, batch: RolloutBatch) -> dict[str, float]:
        """One supervised step on ``batch`` (`rlshell.workers.sft_update.sft_step`); the
        ``train/`` metrics. Collective."""
        metrics = sft_step(
            self._manager(),
            batch,
            self.config.actor,
            self.config.algorithm.loss_agg_mode,
            self._check_finite,
            self._check_finite_gradient,
        )
        self.global_step += 1
        return metrics

    def evaluate_sft(self, batch: RolloutBatch) -> dict[str, float]:
        """``eval/loss`` and ``eval/token_accuracy`` of ``batch``
        (`rlshell.workers.sft_update.sft_evaluation`). Collective."""
        return sft_evaluation(self._manager(), batch, self.config.actor)

    # -- checkpoints

    def save_checkpoint(self, path: str, step: int) -> None:
        """This rank's shard, optimizer, scheduler and RNG states; rank 0 adds the HF config."""
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        target = Path(path) / "actor"
        self.manager.save_checkpoint(target, step)
        if self.rank == 0:
            # The HF config: the Megatron backend's is its host model's (its module is Megatron's).
            host = getattr(self.manager, "host", None)
            config = getattr(host if host is not None else self.model, "config", None)
            if config is not None:
                config.save_pretrained(Path(path) / "hf_config")

    def load_checkpoint(self, path: str) -> int:
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        step = self.manager.load_checkpoint(Path(path) / "actor")
        self.global_step = step
        return step

    def shutdown_distributed(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
