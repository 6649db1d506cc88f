"""The policy's forward pass for the log-probs (and entropies) of a batch's response
tokens: rows padded or packed, the prompt's key/value cache shared across a group's
samples; and the π_old and importance weights an update takes."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rlcore.logprobs import token_stats
from rlcore.mismatch import logprob_mismatch, rollout_importance_weights
from rlcore.registry import POLICY_LOSSES
from rlcore.tokens import position_ids
from rlshell.config import AlgorithmConfig
from rlshell.rollout import RolloutBatch
from rlshell.workers.packing import packed_policy_forward

__all__ = [
    "old_logprobs_and_weights",
    "policy_forward",
    "prompt_prefix_forward",
]


def old_logprobs_and_weights(
    recomputed: Tensor, sampled: Tensor, mask: Tensor, algorithm: AlgorithmConfig
) -> tuple[Tensor, Tensor | None, Tensor | None, dict[str, float]]:
    """The log-probs the policy ratio is taken against, the proximal log-probs (decoupled
    PPO), the importance weights (``algorithm.rollout_is``) and the ``rollout/mismatch_*``
    metrics of one micro-batch.

    ``recomputed``: the actor's log-probs of the batch under the weights before the update
    (`ActorWorker.compute_logprobs`, or, with one optimizer step per batch, that step's own
    forward, detached: it runs on the same weights, at no extra pass). ``sampled``: what the
    rollout engine reported (log μ). The gap between them is measured either way
    (`rlcore.mismatch`). ``decoupled_ppo`` takes its ratio against ``recomputed`` as the
    proximal policy and weights by π_prox/μ against ``sampled``, the behaviour policy; the
    other losses take their ratio against ``algorithm.old_logprobs``.
    """
    metrics = {
        f"rollout/mismatch_{key}": float(value)
        for key, value in logprob_mismatch(recomputed, sampled, mask).items()
    }
    weights = None
    if algorithm.rollout_is is not None:
        weights, stats = rollout_importance_weights(
            recomputed, sampled, mask, algorithm.rollout_is, algorithm.rollout_is_threshold
        )
        metrics.update({f"rollout/mismatch_is_{key}": float(v) for key, v in stats.items()})
    if "proximal_logprobs" in POLICY_LOSSES.needs(algorithm.loss_type):
        return sampled, recomputed, weights, metrics
    old = recomputed if algorithm.old_logprobs == "recompute" else sampled
    return old, None, weights, metrics


def policy_forward(
    model: nn.Module,
    batch: RolloutBatch,
    temperature: float,
    chunk_size: int | None,
    share_prompts: bool = False,
    pack: bool = False,
) -> tuple[Tensor, Tensor]:
    """(log-probs, entropies) of the batch's response tokens under ``model``.

    Positions count valid tokens only, as ``generate`` saw them with left padding.
    With ``share_prompts`` rows that repeat a prompt (a GRPO group's samples)
    run it once: the distinct prompts go through the model first, their
    key/value cache is gathered to the rows (`prompt_prefix_forward`), and
    only the responses run on every row. Same log-probs and gradients
    (tested to float32 round-off); fewer FLOPs by (1 − distinct/rows) of the
    prompt tokens. With ``pack`` the rows' valid tokens run end to end in one
    row, without padding (`rlshell.workers.packing.packed_policy_forward`;
    same log-probs and gradients, 0 at padded positions); it runs every
    row's prompt, so it does not combine with ``share_prompts``.
    """
    if pack:
        if share_prompts:
            raise ValueError(
                "policy_forward: pack and share_prompts are two layouts of the forward; ask for one"
            )
        return packed_policy_forward(model, batch, temperature, chunk_size)
    device = next(model.parameters()).device
    width = batch.prompt_ids.shape[1]
    response_logits = prompt_prefix_forward(model, batch, device) if share_prompts else None
    if response_logits is None:
        attention_mask = batch.attention_mask
        logits = model(
            input_ids=batch.input_ids.to(device),
            attention_mask=attention_mask.to(device).long(),
            position_ids=position_ids(attention_mask).to(device),
            use_cache=False,
        ).logits
        response_logits = logits[:, width - 1 : -1, :]
    stats = token_stats(
        response_logits.float(),
        batch.response_ids.to(device),
        temperature,
        chunk_size,
    )
    return stats.logprobs, stats.entropy


def prompt_prefix_forward(
    model: nn.Module, batch: RolloutBatch, device: torch.device
) -> Tensor | None:
    """The logits that predict each row's response tokens, running each distinct prompt once.

    None when no prompt repeats (or a response has one token: nothing to run
    on top of the prompts). Pass 1 runs the distinct left-padded prompts with
    a key/value cache; the cache (and the last prompt position's logits) are
    gathered to the rows with ``index_select``, which back-propagates by
    summing over a prompt's rows; pass 2 runs the responses, all but their
    last token, on top of it.
    """
    width = batch.prompt_ids.shape[1]
    if batch.response_ids.shape[1] <= 1:
        return None
    keys = torch.cat([batch.prompt_ids, batch.prompt_mask.long()], dim=1)
    distinct, inverse = torch.unique(keys, dim=0, return_inverse=True)
    if distinct.shape[0] == batch.rows:
        return None
    prompts, prompt_masks = distinct[:, :width], distinct[:, width:].bool()
    prefix = model(
        input_ids=prompts.to(device),
        attention_mask=prompt_masks.to(device).long(),
        position_ids=position_ids(prompt_masks).to(device),
        use_cache=True,
    )
    rows = inverse.to(device)
    cache = prefix.past_key_values
    cache.reorder_cache(rows)
    first = prefix.logits[:, -1:, :].index_select(0, rows)
    attention_mask = batch.attention_mask
    positions = position_ids(attention_mask)[:, width:-1]
    rest = model(
        input_ids=batch.response_ids[:, :-1].to(device),
        attention_mask=attention_mask[:, :-1].to(device).long(),
        position_ids=positions.to(device),
        past_key_values=cache,
        use_cache=True,
    ).logits
    return torch.cat([first, rest], dim=1)
