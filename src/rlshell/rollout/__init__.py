"""Rollout: generating responses to prompts, and the batch record they travel in.

An engine (`rlshell.engines.rollout.hf.HFRolloutEngine` here; vLLM and SGLang
engines behind the same methods on GPU) turns prompts into a `RolloutBatch`:
left-padded prompt tokens, right-padded response tokens, the response mask
(every token through the first EOS), the behaviour log-probs of the sampled
tokens and the decoded texts. Rows ``g·n … g·n + n − 1`` answer prompt ``g``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from attrs import frozen
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["RolloutBatch", "SamplingParams"]


@frozen
class SamplingParams:
    """How to sample: ``greedy`` ignores temperature, top-p and top-k; ``min_new_tokens``
    forbids the end token before that many (benchmarks use it to sample fixed lengths)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    greedy: bool = False
    min_new_tokens: int = 0


@frozen(eq=False)
class RolloutBatch:
    """Sampled responses, token-aligned: prompts left-padded, responses right-padded."""

    prompt_ids: Int[Tensor, "batch prompt"]
    prompt_mask: Bool[Tensor, "batch prompt"]
    response_ids: Int[Tensor, "batch response"]
    response_mask: Bool[Tensor, "batch response"]
    logprobs: Float[Tensor, "batch response"]
    response_texts: tuple[str, ...]
    group_size: int = 1

    def __attrs_post_init__(self) -> None:
        rows = self.prompt_ids.shape[0]
        shapes = {
            "prompt_mask": (self.prompt_mask.shape, self.prompt_ids.shape),
            "response_mask": (self.response_mask.shape, self.response_ids.shape),
            "logprobs": (self.logprobs.shape, self.response_ids.shape),
        }
        for name, (got, want) in shapes.items():
            if got != want:
                raise ValueError(
                    f"RolloutBatch.{name} has shape {tuple(got)}, expected {tuple(want)}"
                )
        if self.response_ids.shape[0] != rows or len(self.response_texts) != rows:
            raise ValueError(
                f"RolloutBatch: {rows} prompt rows, {self.response_ids.shape[0]} response rows, "
                f"{len(self.response_texts)} texts"
            )

    @property
    def rows(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def input_ids(self) -> Int[Tensor, "batch seq"]:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> Bool[Tensor, "batch seq"]:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def response_lengths(self) -> Int[Tensor, "batch"]:
        return self.response_mask.sum(dim=1)

    @property
    def num_tokens(self) -> int:
        """Valid prompt and response tokens: what verl's tokens/s counts."""
        return int(self.prompt_mask.sum()) + int(self.response_mask.sum())

    def select(self, rows: Sequence[int], group_size: int = 1) -> RolloutBatch:
        """These rows, trimmed to the widest prompt and response among them.

        ``group_size``: of the result; 1 (rows taken apart, e.g. a
        micro-batch) unless the rows are whole groups, each one's rows together.
        """
        if group_size < 1 or len(rows) % group_size:
            raise ValueError(
                f"RolloutBatch.select: {len(rows)} rows do not make groups of {group_size}"
            )
        index = torch.as_tensor(list(rows), dtype=torch.long)
        prompt_mask = self.prompt_mask[index]
        response_mask = self.response_mask[index]
        start = _first_used_column(prompt_mask)
        stop = _last_used_column(response_mask)
        return RolloutBatch(
            prompt_ids=self.prompt_ids[index, start:],
            prompt_mask=prompt_mask[:, start:],
            response_ids=self.response_ids[index, :stop],
            response_mask=response_mask[:, :stop],
            logprobs=self.logprobs[index, :stop],
            response_texts=tuple(self.response_texts[i] for i in index.tolist()),
            group_size=group_size,
        )

    @staticmethod
    def concat(batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
        """Rows of every batch in order; prompts re-padded on the left, responses on the right."""
        if not batches:
            raise ValueError("RolloutBatch.concat needs at least one batch")
        sizes = {batch.group_size for batch in batches}
        if len(sizes) != 1:
            raise ValueError(f"RolloutBatch.concat: batches have different group sizes {sizes}")
        prompt = max(batch.prompt_ids.shape[1] for batch in batches)
        response = max(batch.response_ids.shape[1] for batch in batches)

        def left(t: Tensor, width: int, value: float | bool) -> Tensor:
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        def right(t: Tensor, width: int, value: float | bool) -> Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        return RolloutBatch(
            prompt_ids=torch.cat([left(b.prompt_ids, prompt, pad_id) for b in batches]),
            prompt_mask=torch.cat([left(b.prompt_mask, prompt, False) for b in batches]),
            response_ids=torch.cat([right(b.response_ids, response, pad_id) for b in batches]),
            response_mask=torch.cat([right(b.response_mask, response, False) for b in batches]),
            logprobs=torch.cat([right(b.logprobs, response, 0.0) for b in batches]),
            response_texts=tuple(text for b in batches for text in b.response_texts),
            group_size=sizes.pop(),
        )


def _first_used_column(mask: Tensor) -> int:
    used = mask.any(dim=0).nonzero()
    return int(used[0]) if used.numel() else mask.shape[1]


def _last_used_column(mask: Tensor) -> int:
    used = mask.any(dim=0).nonzero()
    return int(used[-1]) + 1 if used.numel() else 0
