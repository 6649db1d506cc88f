"""LoRA for ``hf_causal_lm`` (``actor.model.is_lora``): what trains, what the rollout gets, what
a checkpoint holds.

The model is configs/grpo.py's tiny Qwen2 with peft adapters. The actor is
the real `ActorWorker`, run in this process as rank 0 of a one-rank gloo
group with its rollout engine beside it (collocated), as each actor rank
of a run holds it: a GRPO step trains the adapters only, a sync sends the
engine the merged weights (W + s·BA) under the plain model's names, and the
engine's greedy tokens and log-probabilities are then the actor's own. A
checkpoint holds the adapters (and optimizer, scheduler, RNG), and a fresh
worker resumes from it bit for bit; one whose frozen base differs is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attrs import evolve
from torch import nn
from torch.distributed.checkpoint import FileSystemReader

from rlcore.tokens import position_ids
from rlshell.config import Config
from rlshell.models import get_model
from rlshell.models.lora import MergedLoRAWeights, lora_layers
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.rollout.advantages import compute_advantages
from rlshell.runners.validation import load_config
from rlshell.tokenizer import prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.actor import ActorWorker
from rlshell.workers.forward import policy_forward

GRPO = Path("configs/grpo.py")
LORA = ["actor.model.is_lora=true", "actor.model.lora_rank=4", "actor.model.lora_alpha=8"]
PROMPTS = ["1+2+3=", "4+4=", "9+9+9=", "7+0+1="]
PROJECTIONS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_tokenizer(load_config(GRPO), tmp_path_factory.mktemp("run"))


def lora_config(tokenizer_dir: Path, *overrides: str) -> Config:
    return with_tokenizer_ids(load_config(GRPO, [*LORA, *overrides]), tokenizer_dir)


# -- the adapted model


def test_adapters_go_on_every_attention_and_mlp_projection_and_only_they_train(
    tokenizer_dir: Path,
) -> None:
    config = lora_config(tokenizer_dir)
    model = get_model(config.actor.model)
    layers = lora_layers(model)
    assert sorted({name.rsplit(".", 1)[-1] for name in layers}) == PROJECTIONS
    decoder_layers = int(config.actor.model.model_kwargs["num_hidden_layers"])
    assert len(layers) == decoder_layers * len(PROJECTIONS)  # each decoder layer; not the head
    assert {layer.scaling["default"] for layer in layers.values()} == {8 / 4}  # α / r
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        f"{prefix}.lora_{side}.default.weight" for prefix in layers for side in "AB"
    }


def test_the_target_modules_key_chooses_the_layers_and_a_name_that_matches_none_is_named(
    tokenizer_dir: Path,
) -> None:
    chosen = lora_config(tokenizer_dir, 'actor.model.lora_target_modules=["q_proj","v_proj"]')
    names = {name.rsplit(".", 1)[-1] for name in lora_layers(get_model(chosen.actor.model))}
    assert names == {"q_proj", "v_proj"}
    wrong = lora_config(tokenizer_dir, 'actor.model.lora_target_modules=["qkv_proj"]')
    with pytest.raises(ValueError, match=r"actor.model.lora_target_modules: no layer .*q_proj"):
        get_model(wrong.actor.model)


@pytest.mark.parametrize(
    "targets",
    [[], ["embed_tokens", "q_proj", "lm_head"]],
    ids=["all_linear", "with_embedding_and_head"],
)
def test_the_merged_weights_are_the_plain_models_names_and_w_plus_s_ba(
    tokenizer_dir: Path, targets: list[str]
) -> None:
    chosen = [f"actor.model.lora_target_modules={targets}".replace("'", '"')] if targets else []
    config = lora_config(tokenizer_dir, *chosen)
    torch.manual_seed(0)
    adapted = get_model(config.actor.model)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name:
                param.normal_(std=0.1)  # B = 0 at start: give the adapters something to add
    state = adapted.state_dict()
    merged = MergedLoRAWeights(adapted, state)
    plain = get_model(evolve(config.actor.model, is_lora=False))
    assert list(merged) == list(plain.state_dict())
    prefix = "model.layers.1.self_attn.q_proj"
    a, b = (adapted.get_submodule(f"{prefix}.lora_{side}.default").weight for side in "AB")
    base = adapted.get_submodule(f"{prefix}.base_layer").weight
    torch.testing.assert_close(merged[f"{prefix}.weight"], base + 2.0 * b @ a)
    unadapted = "model.norm.weight"  # passes through as it is
    assert merged[unadapted] is state[unadapted]
    plain.load_state_dict(dict(merged))
    ids = torch.randint(0, 10, (2, 6))
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, adapted(ids).logits, rtol=0, atol=1e-5)


# -- the actor worker


def start_actor(config: Config, tokenizer_dir: Path) -> ActorWorker:
    worker = ActorWorker(config, total_steps=10, rollout_in_actor=True)
    worker.init_worker(str(tokenizer_dir))
    worker.sync_model_to_rollout(full=True)
    return worker


def train_step(worker: ActorWorker, seed: int = 5) -> dict[str, float]:
    batch = worker.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=4), seed=seed)
    scores = torch.linspace(0.0, 1.0, batch.rows).roll(3)  # unequal within every group
    return worker.run_training(batch, compute_advantages(batch, scores, worker.config).advantages)


def actor_greedy_check(model: nn.Module, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The actor's log-probs of ``batch``'s tokens, and its own argmax token at each position."""
    with torch.no_grad():
        logprobs, _ = policy_forward(model, batch, temperature=1.0, chunk_size=None)
        width = batch.prompt_ids.shape[1]
        logits = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask.long(),
            position_ids=position_ids(batch.attention_mask),
        ).logits
    return logprobs, logits[:, width - 1 : -1].argmax(-1)


@pytest.mark.parametrize("mode", ["bucket", "patch", "shared"])
def test_a_step_trains_the_adapters_and_the_rollout_then_samples_the_actors_model(
    tokenizer_dir: Path, process_group: None, mode: str
) -> None:
    overrides = [f"rollout.weight_sync={mode}", "actor.optim.lr=0.01"]
    worker = start_actor(lora_config(tokenizer_dir, *overrides), tokenizer_dir)
    optimizer = worker._manager().optimizer
    assert optimizer is not None
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    named = dict(worker.model.named_parameters())
    assert held == {id(p) for name, p in named.items() if "lora_" in name}
    before = worker.full_weights()

    train_step(worker)
    stats = worker.sync_model_to_rollout()
    after = worker.full_weights()
    changed = {name for name in after if not torch.equal(after[name], before[name])}
    assert changed
    assert all(".lora_" in name for name in changed)
    assert any(".lora_B." in name for name in changed)  # B left zero: the model moved

    if mode == "shared":
        assert stats["bytes"] == 0.0  # the engine borrows the actor's (adapted) module
    else:
        engine = worker.rollout_weights()
        assert not any("lora_" in name or "base_layer" in name for name in engine)
        merged = dict(MergedLoRAWeights(worker.model, worker.model.state_dict()))
        assert engine.keys() == merged.keys()
        for name, tensor in merged.items():
            assert torch.equal(engine[name], tensor), name
    batch = worker.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=4, greedy=True), seed=0)
    logprobs, argmax = actor_greedy_check(worker.model, batch)
    mask = batch.response_mask
    assert torch.equal(batch.response_ids[mask], argmax[mask])
    torch.testing.assert_close(batch.logprobs[mask], logprobs[mask], rtol=0, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"], ids=["unsharded", "fsdp_sharded"])
def test_a_checkpoint_holds_the_adapters_only_and_resumes_exactly(
    tokenizer_dir: Path, process_group: None, tmp_path: Path, precision: str
) -> None:
    # fsdp_config.mixed_precision bf16 over the fp32 model: one rank, but FSDP shards (DTensors).
    config = lora_config(tokenizer_dir, f"actor.fsdp_config.mixed_precision={precision}")
    worker = start_actor(config, tokenizer_dir)
    train_step(worker)
    worker.sync_model_to_rollout()
    worker.save_checkpoint(str(tmp_path / "ckpt"), step=1)
    saved = FileSystemReader(str(tmp_path / "ckpt" / "actor")).read_metadata()
    model_keys = {key for key in saved.state_dict_metadata if key.startswith("model.")}
    adapters = {f"model.{name}" for name, p in worker.model.named_parameters() if "lora_" in name}
    assert model_keys == adapters

    fresh = start_actor(config, tokenizer_dir)
    assert fresh.load_checkpoint(str(tmp_path / "ckpt")) == 1
    weights, restored = worker.full_weights(), fresh.full_weights()
    assert all(torch.equal(restored[name], tensor) for name, tensor in weights.items())
    # The optimizer, schedule and RNG came back too: the next step is the same step.
    fresh.sync_model_to_rollout(full=True)
    resumed, continued = train_step(fresh, seed=6), train_step(worker, seed=6)
    assert {k: v for k, v in resumed.items() if not k.startswith("time/")} == {
        k: v for k, v in continued.items() if not k.startswith("time/")
    }
    weights, restored = worker.full_weights(), fresh.full_weights()
    assert all(torch.equal(restored[name], tensor) for name, tensor in weights.items())


def test_a_checkpoint_on_another_base_or_without_lora_is_refused(
    tokenizer_dir: Path, process_group: None, tmp_path: Path
) -> None:
    config = lora_config(tokenizer_dir)
    worker = start_actor(config, tokenizer_dir)
    worker.save_checkpoint(str(tmp_path / "ckpt"), step=1)
    other_seed = start_actor(evolve(config, actor=evolve(config.actor, seed=1)), tokenizer_dir)
    with pytest.raises(ValueError, match="other frozen weights than this run's model has"):
        other_seed.load_checkpoint(str(tmp_path / "ckpt"))
    plain_actor = evolve(config.actor, model=evolve(config.actor.model, is_lora=False))
    plain = start_actor(evolve(config, actor=plain_actor), tokenizer_dir)
    with pytest.raises(ValueError, match="this run's model trains every weight"):
        plain.load_checkpoint(str(tmp_path / "ckpt"))
    plain.save_checkpoint(str(tmp_path / "plain"), step=1)
    with pytest.raises(ValueError, match=r"this run's model has frozen ones \(actor.model.is_lora"):
        worker.load_checkpoint(str(tmp_path / "plain"))


def test_the_reference_is_the_plain_base_and_gives_the_initial_actors_logprobs(
    tokenizer_dir: Path, process_group: None
) -> None:
    """algorithm.kl_coef > 0: π_ref is the initial policy, which with B = 0 is the base model."""
    from rlshell.workers.rollout import ReferenceWorker

    config = lora_config(tokenizer_dir)
    reference = ReferenceWorker(config)
    reference.init_worker()
    assert reference.model is not None
    assert not lora_layers(reference.model)
    actor = start_actor(config, tokenizer_dir)
    batch = actor.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4), seed=1)
    mask = batch.response_mask
    with torch.no_grad():
        initial, _ = policy_forward(actor.model, batch, temperature=1.0, chunk_size=None)
    got = reference.compute_ref_logprobs(batch)
    torch.testing.assert_close(got[mask], initial[mask], rtol=0, atol=1e-6)
