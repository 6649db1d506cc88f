"""The actor: training of the policy on its backend, and (collocated) the rollout engine beside it.

Every rank of the actor group builds the same model from ``actor.seed``,
shards it with the training backend ``actor.backend`` names
(`rlshell.engines.training`: FSDP2, Megatron-core, or a plug-in) and trains on its
share of each batch: the RL update is `rlshell.workers.policy_update.PolicyUpdate`'s,
the SFT step `rlshell.workers.sft_update`'s, the weights to the rollout
`rlshell.workers.weight_publishing.WeightPublisher`'s. The advantages come
computed (`rlshell.rollout.advantages`, on the driver).

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

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from rlshell.cluster.worker import Worker
from rlshell.config import Config
from rlshell.engines.rollout import BorrowingEngine, RolloutEngine, make_rollout_engine
from rlshell.engines.rollout.multi_turn import AgentLoop, make_agent_loop, sample
from rlshell.engines.training import TrainingBackend, make_training_backend
from rlshell.models import torch_dtype
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.sync.codec import FlatBuckets
from rlshell.sync.transfer import WeightSender
from rlshell.workers.common import (
    build_rollout_model,
    rollout_precision,
    worker_device,
)
from rlshell.workers.policy_update import NonFiniteGuard, PolicyUpdate
from rlshell.workers.sft_update import sft_evaluation, sft_step
from rlshell.workers.weight_publishing import WeightPublisher

__all__ = [
    "ActorWorker",
]


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
        self.update: PolicyUpdate | None = None  # the RL update, from init_training on

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
        guard = NonFiniteGuard(self.config.runner, self.rank, lambda: self.global_step)
        self.update = PolicyUpdate(self.config, self.manager, guard, lambda: self.global_step)

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

    # -- training

    def compute_logprobs(self, batch: RolloutBatch) -> Tensor:
        """π_old: the log-probs of the batch's response tokens under the weights before the
        update, on every rank (`PolicyUpdate.logprobs`). Collective."""
        return self._update().logprobs(batch)

    def run_training(
        self,
        batch: RolloutBatch,
        advantages: Tensor,
        ref_logprobs: Tensor | None = None,
        old_logprobs: Tensor | None = None,
    ) -> dict[str, float]:
        """The RL update on ``batch`` (`PolicyUpdate.run`); the ``train/`` metrics.
        Collective."""
        metrics = self._update().run(batch, advantages, ref_logprobs, old_logprobs)
        self.global_step += 1
        return metrics

    def _update(self) -> PolicyUpdate:
        if self.update is None:
            raise RuntimeError("init_worker() has not run")
        return self.update

    # -- supervised fine-tuning (the sft runner)

    def run_sft(self, batch: RolloutBatch) -> dict[str, float]:
        """One supervised step on ``batch`` (`rlshell.workers.sft_update.sft_step`); the
        ``train/`` metrics. Collective."""
        metrics = sft_step(
            self._manager(),
            batch,
            self.config.actor,
            self.config.algorithm.loss_agg_mode,
            self._update().guard.check_loss,
            self._update().guard.check_gradient,
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
