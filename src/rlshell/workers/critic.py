"""The critic: the reasoning runner's value model (PPO with GAE), trained beside the actor.

Each rank of the critic group builds the value model `critic_model_config` names
(by default the actor's transformer with a one-output token head), shards it with
its training backend (FSDP: `critic_training_config`) and, per step, (1) predicts
the values of the batch's response tokens before any update, which GAE reads
(`rlcore.advantages.token_gae`), and (2) regresses them onto the returns with
rlcore's ``value_loss`` over the same epochs and mini-batches as the actor
(`rlshell.workers.schedule.update_schedule`). It lives in processes of its own, so
its passes overlap the actor's.
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from attrs import evolve
from torch import Tensor

from rlcore.losses import value_loss
from rlcore.masked import aggregation_normalizer
from rlcore.tokens import position_ids
from rlshell.cluster.worker import Worker
from rlshell.config import ActorConfig, Config, ModelConfig
from rlshell.engines.training import TrainingBackend, make_training_backend
from rlshell.rollout import RolloutBatch
from rlshell.workers.common import NonFiniteLossError, worker_device
from rlshell.workers.schedule import (
    all_reduce_metrics,
    data_parallel_rows,
    token_micro_batches,
    update_schedule,
)

__all__ = ["CriticWorker", "critic_model_config", "critic_training_config"]


def critic_model_config(config: Config) -> ModelConfig:
    """The actor's model as an ``hf_value_model`` (from ``critic.model_path`` when set).

    Not from ``actor.model.checkpoint``: that holds a policy (a language-model head, no
    value head); the critic is built from ``critic.model_path``, ``actor.model.path`` or
    the seed, as without one."""
    path = config.critic.model_path or config.actor.model.path
    return evolve(
        config.actor.model, model_type="hf_value_model", path=path, is_lora=False, checkpoint=None
    )


def critic_training_config(config: Config) -> ActorConfig:
    """What the critic's training backend (FSDP) reads: the actor's settings with the
    critic's model, optimizer and micro-batch budget."""
    critic = config.critic
    return evolve(
        config.actor,
        model=critic_model_config(config),
        optim=critic.optim,  # an OptimConfig: its reads are critic.optim's
        backend="fsdp",
        micro_batch_max_tokens=critic.micro_batch_max_tokens,
    )


class CriticWorker(Worker):
    """One rank of the value model, sharded by FSDP."""

    def __init__(self, config: Config, total_steps: int) -> None:
        self.config = config
        self.total_steps = total_steps
        self.global_step = 0
        self.manager: TrainingBackend | None = None

    def init_worker(self) -> None:
        """Join the group's process group, build and shard the value model."""
        device = worker_device()
        self.init_process_group("nccl" if device.type == "cuda" else "gloo")
        # The token head's logits reach FSDP2's root as a view; nothing here modifies them in
        # place (the values are sliced out of place), so its warning about in-place ops on
        # views does not apply.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        self.manager = make_training_backend(
            critic_training_config(self.config), total_steps=self.total_steps, device=device
        )
        self.manager.setup_model_and_optimizer()

    def _manager(self) -> TrainingBackend:
        if self.manager is None:
            raise RuntimeError("init_worker() has not run")
        return self.manager

    def _values(self, micro: RolloutBatch) -> Tensor:
        """V of the state before each response token (``[rows, response width]``): the head's
        output at the position that predicts the token, as the actor's logits are sliced."""
        model = self._manager().module
        device = next(model.parameters()).device
        mask = micro.attention_mask
        output: Tensor = model(
            input_ids=micro.input_ids.to(device),
            attention_mask=mask.to(device).long(),
            position_ids=position_ids(mask).to(device),
            use_cache=False,
        ).logits[..., 0]
        width = micro.prompt_ids.shape[1]
        return output[:, width - 1 : -1].float()

    @torch.no_grad()
    def compute_values(self, batch: RolloutBatch) -> Tensor:
        """The values of the batch's response tokens before the update (0 at padding), on
        every rank (collective: each data-parallel share computes its rows)."""
        manager = self._manager()
        manager.module.train()  # the update's mode (no dropout in the head): same numbers
        mine = data_parallel_rows(manager, list(range(batch.rows)))
        out = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
        budget = self.config.critic.micro_batch_max_tokens
        for rows in token_micro_batches(batch, mine, budget):
            values = self._values(batch.select(rows)).cpu()
            out[torch.as_tensor(rows), : values.shape[1]] = values
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=manager.data_parallel_group)
        return torch.where(batch.response_mask, out, 0.0)

    def run_training(
        self, batch: RolloutBatch, returns: Tensor, old_values: Tensor
    ) -> dict[str, float]:
        """Regress the values onto ``returns`` (clipped around ``old_values`` by
        ``algorithm.value_clip``): one optimizer step per mini-batch of the actor's schedule;
        the ``critic/`` metrics, means over the steps."""
        manager = self._manager()
        started = time.perf_counter()
        algorithm = self.config.algorithm
        mode = algorithm.loss_agg_mode
        horizon = self.config.rollout.max_new_tokens
        budget = self.config.critic.micro_batch_max_tokens
        shares = manager.data_parallel_size
        manager.module.train()
        steps = update_schedule(self.config, batch.rows, batch.group_size, self.global_step)
        per_step: list[dict[str, float]] = []
        for _, rows in steps:
            normalizer = aggregation_normalizer(
                batch.trained_mask[torch.as_tensor(rows)], mode, horizon
            )
            micro_batches = token_micro_batches(batch, data_parallel_rows(manager, rows), budget)
            totals: dict[str, float] = {}
            for position, micro_rows in enumerate(micro_batches):
                micro = batch.select(micro_rows)
                index = torch.as_tensor(micro_rows)
                width = micro.response_ids.shape[1]
                manager.before_micro_batch(
                    manager.module, is_last=position == len(micro_batches) - 1
                )
                values = self._values(micro)
                output = value_loss(
                    values,
                    old_values[index, :width].to(values),
                    returns[index, :width].to(values),
                    micro.trained_mask.to(values.device),
                    clip=algorithm.value_clip,
                    agg=mode,
                    normalizer=normalizer,
                )
                loss = output.loss
                if not math.isfinite(float(loss.detach())):
                    raise NonFiniteLossError(
                        f"step {self.global_step + 1}: the value loss is {float(loss)} on "
                        f"critic rank {self.rank} (micro-batch {position})"
                    )
                manager.backward(loss * shares)
                totals["vf_loss"] = totals.get("vf_loss", 0.0) + float(loss.detach())
                for key, value in output.metrics.items():
                    totals[key] = totals.get(key, 0.0) + float(value) / len(micro_batches)
            grad_norm, lrs = manager.optimizer_step()
            # with fp16's loss scale an overflow is skipped and the scale lowered
            if not math.isfinite(grad_norm) and manager.loss_scale is None:
                raise NonFiniteLossError(
                    f"step {self.global_step + 1}: the critic's gradient norm is {grad_norm} "
                    f"on critic rank {self.rank}; the update was skipped"
                )
            reduced = all_reduce_metrics(totals, dist.ReduceOp.SUM, manager.data_parallel_group)
            # vf_loss is normalised by the whole mini-batch already: its sum is the batch's;
            # the per-micro-batch means are averaged over the shares.
            step = {
                f"critic/{key}": value if key == "vf_loss" else value / shares
                for key, value in reduced.items()
            }
            step["critic/grad_norm"] = grad_norm
            step["critic/lr"] = lrs[0]
            per_step.append(step)
        out = {key: sum(s[key] for s in per_step) / len(per_step) for key in per_step[0]}
        out["critic/lr"] = per_step[-1]["critic/lr"]
        out["time/critic_update"] = time.perf_counter() - started
        self.global_step += 1
        return out

    # -- checkpoints

    def save_checkpoint(self, path: str, step: int) -> None:
        """This rank's shard, optimizer, scheduler and RNG states under ``path/critic``."""
        self._manager().save_checkpoint(Path(path) / "critic", step)

    def load_checkpoint(self, path: str) -> int:
        target = Path(path) / "critic"
        if not target.is_dir():
            raise FileNotFoundError(
                f"checkpoint {path} has no critic/ folder: it was saved by a run without a "
                "critic (algorithm.adv_type other than 'gae'); start this run fresh"
            )
        step = self._manager().load_checkpoint(target)
        self.global_step = step
        return step

    def shutdown_distributed(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
