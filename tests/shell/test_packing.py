"""The actor's packed forward (``actor.pack_sequences``): the padded forward's numbers, unpadded."""

from __future__ import annotations

import pytest
import torch
import transformers
from torch import Tensor, nn

from rlshell.rollout import RolloutBatch
from rlshell.workers.forward import policy_forward
from rlshell.workers.packing import packed_policy_forward, packing_problem

VOCAB = 97


def tiny_qwen2(attention: str) -> nn.Module:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=attention,
    )
    model: nn.Module = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


def mixed_batch(prompt_lengths: list[int], response_lengths: list[int]) -> RolloutBatch:
    """Random tokens, prompts left-padded and responses right-padded, as an engine returns."""
    generator = torch.Generator().manual_seed(1)
    rows, width, span = len(prompt_lengths), max(prompt_lengths), max(response_lengths)
    prompt_mask = torch.arange(width) >= width - torch.tensor(prompt_lengths).unsqueeze(-1)
    response_mask = torch.arange(span) < torch.tensor(response_lengths).unsqueeze(-1)
    # Padding holds token 0: a real id, so a leak of padding into the packed row would show.
    prompt_ids = torch.randint(1, VOCAB, (rows, width), generator=generator) * prompt_mask
    response_ids = torch.randint(1, VOCAB, (rows, span), generator=generator) * response_mask
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=torch.zeros(rows, span),
        response_texts=("",) * rows,
    )


# Very different lengths, a 1-token response, a 1-token prompt, and the longest row first.
BATCH = mixed_batch([9, 1, 4, 6, 2], [40, 1, 13, 2, 27])


def forward_and_grads(
    model: nn.Module, batch: RolloutBatch, pack: bool
) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Log-probs, entropies and the gradients of a loss that uses both on every valid token."""
    model.zero_grad()
    logprobs, entropy = policy_forward(model, batch, 0.7, chunk_size=8, pack=pack)
    weights = torch.linspace(-1.0, 1.0, logprobs.numel()).view_as(logprobs)
    mask = batch.response_mask
    loss = (logprobs * weights * mask).sum() + 0.1 * (entropy * mask).sum()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return logprobs.detach(), entropy.detach(), grads


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logprobs_entropies_and_gradients_equal_the_padded_forwards(attention: str) -> None:
    model = tiny_qwen2(attention)
    padded_lp, padded_h, padded_g = forward_and_grads(model, BATCH, pack=False)
    packed_lp, packed_h, packed_g = forward_and_grads(model, BATCH, pack=True)
    mask = BATCH.response_mask
    assert packed_lp.shape == padded_lp.shape == mask.shape
    torch.testing.assert_close(packed_lp[mask], padded_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed_h[mask], padded_h[mask], atol=1e-5, rtol=0)
    # Padded positions come back 0: finite for the losses, which mask them.
    assert not packed_lp[~mask].any()
    assert not packed_h[~mask].any()
    assert len(packed_g) == len(padded_g) == len(list(model.parameters()))
    for packed, padded in zip(packed_g, padded_g, strict=True):
        torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-4)


def test_the_sequences_are_kept_apart_by_the_models_packed_path() -> None:
    # The same packed row with a plain all-ones mask attends across sequences: a forward that
    # did not keep them apart would change the log-probs of every row after the first.
    from rlcore.packing import pack_sequences, packed_response_predictors

    model = tiny_qwen2("sdpa")
    packed = pack_sequences(BATCH.input_ids, BATCH.attention_mask)
    keep = packed_response_predictors(BATCH.prompt_mask, BATCH.response_mask)
    ids, positions = packed.values.unsqueeze(0), packed.position_ids.unsqueeze(0)
    with torch.no_grad():
        apart = model(
            input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=keep
        ).logits
        across = model(
            input_ids=ids,
            position_ids=positions,
            attention_mask=torch.ones_like(ids),
            use_cache=False,
            logits_to_keep=keep,
        ).logits
        logprobs, _ = packed_policy_forward(model, BATCH, 1.0, None)
    first = int(BATCH.response_mask[0].sum())
    torch.testing.assert_close(apart[0, :first], across[0, :first])
    assert (apart[0, first:] - across[0, first:]).abs().max() > 1e-2
    targets = BATCH.response_ids[BATCH.response_mask].unsqueeze(-1)
    expected = torch.log_softmax(apart[0], -1).gather(-1, targets).squeeze(-1)
    torch.testing.assert_close(logprobs[BATCH.response_mask], expected)


def test_a_model_that_would_attend_across_sequences_is_refused() -> None:
    with pytest.raises(ValueError, match=r"actor\.pack_sequences: the model is a Linear"):
        packed_policy_forward(nn.Linear(2, 2), BATCH, 1.0, None)
    model = tiny_qwen2("sdpa")
    model.config.layer_types = ["full_attention", "linear_attention"]
    assert packing_problem(model) == (
        "the model has ['linear_attention'] layers, which would carry state across packed sequences"
    )
    model = tiny_qwen2("sdpa")
    model.config._attn_implementation = "paged|sdpa"
    with pytest.raises(ValueError, match=r"attention implementation .paged\|sdpa. is not one"):
        packed_policy_forward(model, BATCH, 1.0, None)


def test_packing_and_the_shared_prompt_forward_are_not_asked_for_together() -> None:
    with pytest.raises(ValueError, match="pack and share_prompts are two layouts"):
        policy_forward(tiny_qwen2("sdpa"), BATCH, 1.0, None, share_prompts=True, pack=True)
