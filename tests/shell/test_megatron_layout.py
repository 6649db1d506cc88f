"""Hugging Face ↔ Megatron shards (`rlshell.engines.training.megatron.layout`): exact round trips.

Pure tensor functions, no processes: every (tensor rank, pipeline stage) shard
of a real transformers Qwen2 / Llama state dict is computed, and the state
dict rebuilt from them equals the original bit for bit. That the shards have
the shapes Megatron's GPTModel builds, and give HF's logits, is checked in
processes by tests/shell/test_megatron_model.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rlshell.engines.training.megatron.layout import GPTLayout, hf_from_shards, megatron_shard


def tiny_hf(kind: str, heads: int, kv_heads: int, layers: int, tied: bool, vocab: int) -> object:
    import transformers

    config_class = transformers.Qwen2Config if kind == "qwen2" else transformers.LlamaConfig
    config = config_class(
        vocab_size=vocab,
        hidden_size=8 * heads,
        intermediate_size=24,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


@st.composite
def models_and_splits(draw: st.DrawFn) -> tuple[object, int, int]:
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2]))
    kv_heads = tp * draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 2))
    layers = pp * draw(st.integers(1, 2))
    model = tiny_hf(
        draw(st.sampled_from(["qwen2", "llama"])),
        heads,
        kv_heads,
        layers,
        tied=draw(st.booleans()),
        vocab=draw(st.integers(5, 13)),  # often not a multiple of tp: padded rows
    )
    return model, tp, pp


@given(models_and_splits())
def test_hf_to_shards_and_back_is_exact(case: tuple[object, int, int]) -> None:
    model, tp, pp = case
    hf = model.state_dict()  # type: ignore[attr-defined]
    layout = GPTLayout.of(model.config, tp=tp, pp=pp)  # type: ignore[attr-defined]
    shards = {(t, p): megatron_shard(hf, layout, t, p) for t in range(tp) for p in range(pp)}
    back = hf_from_shards(shards, layout)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@given(models_and_splits())
def test_every_rank_holds_an_equal_share_of_each_split_tensor(
    case: tuple[object, int, int],
) -> None:
    model, tp, pp = case
    layout = GPTLayout.of(model.config, tp=tp, pp=pp)  # type: ignore[attr-defined]
    hf = model.state_dict()  # type: ignore[attr-defined]
    for p in range(pp):
        ranks = [megatron_shard(hf, layout, t, p) for t in range(tp)]
        assert all(r.keys() == ranks[0].keys() for r in ranks)
        for name in ranks[0]:
            assert len({r[name].shape for r in ranks}) == 1, name
        local_layers = {n.split(".")[2] for n in ranks[0] if n.startswith("decoder.layers.")}
        assert local_layers == {str(i) for i in range(layout.layers_per_stage)}
        assert ("embedding.word_embeddings.weight" in ranks[0]) == (p == 0)
        assert ("decoder.final_layernorm.weight" in ranks[0]) == (p == pp - 1)
    rows = megatron_shard(hf, layout, 0, 0)["embedding.word_embeddings.weight"].shape[0]
    assert rows * tp == layout.padded_vocab_size >= layout.vocab_size


def test_the_fused_qkv_rows_are_grouped_by_key_value_head() -> None:
    # 4 query heads in 2 groups, head size 8: rows [q0 q1 k0 v0 | q2 q3 k1 v1].
    model = tiny_hf("qwen2", heads=4, kv_heads=2, layers=1, tied=True, vocab=7)
    hf = model.state_dict()  # type: ignore[attr-defined]
    qkv = megatron_shard(hf, GPTLayout.of(model.config), 0, 0)[  # type: ignore[attr-defined]
        "decoder.layers.0.self_attention.linear_qkv.weight"
    ]
    q, k, v = (hf[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv")
    assert torch.equal(qkv[:16], q[:16])
    assert torch.equal(qkv[16:24], k[:8])
    assert torch.equal(qkv[24:32], v[:8])
    assert torch.equal(qkv[32:48], q[16:])
    # Tensor rank 1 of 2 holds the second group only.
    layout = GPTLayout.of(model.config, tp=2)  # type: ignore[attr-defined]
    second = megatron_shard(hf, layout, 1, 0)["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert torch.equal(second, qkv[32:])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tp": 4}, "tensor parallel size 4 must divide the 2 key/value heads"),
        ({"pp": 3}, "pipeline parallel size 3 must divide the 2 layers"),
        ({"num_heads": 5}, "5 attention heads do not split into 2 groups"),
        ({"ffn_hidden_size": 25, "tp": 2}, "must divide the MLP width 25"),
    ],
)
def test_splits_that_do_not_divide_the_model_are_refused(
    change: dict[str, int], message: str
) -> None:
    base = {
        "num_layers": 2,
        "hidden_size": 32,
        "num_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 8,
        "ffn_hidden_size": 24,
        "vocab_size": 7,
        "tied_embeddings": True,
        "qkv_bias": True,
    }
    with pytest.raises(ValueError, match=message):
        GPTLayout(**{**base, **change})  # type: ignore[arg-type]


def test_models_the_mapping_does_not_cover_are_refused() -> None:
    import transformers

    with pytest.raises(ValueError, match="maps Qwen2 and Llama models; this one is 'gpt2'"):
        GPTLayout.of(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2))
    with pytest.raises(ValueError, match="mlp_bias=True"):
        GPTLayout.of(transformers.LlamaConfig(num_hidden_layers=1, mlp_bias=True))


def test_shards_of_an_incomplete_set_of_ranks_are_refused() -> None:
    model = tiny_hf("llama", heads=2, kv_heads=2, layers=2, tied=False, vocab=9)
    layout = GPTLayout.of(model.config, tp=2, pp=2)  # type: ignore[attr-defined]
    hf = model.state_dict()  # type: ignore[attr-defined]
    shards = {(t, 0): megatron_shard(hf, layout, t, 0) for t in range(2)}
    with pytest.raises(ValueError, match=r"all 2×2 \(tp, pp\) ranks, got \[\(0, 0\), \(1, 0\)\]"):
        hf_from_shards(shards, layout)
