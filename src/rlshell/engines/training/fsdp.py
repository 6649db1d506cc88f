"""FSDP2 training of one model: wrapping, optimizer, schedule, sharded checkpoints, offload.

`FSDPModelManager` keeps RLinf's API so actor workers port with renamed
imports: ``setup_model_and_optimizer()``, ``get_model_state_dict(cpu_offload,
full_state_dict)``, ``save_checkpoint(path, step)`` / ``load_checkpoint(path)``,
``offload_param_and_grad`` / ``load_param_and_grad``, ``offload_optimizer`` /
``load_optimizer``, ``optimizer_step() -> (grad_norm, lr_list)``,
``build_lr_scheduler``, ``build_grad_scaler`` and ``before_micro_batch``.

It needs an initialised default process group (gloo on CPU, NCCL on GPU):
every rank builds the same model from the same seed, then `fully_shard`
shards each wrap unit and the root over a 1-D device mesh of all ranks. A
single rank whose model is already in the FSDP precision is left unsharded
(there is nothing to shard or cast; FSDP would only add its gathers).
Checkpoints are written by every rank with ``torch.distributed.checkpoint``
(one shard each, plus the scheduler and RNG states of that rank), so a run
resumes on the same number of ranks and continues bit for bit.

A model with frozen parameters (LoRA adapters, ``actor.model.is_lora``)
trains and checkpoints only the rest: AdamW holds the trainable parameters
alone, and a checkpoint holds them (and the buffers) without the frozen
base, which a resume rebuilds from ``actor.model`` as the run first built it.
The checkpoint records a fingerprint of the frozen weights
(`rlshell.models.lora.frozen_fingerprint`); a resume that built other ones
(another ``path``, ``model_kwargs``, ``precision`` or ``actor.seed``) is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from rlshell.checkpoint import dcp_reader
from rlshell.config import ActorConfig, OptimConfig, WrapPolicyConfig
from rlshell.models import get_model, torch_dtype
from rlshell.models.lora import frozen_fingerprint
from rlshell.randomness import rng_state, set_rng_state

__all__ = [
    "FSDPModelManager",
    "build_adamw",
    "build_lr_lambda",
    "gathered_named_tensors",
    "move_optimizer_state",
    "move_parameters",
    "rng_state",
    "set_rng_state",
    "wrap_units",
]

EXTRA_STATE = "extra_state_rank{rank}.pt"


def wrap_units(model: nn.Module, policy: WrapPolicyConfig) -> list[nn.Module]:
    """The submodules FSDP shards as units, outermost first, never the root itself.

    A module is a unit when its class name is in ``transformer_layer_cls_to_wrap``
    or ``module_classes_to_wrap``, or its ``_fsdp_wrap_name`` is in
    ``no_split_names``. With all three empty, the model's own lists are used, as
    RLinf reads them: ``_no_split_modules`` (Hugging Face's list of decoder-layer
    classes) and ``_no_split_names`` (``_fsdp_wrap_name`` values, e.g. an action head's).
    Of those, only modules with at least ``min_num_params`` parameters are kept.
    """
    classes = set(policy.transformer_layer_cls_to_wrap) | set(policy.module_classes_to_wrap)
    names = set(policy.no_split_names)
    if not classes and not names:
        classes = set(getattr(model, "_no_split_modules", None) or ())
        names = set(getattr(model, "_no_split_names", None) or ())
    units = [
        module
        for module in model.modules()
        if module is not model
        and (type(module).__name__ in classes or getattr(module, "_fsdp_wrap_name", None) in names)
    ]
    if not units and (classes or names):
        wanted = sorted(classes | names)
        raise ValueError(
            f"actor.fsdp_config.wrap_policy: no module of {type(model).__name__} matches "
            f"{wanted}; class names present: {_class_names(model)}"
        )
    return [
        unit
        for unit in units
        if sum(param.numel() for param in unit.parameters()) >= policy.min_num_params
    ]


def _class_names(model: nn.Module, limit: int = 12) -> str:
    names = sorted({type(m).__name__ for m in model.modules()})
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def build_lr_lambda(optim: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """The learning-rate multiplier after ``step`` optimizer steps.

    Linear warmup from 0 over ``lr_warmup_steps``, then ``constant`` (1),
    ``linear`` (1 → ``min_lr_ratio``) or ``cosine``
    (m + (1 − m)·½(1 + cos(π·progress))) over the remaining steps.
    """
    warmup = optim.lr_warmup_steps
    floor = optim.min_lr_ratio
    # The last of ``total_steps`` updates (index total_steps − 1) runs at the floor.
    decay_steps = max(1, total_steps - warmup - 1)

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if optim.lr_scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / decay_steps)
        if optim.lr_scheduler == "linear":
            return 1.0 - (1.0 - floor) * progress
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier


def build_adamw(parameters: Iterable[nn.Parameter], optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over ``parameters`` with ``actor.optim``'s settings (every training backend's)."""
    return torch.optim.AdamW(
        parameters,
        lr=optim.lr,
        betas=(optim.adam_beta1, optim.adam_beta2),
        eps=optim.adam_eps,
        weight_decay=optim.weight_decay,
        fused=optim.fused,
    )


def gathered_named_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Inside `FSDPModelManager.unsharded`: every state-dict entry of ``model``, full, by name.

    The parameters (a tied one under each of its names) and the persistent
    buffers, as the gathered tensors themselves (no copies): one all-gather
    per FSDP unit on entering the context, instead of one per parameter. Read them
    before the context ends.
    """
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and name not in module._non_persistent_buffers_set:
                tensors[f"{prefix}.{name}" if prefix else name] = buffer
    sharded = [name for name, tensor in tensors.items() if isinstance(tensor, DTensor)]
    if sharded:
        raise RuntimeError(
            f"gathered_named_tensors: {len(sharded)} entries are still sharded "
            f"(e.g. {sharded[0]!r}); call it inside FSDPModelManager.unsharded()"
        )
    return tensors


class FSDPModelManager:
    """One FSDP2-sharded model with its AdamW optimizer, LR schedule and checkpoints."""

    def __init__(self, cfg: ActorConfig, *, total_steps: int, device: torch.device) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDPModelManager needs torch.distributed initialised (the actor worker calls "
                "init_process_group first)"
            )
        self.cfg = cfg
        self.total_steps = total_steps
        self.device = device
        self.model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.grad_scaler: torch.amp.GradScaler | None = None
        self._frozen_fingerprint: str | None = None

    # -- building

    def setup_model_and_optimizer(self) -> None:
        """Build the model (same seed on every rank), shard it, and make its optimizer."""
        torch.manual_seed(self.cfg.seed)
        model = get_model(self.cfg.model)
        if self.cfg.model.gradient_checkpointing:
            enable = getattr(model, "gradient_checkpointing_enable", None)
            if enable is None:
                raise ValueError(
                    f"actor.model.gradient_checkpointing: {type(model).__name__} has no "
                    "gradient_checkpointing_enable()"
                )
            enable()
        model.to(self.device)
        self.model = self._shard(model)
        trainable = [param for param in self.model.parameters() if param.requires_grad]
        if not trainable:
            raise ValueError(
                f"actor.model: every parameter of {type(model).__name__} is frozen; there is "
                "nothing to train"
            )
        self.optimizer = build_adamw(trainable, self.cfg.optim)
        self.lr_scheduler = self.build_lr_scheduler(self.optimizer)
        self.grad_scaler = self.build_grad_scaler(self.cfg.fsdp_config.mixed_precision == "fp16")

    def _shard(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh

        fsdp = self.cfg.fsdp_config
        precision = torch_dtype(fsdp.mixed_precision)
        if dist.get_world_size() == 1 and all(p.dtype == precision for p in model.parameters()):
            # One rank has nothing to shard, and no cast to make: FSDP would only add its
            # per-pass gathers and DTensor dispatch (which dominate a small policy's update).
            return model
        mesh = init_device_mesh(self.device.type, (dist.get_world_size(),))
        mp_policy = MixedPrecisionPolicy(param_dtype=precision, reduce_dtype=torch.float32)
        for unit in wrap_units(model, fsdp.wrap_policy):
            fully_shard(
                unit,
                mesh=mesh,
                reshard_after_forward=fsdp.reshard_after_forward,
                mp_policy=mp_policy,
            )
        fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mp_policy)
        # An embodied policy's rollout enters through predict_action_batch, not forward: without
        # the root's hooks there, the first unit it calls would take itself for FSDP's root.
        if hasattr(model, "predict_action_batch"):
            register_fsdp_forward_method(model, "predict_action_batch")
        return model

    def build_lr_scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """Warmup then constant, linear or cosine decay (see `build_lr_lambda`)."""
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, build_lr_lambda(self.cfg.optim, self.total_steps)
        )

    def build_grad_scaler(self, enabled: bool) -> torch.amp.GradScaler:
        """A loss scaler for fp16 mixed precision; a pass-through when not ``enabled``."""
        return torch.amp.GradScaler(self.device.type, enabled=enabled)

    @property
    def loss_scale(self) -> float | None:
        """The gradient scaler's scale with fp16 mixed precision, else None."""
        if self.grad_scaler is None or not self.grad_scaler.is_enabled():
            return None
        return float(self.grad_scaler.get_scale())

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss`` times the gradient scaler's scale (fp16 mixed precision;
        1 otherwise), so that gradients too small for fp16 survive the backward pass;
        `optimizer_step` divides the scale out again before clipping and stepping."""
        if self.grad_scaler is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        torch.autograd.backward(self.grad_scaler.scale(loss))

    # -- training

    @property
    def module(self) -> nn.Module:
        if self.model is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        return self.model

    @property
    def data_parallel_rank(self) -> int:
        """Every FSDP rank trains on its own rows."""
        return dist.get_rank()

    @property
    def data_parallel_size(self) -> int:
        return dist.get_world_size()

    @property
    def data_parallel_group(self) -> dist.ProcessGroup | None:
        return None  # the default group: every rank

    @property
    def pipeline_stages(self) -> int:
        return 1

    @contextmanager
    def unsharded(self) -> Iterator[nn.Module]:
        """The model with every unit's full parameters gathered once, for inference.

        Each FSDP unit is all-gathered on entry and kept gathered through any
        number of forward passes (``generate`` runs one per new token, which
        would otherwise gather every unit again each time); on exit every unit
        is resharded and its own reshard-after-forward setting restored.
        Collective: every rank enters and leaves together. Gradients are not
        tracked inside (``torch.no_grad``).
        """
        model = self.module
        units = [module for module in model.modules() if isinstance(module, FSDPModule)]
        root = model if isinstance(model, FSDPModule) else None
        # Read only where there are units (an unsharded model has none).
        reshard = bool(units) and self.cfg.fsdp_config.reshard_after_forward
        try:
            with torch.no_grad():
                for unit in units:
                    unit.set_reshard_after_forward(False, recurse=False)
                    unit.unshard()
                yield model
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(reshard and unit is not root, recurse=False)

    def full_tensors(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Inside `unsharded`: `gathered_named_tensors` of the module it yields."""
        return gathered_named_tensors(model)

    def before_micro_batch(self, model: nn.Module, is_last: bool) -> None:
        """Reduce gradients across ranks only after the last micro-batch of a step."""
        if isinstance(model, FSDPModule):
            model.set_requires_gradient_sync(is_last)

    def optimizer_step(self) -> tuple[float, list[float]]:
        """Clip, step and advance the schedule; returns (gradient norm before clipping, lrs).

        A non-finite gradient norm skips the update (the scaler's rule for
        fp16; for fp32/bf16 the caller reports it) and leaves the weights as
        they were. With fp16 the scaler then halves its scale; after
        ``growth_interval`` finite steps in a row it doubles it.
        """
        if self.optimizer is None or self.lr_scheduler is None or self.grad_scaler is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        self.grad_scaler.unscale_(self.optimizer)
        max_norm = self.cfg.optim.clip_grad if self.cfg.optim.clip_grad is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        grad_norm = float(norm)
        if math.isfinite(grad_norm):
            self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        lrs = [float(group["lr"]) for group in self.optimizer.param_groups]
        self.lr_scheduler.step()
        return grad_norm, lrs

    # -- state dicts and checkpoints

    def get_model_state_dict(
        self, cpu_offload: bool = True, full_state_dict: bool = True
    ) -> dict[str, torch.Tensor]:
        """The model's state dict: full tensors (all-gathered) or this rank's shards.

        With ``full_state_dict`` and ``cpu_offload`` only rank 0 receives the
        tensors (other ranks get an empty dict), as torch's API defines.
        """
        options = StateDictOptions(full_state_dict=full_state_dict, cpu_offload=cpu_offload)
        state: dict[str, torch.Tensor] = get_model_state_dict(self.module, options=options)  # type: ignore[assignment]
        return state

    @property
    def has_frozen_parameters(self) -> bool:
        """Whether some parameters do not train (LoRA's base): checkpoints leave them out."""
        return any(not param.requires_grad for param in self.module.parameters())

    def frozen_fingerprint(self) -> str | None:
        """`rlshell.models.lora.frozen_fingerprint` of this rank's frozen parameters (None:
        there are none). They never change, so it is computed once."""
        if not self.has_frozen_parameters:
            return None
        if self._frozen_fingerprint is None:
            self._frozen_fingerprint = frozen_fingerprint(self.module)
        return self._frozen_fingerprint

    def _state_dict_options(self, loading: bool) -> StateDictOptions:
        # Frozen parameters stay out of checkpoints; loading then leaves them as built.
        frozen = self.has_frozen_parameters
        return StateDictOptions(ignore_frozen_params=frozen, strict=not (loading and frozen))

    def save_checkpoint(self, path: str | Path, step: int) -> None:
        """Every rank writes its model and optimizer shard, scheduler and RNG states to ``path``
        (a model's frozen parameters left out, their fingerprint recorded)."""
        if self.optimizer is None or self.lr_scheduler is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        path = Path(path)
        model_state, optim_state = get_state_dict(
            self.module, self.optimizer, options=self._state_dict_options(loading=False)
        )
        dcp_save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
        extra = {
            "step": step,
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "grad_scaler": self.grad_scaler.state_dict() if self.grad_scaler else None,
            "rng": rng_state(),
            "world_size": dist.get_world_size(),
            "frozen_fingerprint": self.frozen_fingerprint(),
        }
        torch.save(extra, path / EXTRA_STATE.format(rank=dist.get_rank()))

    def load_checkpoint(self, path: str | Path) -> int:
        """Restore what `save_checkpoint` wrote (same number of ranks); returns the step."""
        if self.optimizer is None or self.lr_scheduler is None:
            raise RuntimeError("call setup_model_and_optimizer() first")
        path = Path(path)
        extra_path = path / EXTRA_STATE.format(rank=dist.get_rank())
        if not extra_path.is_file():
            raise FileNotFoundError(
                f"checkpoint {path} has no {extra_path.name}: not an actor checkpoint of this "
                f"rank (saved with a different number of ranks, or incomplete)"
            )
        extra = torch.load(extra_path, weights_only=True)
        if extra["world_size"] != dist.get_world_size():
            raise ValueError(
                f"checkpoint {path} was saved by {extra['world_size']} actor ranks; this run has "
                f"{dist.get_world_size()}: resume with the same actor placement"
            )
        self._check_frozen_base(path, extra.get("frozen_fingerprint"))
        options = self._state_dict_options(loading=True)
        model_state, optim_state = get_state_dict(self.module, self.optimizer, options=options)
        dcp_load(
            {"model": model_state, "optim": optim_state},
            checkpoint_id=str(path),
            storage_reader=dcp_reader(path),
        )
        set_state_dict(
            self.module,
            self.optimizer,
            model_state_dict=model_state,
            optim_state_dict=optim_state,
            options=options,
        )
        self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if self.grad_scaler is not None and extra["grad_scaler"] is not None:
            self.grad_scaler.load_state_dict(extra["grad_scaler"])
        set_rng_state(extra["rng"])
        return int(extra["step"])

    def _check_frozen_base(self, path: Path, saved: str | None) -> None:
        """The checkpoint's frozen weights (absent from it) are the ones this rank built."""
        built = self.frozen_fingerprint()
        if saved is None and built is not None:
            raise ValueError(
                f"checkpoint {path} holds a model that trains every weight, but this run's "
                "model has frozen ones (actor.model.is_lora): resume with the actor.model it "
                "was saved with"
            )
        if saved is not None and built is None:
            raise ValueError(
                f"checkpoint {path} holds only the trained part of a model with frozen weights "
                "(LoRA adapters, actor.model.is_lora), but this run's model trains every "
                "weight: resume with the actor.model it was saved with"
            )
        if saved != built:
            raise ValueError(
                f"checkpoint {path} holds LoRA adapters trained on other frozen weights than "
                f"this run's model has (actor rank {dist.get_rank()}): the base is rebuilt from "
                "actor.model (path, model_kwargs, precision) and actor.seed, and one of them "
                "differs from the run that saved it"
            )

    # -- offload (a no-op move on CPU; frees accelerator memory between phases on GPU)

    def offload_param_and_grad(self, offload_grad: bool = False) -> None:
        """Parameters (and, with ``offload_grad``, their gradients) to host memory."""
        self._move_params(torch.device("cpu"), move_grad=offload_grad)

    def load_param_and_grad(self, device: torch.device | str, load_grad: bool = False) -> None:
        """Parameters (and, with ``load_grad``, their gradients) back to ``device``."""
        self._move_params(torch.device(device), move_grad=load_grad)

    def offload_optimizer(self) -> None:
        """The optimizer's state (Adam's moments) to host memory."""
        self._move_optimizer(torch.device("cpu"))

    def load_optimizer(self, device: torch.device | str) -> None:
        """The optimizer's state back to ``device``."""
        self._move_optimizer(torch.device(device))

    def _move_params(self, device: torch.device, move_grad: bool) -> None:
        model = self.module
        if any(isinstance(m, FSDPModule) for m in model.modules()):
            leaving = _accelerator_of(model.parameters())
            # FSDP2 keeps each parameter's shard in storage of its own: Module.to swaps the
            # DTensor parameters in place (the optimizer keeps them) and FSDP re-points its
            # shards at the moved data. It moves the gradients along.
            grads = {}
            if not move_grad:
                grads = {p: p.grad for p in model.parameters() if p.grad is not None}
                for param in grads:
                    param.grad = None
            model.to(device)
            for param, grad in grads.items():
                param.grad = grad
            _release(leaving)
        else:
            move_parameters(model, device, move_grad)

    def _move_optimizer(self, device: torch.device) -> None:
        if self.optimizer is not None:
            move_optimizer_state(self.optimizer, device)


def move_parameters(model: nn.Module, device: torch.device, move_grad: bool) -> None:
    """A plain (not FSDP) module's parameters, and with ``move_grad`` their gradients, to
    ``device``, in place (optimizers keep pointing at them)."""
    leaving = _accelerator_of(model.parameters())
    for param in model.parameters():
        param.data = param.data.to(device)
        if move_grad and param.grad is not None:
            param.grad.data = param.grad.data.to(device)
    _release(leaving)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """An optimizer's state tensors (Adam's moments) to ``device``."""
    leaving = None
    for state in optimizer.state.values():
        for key, value in state.items():
            # ``step`` stays where the optimizer keeps it (a host scalar, or on the device
            # for fused and capturable Adam, which step there).
            if isinstance(value, torch.Tensor) and key != "step":
                leaving = leaving or _accelerator_of([value])
                state[key] = value.to(device)
    _release(leaving)


def _accelerator_of(tensors: Iterable[torch.Tensor]) -> torch.device | None:
    """The CUDA device of the first tensor on one, if any."""
    for tensor in tensors:
        if tensor.device.type == "cuda":
            return tensor.device
    return None


def _release(device: torch.device | None) -> None:
    """Wait for the copies off ``device`` and hand its freed blocks back to the driver."""
    if device is not None:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
