"""The engines and PPO's update step on a CUDA device, without Ray.

Skipped without one: these need an NVIDIA GPU (CI has none; the lent H100 or
H200 runs them with ``python -m pytest tests/gpu``). They import no Ray, so
they also run on a GPU machine whose Python has torch and transformers but
not Ray: the rollout engine chosen by `make_rollout_engine`, the training
backend chosen by `make_training_backend` on a one-rank NCCL group, and the
eager and compiled PPO steps on CUDA tensors.
"""

from __future__ import annotations

import copy
import os
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA (none on this machine)"
)

CUDA = torch.device("cuda", 0)


def _tiny_qwen2(tokenizer: object) -> torch.nn.Module:
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),  # type: ignore[arg-type]
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
        eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
        bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
    )
    torch.manual_seed(0)
    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(config)
    return model


def test_the_hf_engine_samples_on_cuda_reproducibly_with_logprobs_a_forward_recomputes() -> None:
    from rlcore.logprobs import token_logprobs
    from rlcore.tokens import position_ids
    from rlshell.config import RolloutConfig
    from rlshell.engines.rollout import make_rollout_engine
    from rlshell.rollout import SamplingParams
    from rlshell.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    engine = make_rollout_engine(RolloutConfig(), _tiny_qwen2(tokenizer), tokenizer, CUDA)
    params = SamplingParams(n=4, temperature=0.8, max_new_tokens=6)
    first = engine.generate(["1+2=", "13+4="], params, seed=7)
    again = engine.generate(["1+2=", "13+4="], params, seed=7)
    assert torch.equal(first.response_ids, again.response_ids)
    assert first.response_ids.device.type == "cpu"  # batches leave the engine on the host

    model = engine.model  # type: ignore[attr-defined]
    mask = first.attention_mask
    with torch.no_grad():
        logits = model(
            input_ids=first.input_ids.to(CUDA),
            attention_mask=mask.to(CUDA).long(),
            position_ids=position_ids(mask).to(CUDA),
        ).logits
    width = first.prompt_ids.shape[1]
    recomputed = token_logprobs(logits[:, width - 1 : -1].float(), first.response_ids.to(CUDA), 0.8)
    valid = first.response_mask
    torch.testing.assert_close(recomputed.cpu()[valid], first.logprobs[valid], atol=1e-4, rtol=1e-4)


@pytest.fixture
def one_rank_nccl() -> Iterator[None]:
    """This process as rank 0 of a one-rank NCCL group, as an actor worker joins it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=CUDA)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_fsdp_backend_trains_on_cuda_and_saves_what_it_loads(
    one_rank_nccl: None, tmp_path: object
) -> None:
    from pathlib import Path

    from rlshell.config import ActorConfig, ModelConfig
    from rlshell.engines.training import make_training_backend

    kwargs: dict[str, int | float | str | bool] = {
        "vocab_size": 40,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    config = ActorConfig(
        model=ModelConfig(model_kwargs=kwargs, precision="fp32"),
    )
    backend = make_training_backend(config, total_steps=10, device=CUDA)
    backend.setup_model_and_optimizer()
    model = backend.module
    assert next(model.parameters()).device.type == "cuda"
    tokens = torch.randint(0, 40, (4, 12), generator=torch.Generator().manual_seed(0)).to(CUDA)
    losses = []
    for _ in range(3):
        loss = model(input_ids=tokens, labels=tokens).loss
        backend.before_micro_batch(model, is_last=True)
        loss.backward()
        grad_norm, lrs = backend.optimizer_step()
        losses.append(float(loss.detach()))
        assert grad_norm > 0
        assert lrs == [config.optim.lr]
    assert losses[-1] < losses[0]
    backend.save_checkpoint(Path(str(tmp_path)) / "actor", step=3)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    assert backend.load_checkpoint(Path(str(tmp_path)) / "actor") == 3
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], atol=0.0, rtol=0.0, msg=key)


def test_the_compiled_ppo_step_matches_the_eager_one_on_cuda() -> None:
    from rlshell.models.mlp_policy import MLPPolicy, MLPPolicySpec
    from rlshell.rollout.trajectory import Samples
    from rlshell.workers.embodied_update import (
        CompiledPPOStep,
        EagerPPOStep,
        PPOSettings,
        ppo_update,
        torch_optimizer_step,
    )

    torch.manual_seed(0)
    spec = MLPPolicySpec.from_kwargs({"obs_dim": 4, "action_dim": 2, "action_type": "discrete"})
    policy = MLPPolicy(spec).to(CUDA)
    states = torch.randn(32, 4, device=CUDA)
    with torch.no_grad():
        _, info = policy.predict_action_batch({"states": states}, mode="train")
    samples = Samples(
        forward_inputs=info["forward_inputs"],
        logprobs=info["prev_logprobs"],
        values=info["prev_values"],
        advantages=torch.randn(32, device=CUDA),
        returns=torch.randn(32, device=CUDA),
    )
    settings = PPOSettings(ppo_epochs=2, num_minibatches=2, max_grad_norm=0.5)
    eager_policy = copy.deepcopy(policy)
    eager_optimizer = torch.optim.AdamW(eager_policy.parameters(), lr=1e-3)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    eager = EagerPPOStep(
        eager_policy, settings, torch_optimizer_step(eager_policy, eager_optimizer, settings)
    )
    compiled = CompiledPPOStep(policy, optimizer, settings)
    eager_metrics = ppo_update(
        eager_policy, eager, samples, settings, torch.Generator().manual_seed(0)
    )
    compiled_metrics = ppo_update(
        policy, compiled, samples, settings, torch.Generator().manual_seed(0)
    )
    for (name, p), q in zip(policy.named_parameters(), eager_policy.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5, msg=name)
    for key, value in eager_metrics.items():
        assert compiled_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
