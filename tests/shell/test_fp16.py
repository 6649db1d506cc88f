"""fp16 mixed precision with a gradient scaler (``actor.fsdp_config.mixed_precision=fp16``), on
CPU: FSDP2 computes in fp16 there and torch's GradScaler runs on CPU tensors.

A step's loss is multiplied by the scaler's scale before backward (`FSDPModelManager.backward`)
and divided out before the clip and the step (`FSDPModelManager.optimizer_step`); a step whose
gradients overflow is skipped and halves the scale; finite steps grow it again. The reasoning
update goes on after such a step and reports its scale; the embodied PPO runners, whose update
does neither, refuse fp16 before start.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from attrs import evolve

from rlshell.config import ActorConfig, ConfigError
from rlshell.engines.training.fsdp import FSDPModelManager
from rlshell.rollout.advantages import compute_advantages
from rlshell.runners.rules.reasoning import optimizer_steps_per_batch
from rlshell.runners.validation import load_config
from tests.shell.test_reasoning_update import _batch, _config, _worker, tokenizer_dir

__all__ = ["tokenizer_dir"]  # the reasoning update's tokenizer fixture, used below

INIT_SCALE = 2.0**16  # torch.amp.GradScaler's default
IDS = torch.tensor([[3, 9, 14, 27, 5, 11, 40, 2], [7, 7, 21, 33, 8, 19, 1, 6]])


def actor_config(mixed_precision: str = "fp16") -> ActorConfig:
    overrides = [
        f"actor.fsdp_config.mixed_precision={mixed_precision}",
        "actor.model.model_kwargs.vocab_size=64",  # a small embedding: the test stays quick
    ]
    return load_config("configs/grpo.py", overrides).actor


def loss_of(manager: FSDPModelManager, weight: float = 1.0) -> torch.Tensor:
    logits = manager.module(input_ids=IDS).logits
    return logits.float().square().mean() * weight


def grads(manager: FSDPModelManager) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in manager.module.named_parameters():
        assert param.grad is not None, name
        grad: Any = param.grad
        out[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).clone()
    return out


def weights(manager: FSDPModelManager) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in manager.get_model_state_dict().items()}


@pytest.fixture
def manager(process_group: None) -> FSDPModelManager:
    torch.manual_seed(0)
    built = FSDPModelManager(actor_config(), total_steps=8, device=torch.device("cpu"))
    built.setup_model_and_optimizer()
    return built


def test_the_forward_runs_in_fp16_with_an_enabled_scaler(manager: FSDPModelManager) -> None:
    assert manager.grad_scaler is not None
    assert manager.grad_scaler.is_enabled()
    assert manager.grad_scaler.get_scale() == INIT_SCALE
    assert manager.module(input_ids=IDS).logits.dtype == torch.float16


def test_the_scale_multiplies_the_gradients_and_the_step_divides_it_out(
    manager: FSDPModelManager,
) -> None:
    manager.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    torch.autograd.backward(loss_of(manager))
    plain = grads(manager)
    manager.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    manager.backward(loss_of(manager))
    scaled = grads(manager)
    # the same gradients times the scale, up to fp16's rounding (and what underflows to 0
    # without the scale, the reason for it); per tensor, the key biases' gradients (0 in exact
    # arithmetic: softmax ignores a shift) are rounding alone
    unscaled = torch.cat([scaled[name].flatten() / INIT_SCALE for name in plain])
    reference = torch.cat([grad.flatten() for grad in plain.values()])
    assert float((unscaled - reference).norm() / reference.norm()) < 1e-2
    plain_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in plain.values()]))
    before = weights(manager)
    grad_norm, _ = manager.optimizer_step()
    assert grad_norm == pytest.approx(float(plain_norm), rel=2e-2)  # the unscaled norm
    after = weights(manager)
    assert any(not torch.equal(before[key], after[key]) for key in before)
    assert manager.grad_scaler is not None
    assert manager.grad_scaler.get_scale() == INIT_SCALE
    assert manager.grad_scaler.state_dict()["_growth_tracker"] == 1  # one finite step counted


def test_a_few_fp16_steps_lower_the_loss(manager: FSDPModelManager) -> None:
    first = float(loss_of(manager).detach())
    for _ in range(4):
        manager.backward(loss_of(manager))
        grad_norm, _ = manager.optimizer_step()
        assert math.isfinite(grad_norm)
    assert float(loss_of(manager).detach()) < first


def test_an_overflowing_step_is_skipped_and_halves_the_scale(manager: FSDPModelManager) -> None:
    before = weights(manager)
    # times the scale (2**16) the loss's gradient exceeds fp16's largest value, 65504
    manager.backward(loss_of(manager, weight=1e4))
    grad_norm, _ = manager.optimizer_step()
    assert not math.isfinite(grad_norm)
    after = weights(manager)
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert manager.grad_scaler is not None
    assert manager.grad_scaler.get_scale() == INIT_SCALE / 2
    # the next finite step trains at the halved scale
    manager.backward(loss_of(manager))
    assert math.isfinite(manager.optimizer_step()[0])
    assert any(not torch.equal(after[key], value) for key, value in weights(manager).items())


class GrowingScaler(FSDPModelManager):
    """RLinf's override point: a scaler that doubles after every finite step."""

    def build_grad_scaler(self, enabled: bool) -> torch.amp.GradScaler:
        return torch.amp.GradScaler("cpu", enabled=enabled, growth_interval=1)


def test_finite_steps_grow_the_scale_back(process_group: None) -> None:
    manager = GrowingScaler(actor_config(), total_steps=8, device=torch.device("cpu"))
    manager.setup_model_and_optimizer()
    assert manager.grad_scaler is not None
    manager.backward(loss_of(manager, weight=1e4))
    manager.optimizer_step()
    assert manager.grad_scaler.get_scale() == INIT_SCALE / 2
    manager.backward(loss_of(manager))
    manager.optimizer_step()
    assert manager.grad_scaler.get_scale() == INIT_SCALE


def test_without_fp16_the_scaler_passes_the_loss_through(process_group: None) -> None:
    actor = evolve(actor_config("fp32"))
    manager = FSDPModelManager(actor, total_steps=8, device=torch.device("cpu"))
    manager.setup_model_and_optimizer()
    assert manager.grad_scaler is not None
    assert not manager.grad_scaler.is_enabled()
    torch.manual_seed(1)
    torch.autograd.backward(loss_of(manager))
    plain = grads(manager)
    manager.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    manager.backward(loss_of(manager))
    for name, grad in grads(manager).items():
        assert torch.equal(grad, plain[name]), name


# --- the reasoning update (tests/shell/test_reasoning_update.py's worker) in fp16 -------------


def test_a_reasoning_update_in_fp16_trains_and_reports_its_loss_scale(
    tokenizer_dir: str, process_group: None
) -> None:
    config = _config(tokenizer_dir, ["actor.fsdp_config.mixed_precision=fp16"])
    batch, scores = _batch(config, tokenizer_dir)
    worker = _worker(config, tokenizer_dir)
    before = worker.full_weights()
    metrics = worker.run_training(batch, compute_advantages(batch, scores, config).advantages)
    assert metrics["train/loss_scale"] == INIT_SCALE
    assert math.isfinite(metrics["train/grad_norm"])
    after = worker.full_weights()
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_an_overflow_in_a_reasoning_update_is_skipped_and_halves_the_scale(
    tokenizer_dir: str, process_group: None
) -> None:
    config = _config(tokenizer_dir, ["actor.fsdp_config.mixed_precision=fp16"])
    batch, scores = _batch(config, tokenizer_dir)
    worker = _worker(config, tokenizer_dir)
    before = worker.full_weights()

    def huge_gradient(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if module.training:  # finite, but past fp16's range once the loss is scaled
            output.logits.register_hook(lambda grad: grad * 1e6)
        return output

    worker.model.register_forward_hook(huge_gradient)
    metrics = worker.run_training(batch, compute_advantages(batch, scores, config).advantages)
    steps = optimizer_steps_per_batch(config)
    assert not math.isfinite(metrics["train/grad_norm"])
    assert metrics["train/loss_scale"] == INIT_SCALE / 2**steps  # halved at every step
    for name, value in worker.full_weights().items():
        assert torch.equal(value, before[name]), name


PIPELINED = 'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "env": "0:0"}'


@pytest.mark.parametrize("placement", [[], [PIPELINED]], ids=["collocated", "pipelined"])
def test_the_embodied_ppo_runners_refuse_fp16_with_the_reason(placement: list[str]) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(
            "configs/ppo_cartpole.py", ["actor.fsdp_config.mixed_precision=fp16", *placement]
        )
    (line,) = [p for p in refused.value.problems if "mixed_precision" in p]
    runner = "the pipelined embodied PPO runner" if placement else "the embodied PPO runner"
    assert line == (
        "actor.fsdp_config.mixed_precision: 'fp16' needs the loss scaled and a step whose "
        f"gradients overflow skipped, which {runner}'s update does not do (the reasoning, "
        "critic and SFT updates do); use 'bf16' or 'fp32'"
    )
