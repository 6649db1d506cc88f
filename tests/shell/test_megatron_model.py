"""Megatron-core GPT stages built from HF configs give HF's logits at TP=1, TP=2 and PP=2.

Two processes over gloo (the CPU machines' setup, through the CPU shim): each
case builds its Megatron stage from the HF config, loads its shard of the HF
weights (`megatron_shard`, strict: the shapes are Megatron's own), runs a
left-padded batch, and compares the logits of every valid position with the
HF model's forward (the actor's position ids). TP=1 runs as two data-parallel
replicas; PP=2 runs Megatron's pipeline schedule with two micro-batches.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the megatron extra)")

from tests.shell.test_run import free_port

pytestmark = pytest.mark.slow

# (name, model type, tied embeddings, tp, pp)
CASES = [
    ("qwen2_tp1_dp2", "qwen2", True, 1, 1),
    ("qwen2_tp2", "qwen2", True, 2, 1),
    ("llama_untied_tp2", "llama", False, 2, 1),
    ("qwen2_pp2", "qwen2", True, 1, 2),
    ("llama_untied_pp2", "llama", False, 1, 2),
]
LOGITS_ATOL = 1e-5


def _hf_model(kind: str, tied: bool) -> torch.nn.Module:
    import transformers

    config_class = transformers.Qwen2Config if kind == "qwen2" else transformers.LlamaConfig
    config = config_class(
        vocab_size=31,  # not a multiple of 2: the vocabulary-parallel rows are padded
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms and biases away from their ones and zeros
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    return model


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 31, (4, 9), generator=generator)
    mask = torch.ones(4, 9, dtype=torch.bool)
    mask[1, :3] = False  # left padding, as the rollout gives prompts
    mask[2, :1] = False
    return ids, mask


def _worker(rank: int, port: int, out: str) -> None:
    from rlcore.tokens import position_ids
    from rlshell.engines.training.megatron.layout import GPTLayout, megatron_shard
    from rlshell.engines.training.megatron.model import (
        MegatronCausalLM,
        build_gpt_stage,
        pipeline_logits,
    )
    from rlshell.engines.training.megatron.parallel import init_model_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    ids, mask = _batch()
    results = {}
    for name, kind, tied, tp, pp in CASES:
        hf = _hf_model(kind, tied)
        with torch.no_grad():
            expected = hf(
                input_ids=ids, attention_mask=mask.long(), position_ids=position_ids(mask)
            )
        ranks = init_model_parallel(tp, pp)
        layout = GPTLayout.of(hf.config, tp=tp, pp=pp)
        stage = build_gpt_stage(hf.config, layout)
        missing, unexpected = stage.load_state_dict(
            megatron_shard(hf.state_dict(), layout, ranks.tp_rank, ranks.pp_rank), strict=False
        )
        assert not unexpected, unexpected
        assert all(key.endswith("_extra_state") for key in missing), missing
        stage.eval()
        if pp == 1:
            with torch.no_grad():
                logits: torch.Tensor | None = MegatronCausalLM(stage, layout)(
                    input_ids=ids, attention_mask=mask
                ).logits
        else:
            micro = [(ids[:2], mask[:2]), (ids[2:], mask[2:])]
            outputs = pipeline_logits(stage, layout, micro)
            logits = None if outputs is None else torch.cat(outputs)
        if logits is not None:
            assert logits.shape == expected.logits.shape
            results[name] = (logits - expected.logits)[mask].abs().max().item()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def test_megatron_stages_give_hf_logits_at_tp1_tp2_and_pp2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    by_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for name, _, _, _tp, pp in CASES:
        # Every rank of a tensor-parallel or data-parallel case has the logits; only the
        # last stage of a pipeline.
        holders = [r for r in range(2) if name in by_rank[r]]
        assert holders == ([1] if pp == 2 else [0, 1]), name
        for rank in holders:
            assert by_rank[rank][name] < LOGITS_ATOL, (name, rank, by_rank[rank][name])


# ------------------------------------------------------------------- the real pretrained model

# SmolLM2-135M-Instruct's 9 query heads share 3 key/value heads: tensor parallel 3 splits them,
# 2 cannot (each rank holds whole query groups).
REAL_TP = 3
# 30 layers in fp32, the row-parallel sums taken in another order: 8.2e-5 at most, measured
# 2026-12-02 (every position of two left-padded chat prompts, the greedy tokens all equal).
REAL_LOGITS_ATOL = 1e-3


def _real_worker(rank: int, port: int, out: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore.tokens import position_ids
    from rlshell.engines.training.megatron.layout import GPTLayout, megatron_shard
    from rlshell.engines.training.megatron.model import MegatronCausalLM, build_gpt_stage
    from rlshell.engines.training.megatron.parallel import init_model_parallel
    from rlshell.gguf import SMOLLM2
    from rlshell.hub import from_pretrained

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=REAL_TP
    )
    hf = from_pretrained(AutoModelForCausalLM, SMOLLM2.repo_id, dtype=torch.float32).eval()
    tokenizer = from_pretrained(AutoTokenizer, SMOLLM2.repo_id)
    tokenizer.padding_side = "left"
    chats = [
        [{"role": "user", "content": "What is 23 + 15? Answer with the number only."}],
        [{"role": "user", "content": "What is the capital of France?"}],
    ]
    batch = tokenizer.apply_chat_template(
        chats, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    ids, mask = batch["input_ids"], batch["attention_mask"].bool()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask.long(), position_ids=position_ids(mask))
    init_model_parallel(REAL_TP, 1)
    layout = GPTLayout.of(hf.config, tp=REAL_TP, pp=1)
    stage = build_gpt_stage(hf.config, layout)
    missing, unexpected = stage.load_state_dict(
        megatron_shard(hf.state_dict(), layout, rank, 0), strict=False
    )
    assert not unexpected, unexpected
    assert all(key.endswith("_extra_state") for key in missing), missing
    with torch.no_grad():
        logits = MegatronCausalLM(stage.eval(), layout)(input_ids=ids, attention_mask=mask).logits
    result = {
        "padded": int((~mask).sum()),
        "max_abs_diff": (logits - expected.logits)[mask].abs().max().item(),
        "argmax_equal": bool(
            torch.equal(logits.argmax(-1)[mask], expected.logits.argmax(-1)[mask])
        ),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_the_real_model_at_tensor_parallel_3_gives_hf_logits_and_2_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2-135M-Instruct (``make install``), a left-padded batch of chat prompts."""
    from transformers import AutoConfig

    from rlshell.engines.training.megatron.layout import GPTLayout
    from rlshell.gguf import SMOLLM2, verify
    from rlshell.hub import from_pretrained

    verify(SMOLLM2.repo_id, hashes=False)
    with pytest.raises(ValueError, match="tensor parallel size 2 must divide the 3 key/value"):
        GPTLayout.of(from_pretrained(AutoConfig, SMOLLM2.repo_id), tp=2, pp=1)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    mp.spawn(_real_worker, args=(free_port(), str(tmp_path)), nprocs=REAL_TP, join=True)
    for rank in range(REAL_TP):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        print(f"rank {rank}: {result}")  # the figure docs/real_model.md quotes
        assert result["padded"] > 0  # the prompts differ in length: left padding is met
        assert result["max_abs_diff"] < REAL_LOGITS_ATOL, (rank, result)
        assert result["argmax_equal"], (rank, result)
