"""`MegatronModelManager`: one rank of a Megatron-core GPT policy, behind the `TrainingBackend` API.

The same method names and meanings as `rlshell.engines.training.fsdp.FSDPModelManager`
(RLinf's ``MegatronModelManager`` keeps them too): ``setup_model_and_optimizer``,
``optimizer_step() -> (grad_norm, lrs)``, ``get_model_state_dict``,
``save_checkpoint`` / ``load_checkpoint``, the offload pairs, ``unsharded``.

Building: every rank builds the Hugging Face model ``actor.model`` describes
from the same seed (so Megatron starts from exactly the weights FSDP would),
keeps it as a host copy, builds its own Megatron stage
(`rlshell.engines.training.megatron.model.build_gpt_stage`) and loads its
shard of those weights (`rlshell.engines.training.megatron.layout.megatron_shard`).

An optimizer step (no Megatron DDP: it needs CUDA streams): gradients are
averaged over the data-parallel replicas; with tied embeddings over several
pipeline stages, the first stage's embedding and the last stage's copy of it
get the sum of both gradients (they stay equal); the norm is Megatron's
(`get_grad_norm_fp32` over the model-parallel group, tensor-parallel
duplicates and the embedding copy counted once); clipping scales by
``clip_grad / (norm + 1e-6)`` when that is below 1, as torch's
``clip_grad_norm_`` (and so the FSDP backend) does; then AdamW on this rank's
shards (element-wise: sharded AdamW is AdamW) and the LR schedule.

Checkpoints: ``actor/`` holds the model's whole Hugging Face state dict in
``torch.distributed.checkpoint`` format (written once, whatever the ranks;
the evaluation and export tools read it as they read FSDP's) and one file per
rank with its optimizer shard, scheduler, RNG states and place in the grid.
A resume needs the same grid; it re-shards the saved weights (exact: slices).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from rlshell.checkpoint import dcp_reader
from rlshell.config import ActorConfig
from rlshell.engines.training.fsdp import (
    build_adamw,
    build_lr_lambda,
    gathered_named_tensors,
    move_optimizer_state,
    move_parameters,
)
from rlshell.engines.training.megatron.layout import GPTLayout, hf_from_shards, megatron_shard
from rlshell.engines.training.megatron.model import (
    MegatronCausalLM,
    build_gpt_stage,
    pipeline_train_passes,
)
from rlshell.engines.training.megatron.parallel import MegatronRanks, init_model_parallel
from rlshell.models import get_model, torch_dtype
from rlshell.randomness import rng_state, set_rng_state

__all__ = ["RANK_STATE", "MegatronModelManager"]

RANK_STATE = "megatron_rank{rank}.pt"


class MegatronModelManager:
    """One Megatron-core rank (tensor × pipeline × data parallel), its AdamW and checkpoints."""

    def __init__(self, cfg: ActorConfig, *, total_steps: int, device: torch.device) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "MegatronModelManager needs torch.distributed initialised (the actor worker "
                "calls init_process_group first)"
            )
        self.cfg = cfg
        self.total_steps = total_steps
        self.device = device
        self.ranks: MegatronRanks | None = None
        self.layout: GPTLayout | None = None
        self.stage: nn.Module | None = None
        self.host: nn.Module | None = None  # the whole model in HF layout: unsharded()'s
        self._module: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LambdaLR | None = None

    # -- building

    def setup_model_and_optimizer(self) -> None:
        """Megatron's groups, the HF model from the seed, this rank's stage and its AdamW."""
        megatron = self.cfg.megatron
        self.ranks = init_model_parallel(
            megatron.tensor_model_parallel_size,
            megatron.pipeline_model_parallel_size,
            seed=self.cfg.seed,
        )
        torch.manual_seed(self.cfg.seed)  # the FSDP backend's seed and build: the same weights
        host = get_model(self.cfg.model)
        config = getattr(host, "config", None)
        if config is None:
            raise ValueError(
                f"actor.backend=megatron trains Hugging Face Qwen2/Llama models; "
                f"actor.model builds a {type(host).__name__}"
            )
        self.layout = GPTLayout.of(config, tp=self.ranks.tp, pp=self.ranks.pp)
        self.host = host.eval().requires_grad_(False)
        stage = self.model_provider_func(
            pre_process=self.ranks.pp_rank == 0,
            post_process=self.ranks.pp_rank == self.ranks.pp - 1,
        )
        self._load_stage(stage, host.state_dict())
        tied_copy = self._tied_copy(stage)
        if tied_copy is not None:
            # Megatron's grad-norm helpers skip parameters marked shared: count the copy once.
            tied_copy.shared = True  # type: ignore[attr-defined]
        self.stage = stage.to(self.device)
        self._module = MegatronCausalLM(stage, self.layout) if self.layout.pp == 1 else stage
        self.optimizer = build_adamw(self.stage.parameters(), self.cfg.optim)
        self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, build_lr_lambda(self.cfg.optim, self.total_steps)
        )

    def model_provider_func(self, pre_process: bool, post_process: bool) -> nn.Module:
        """This rank's GPT stage, unloaded (RLinf's and Megatron's name): with the embedding
        when ``pre_process``, with the final norm and output layer when ``post_process``."""
        if self.host is None or self.layout is None:
            raise RuntimeError("model_provider_func needs the HF model; it runs in setup")
        embeddings = self.host.get_input_embeddings()  # type: ignore[operator]
        stage: nn.Module = build_gpt_stage(
            self.host.config,
            self.layout,
            torch_dtype(self.cfg.model.precision),
            padding_idx=getattr(embeddings, "padding_idx", None),
            pre_process=pre_process,
            post_process=post_process,
        )
        return stage

    def _load_stage(self, stage: nn.Module, hf_state: dict[str, torch.Tensor]) -> None:
        assert self.layout is not None
        assert self.ranks is not None
        shard = megatron_shard(hf_state, self.layout, self.ranks.tp_rank, self.ranks.pp_rank)
        missing, unexpected = stage.load_state_dict(shard, strict=False)
        missing = [key for key in missing if not key.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(
                f"the Megatron stage and its HF shard differ: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}"
            )

    def _tied_copy(self, stage: nn.Module) -> nn.Parameter | None:
        """The last stage's copy of a tied embedding (tied embeddings over several stages)."""
        assert self.layout is not None
        assert self.ranks is not None
        last = self.ranks.pp_rank == self.layout.pp - 1
        if self.layout.tied_embeddings and self.layout.pp > 1 and last:
            weight: nn.Parameter = stage.output_layer.weight  # type: ignore[union-attr,assignment]
            return weight
        return None

    # -- the grid

    @property
    def module(self) -> nn.Module:
        """The model this rank trains: a causal LM (``model(...).logits``) with one pipeline
        stage, the raw Megatron stage with several (driven by Megatron's schedule)."""
        if self._module is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        return self._module

    @property
    def data_parallel_rank(self) -> int:
        return self._ranks().dp_rank

    @property
    def data_parallel_size(self) -> int:
        return self._ranks().dp

    @property
    def data_parallel_group(self) -> dist.ProcessGroup:
        from megatron.core import parallel_state

        group: dist.ProcessGroup = parallel_state.get_data_parallel_group()
        return group

    @property
    def pipeline_stages(self) -> int:
        return self._ranks().pp

    def _ranks(self) -> MegatronRanks:
        if self.ranks is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        return self.ranks

    # -- training

    def before_micro_batch(self, model: nn.Module, is_last: bool) -> None:
        """Nothing: gradients are reduced once, in `optimizer_step`."""

    def backward(self, loss: torch.Tensor) -> None:
        """``loss``'s gradients as they are: this backend keeps no loss scale."""
        torch.autograd.backward(loss)

    @property
    def loss_scale(self) -> float | None:
        return None

    def pipeline_passes(
        self,
        micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        loss_of: Callable[[int, torch.Tensor], tuple[torch.Tensor, dict[str, float]]],
    ) -> list[dict[str, float]]:
        """Every micro-batch through Megatron's 1F1B schedule (`pipeline_train_passes`); the
        last stage's metrics handed to every stage of its pipeline, so that every rank
        reduces the same keys."""
        from megatron.core import parallel_state

        per_micro = pipeline_train_passes(self.module, micro_batches, loss_of)
        shared: list[Any] = [per_micro]
        dist.broadcast_object_list(
            shared,
            src=parallel_state.get_pipeline_model_parallel_last_rank(),
            group=parallel_state.get_pipeline_model_parallel_group(),
        )
        received: list[dict[str, float]] = shared[0]
        return received

    def optimizer_step(self) -> tuple[float, list[float]]:
        """Reduce, clip, step and schedule; (gradient norm before clipping, learning rates).

        A non-finite norm skips the update and leaves the weights as they were.
        """
        from megatron.core import parallel_state
        from megatron.core.optimizer.clip_grads import get_grad_norm_fp32
        from megatron.core.tensor_parallel.layers import param_is_not_tensor_parallel_duplicate

        from rlshell.engines.training.megatron.cpu_shim import cpu_device_mode

        if self.optimizer is None or self.lr_scheduler is None or self.stage is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        params = [p for p in self.stage.parameters() if p.requires_grad]
        for param in params:
            if param.grad is None:  # a parameter no loss reached: a zero gradient, all ranks alike
                param.grad = torch.zeros_like(param)
        grads = [param.grad for param in params if param.grad is not None]
        if self.data_parallel_size > 1:
            flat = torch.cat([grad.reshape(-1) for grad in grads])
            dist.all_reduce(flat, group=self.data_parallel_group)
            flat /= self.data_parallel_size
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        tied = self.layout is not None and self.layout.tied_embeddings and self.layout.pp > 1
        if tied and parallel_state.is_rank_in_embedding_group():
            shared = (
                self.stage.embedding.word_embeddings.weight  # type: ignore[union-attr]
                if parallel_state.is_pipeline_first_stage()
                else self._tied_copy(self.stage)
            )
            assert shared is not None
            assert shared.grad is not None
            dist.all_reduce(shared.grad, group=parallel_state.get_embedding_group())
        counted = [
            param.grad
            for param in params
            if param.grad is not None
            and not getattr(param, "shared", False)
            and param_is_not_tensor_parallel_duplicate(param)
        ]
        with cpu_device_mode():
            norm = get_grad_norm_fp32(
                counted, grad_stats_parallel_group=parallel_state.get_model_parallel_group()
            )
        grad_norm = float(norm)
        clip = self.cfg.optim.clip_grad
        if math.isfinite(grad_norm):
            if clip is not None:
                torch.nn.utils.clip_grads_with_norm_(params, clip, torch.tensor(grad_norm))
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lrs = [float(group["lr"]) for group in self.optimizer.param_groups]
        self.lr_scheduler.step()
        return grad_norm, lrs

    # -- whole weights

    def _gathered_hf_state(self) -> dict[str, torch.Tensor]:
        """The whole model in HF names, on every rank (collective over the model-parallel group)."""
        from megatron.core import parallel_state

        assert self.stage is not None
        assert self.layout is not None
        ranks = self._ranks()
        local = {
            name: tensor.detach().cpu()
            for name, tensor in self.stage.state_dict().items()
            if not name.endswith("_extra_state")
        }
        shards: list[Any] = [None] * (ranks.tp * ranks.pp)
        group = parallel_state.get_model_parallel_group()
        dist.all_gather_object(shards, ((ranks.tp_rank, ranks.pp_rank), local), group=group)
        return hf_from_shards(dict(shards), self.layout)

    def full_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Inside `unsharded`: the host module's entries (a plain module: nothing sharded)."""
        return gathered_named_tensors(model)

    @contextmanager
    def unsharded(self) -> Iterator[nn.Module]:
        """The whole model as a Hugging Face module, with the current weights (collective)."""
        if self.host is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        state = self._gathered_hf_state()
        with torch.no_grad():
            self.host.load_state_dict(state, strict=True)
            yield self.host

    def get_model_state_dict(
        self, cpu_offload: bool = True, full_state_dict: bool = True
    ) -> dict[str, torch.Tensor]:
        """Full: the HF state dict (with ``cpu_offload`` on rank 0 only, as the FSDP backend
        gives it); otherwise this rank's Megatron stage. Collective when full."""
        if self.stage is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        if not full_state_dict:
            return {
                name: tensor.detach().cpu() if cpu_offload else tensor.detach()
                for name, tensor in self.stage.state_dict().items()
                if not name.endswith("_extra_state")
            }
        state = self._gathered_hf_state()
        return state if not cpu_offload or dist.get_rank() == 0 else {}

    # -- checkpoints

    def save_checkpoint(self, path: str | Path, step: int) -> None:
        """The whole HF state dict (DCP, written once) and each rank's optimizer, scheduler,
        RNG states and place in the grid."""
        if self.optimizer is None or self.lr_scheduler is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        path = Path(path)
        dcp_save({"model": self._gathered_hf_state()}, checkpoint_id=str(path))
        state = {
            "step": step,
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "rng": rng_state(),
            "world_size": dist.get_world_size(),
            "ranks": attrs.asdict(self._ranks()),
            "layout": attrs.asdict(self.layout) if self.layout else None,
        }
        torch.save(state, path / RANK_STATE.format(rank=dist.get_rank()))

    def load_checkpoint(self, path: str | Path) -> int:
        """Restore what `save_checkpoint` wrote, on the same grid; returns the step."""
        if self.optimizer is None or self.lr_scheduler is None or self.stage is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        assert self.host is not None
        assert self.layout is not None
        path = Path(path)
        rank_file = path / RANK_STATE.format(rank=dist.get_rank())
        if not rank_file.is_file():
            raise FileNotFoundError(
                f"checkpoint {path} has no {rank_file.name}: not a Megatron actor checkpoint "
                "of this rank (saved by another backend or number of ranks, or incomplete)"
            )
        state = torch.load(rank_file, weights_only=True)
        here = {"ranks": attrs.asdict(self._ranks()), "layout": attrs.asdict(self.layout)}
        saved = {"ranks": state["ranks"], "layout": state["layout"]}
        if state["world_size"] != dist.get_world_size() or saved != here:
            raise ValueError(
                f"checkpoint {path} was saved by a Megatron grid {saved['ranks']} of "
                f"{state['world_size']} ranks; this run's is {here['ranks']}: resume with the "
                "same actor placement and actor.megatron sizes"
            )
        model_state = {"model": self.host.state_dict()}
        dcp_load(model_state, checkpoint_id=str(path), storage_reader=dcp_reader(path))
        self.host.load_state_dict(model_state["model"])
        with torch.no_grad():
            self._load_stage(self.stage, model_state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        set_rng_state(state["rng"])
        return int(state["step"])

    # -- offload (a no-op move on CPU; frees accelerator memory between phases on GPU)

    def offload_param_and_grad(self, offload_grad: bool = False) -> None:
        move_parameters(self._stage(), torch.device("cpu"), move_grad=offload_grad)

    def load_param_and_grad(self, device: torch.device | str, load_grad: bool = False) -> None:
        move_parameters(self._stage(), torch.device(device), move_grad=load_grad)

    def offload_optimizer(self) -> None:
        if self.optimizer is not None:
            move_optimizer_state(self.optimizer, torch.device("cpu"))

    def load_optimizer(self, device: torch.device | str) -> None:
        if self.optimizer is not None:
            move_optimizer_state(self.optimizer, torch.device(device))

    def _stage(self) -> nn.Module:
        if self.stage is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        return self.stage
