"""Rollout: generating responses to prompts, and the batch record they travel in.

An engine (`rlshell.engines.rollout.hf.HFRolloutEngine` here; vLLM and SGLang
engines behind the same methods on GPU) turns prompts into a `RolloutBatch`:
left-padded prompt tokens, right-padded response tokens, the response mask
(every token through the first EOS), the behaviour log-probs of the sampled
tokens and the decoded texts. Rows ``g·n … g·n + n − 1`` answer prompt ``g``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from attrs import field, frozen
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = ["RolloutBatch", "SamplingParams", "left_padded"]


@frozen
class SamplingParams:
    """How to sample: ``greedy`` ignores temperature, top-p and top-k; ``min_new_tokens``
    forbids the end token before that many (benchmarks use it to sample fixed lengths);
    ``stop_token_ids`` end a response as EOS does, and are kept in it."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16
    greedy: bool = False
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def end_ids(self, eos_id: int) -> tuple[int, ...]:
        """The tokens that end a response: EOS, then ``stop_token_ids`` (a multi-turn rollout
        stops a turn at a tool call's closing token); each stays in the response."""
        return (eos_id, *(t for t in self.stop_token_ids if t != eos_id))


@frozen(eq=False)
class RolloutBatch:
    """Sampled responses, token-aligned: prompts left-padded, responses right-padded.

    A multi-turn rollout (`rlshell.engines.rollout.multi_turn`) puts every
    turn in the response, tool outputs included: ``loss_mask`` marks the
    tokens the model wrote (`trained_mask`), ``token_rewards`` holds rewards
    the rollout itself gave to tokens (per-turn rewards, added to the outcome
    score placed on the last trained token), ``row_stats`` per-row counts for
    metrics (turns, tool calls by outcome). A single-turn rollout has none.
    ``response_texts`` are what the reward reads: a multi-turn row's final turn.
    """

    prompt_ids: Int[Tensor, "batch prompt"]
    prompt_mask: Bool[Tensor, "batch prompt"]
    response_ids: Int[Tensor, "batch response"]
    response_mask: Bool[Tensor, "batch response"]
    logprobs: Float[Tensor, "batch response"]
    response_texts: tuple[str, ...]
    group_size: int = 1
    loss_mask: Bool[Tensor, "batch response"] | None = None
    token_rewards: Float[Tensor, "batch response"] | None = None
    row_stats: Mapping[str, Float[Tensor, " batch"]] = field(factory=dict)

    def __attrs_post_init__(self) -> None:
        rows = self.prompt_ids.shape[0]
        shapes = {
            "prompt_mask": (self.prompt_mask.shape, self.prompt_ids.shape),
            "response_mask": (self.response_mask.shape, self.response_ids.shape),
            "logprobs": (self.logprobs.shape, self.response_ids.shape),
        }
        if self.token_rewards is not None:
            shapes["token_rewards"] = (self.token_rewards.shape, self.response_ids.shape)
        for name, stat in self.row_stats.items():
            shapes[f"row_stats[{name!r}]"] = (stat.shape, self.response_ids.shape[:1])
        if self.loss_mask is not None:
            shapes["loss_mask"] = (self.loss_mask.shape, self.response_ids.shape)
            if bool((self.loss_mask & ~self.response_mask).any()):
                raise ValueError(
                    "RolloutBatch.loss_mask trains tokens outside the response_mask: "
                    "a trained token must be a valid response token"
                )
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
    def trained_mask(self) -> Bool[Tensor, "batch response"]:
        """The response tokens the losses train on: the model's own tokens.

        The whole response (``response_mask``) unless ``loss_mask`` says
        otherwise: in a multi-turn rollout the response holds tool outputs
        too, which the model reads (they are in ``response_mask``, so in the
        attention) but did not write.
        """
        return self.response_mask if self.loss_mask is None else self.loss_mask

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
            loss_mask=None if self.loss_mask is None else self.loss_mask[index, :stop],
            token_rewards=None if self.token_rewards is None else self.token_rewards[index, :stop],
            row_stats={name: stat[index] for name, stat in self.row_stats.items()},
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
            loss_mask=(
                None
                if all(b.loss_mask is None for b in batches)
                else torch.cat([right(b.trained_mask, response, False) for b in batches])
            ),
            token_rewards=(
                None
                if all(b.token_rewards is None for b in batches)
                else torch.cat(
                    [
                        right(
                            torch.zeros(b.response_ids.shape)
                            if b.token_rewards is None
                            else b.token_rewards,
                            response,
                            0.0,
                        )
                        for b in batches
                    ]
                )
            ),
            row_stats=_concat_row_stats(batches),
        )


def _concat_row_stats(batches: Sequence[RolloutBatch]) -> dict[str, Tensor]:
    names = {name for batch in batches for name in batch.row_stats}
    missing = [name for name in names if any(name not in b.row_stats for b in batches)]
    if missing:
        raise ValueError(f"RolloutBatch.concat: row_stats {sorted(missing)} missing from a batch")
    return {name: torch.cat([b.row_stats[name] for b in batches]) for name in sorted(names)}


def _first_used_column(mask: Tensor) -> int:
    used = mask.any(dim=0).nonzero()
    return int(used[0]) if used.numel() else mask.shape[1]


def _last_used_column(mask: Tensor) -> int:
    used = mask.any(dim=0).nonzero()
    return int(used[-1]) + 1 if used.numel() else 0


def left_padded(
    rows: Sequence[Sequence[int]], pad_id: int
) -> tuple[Int[Tensor, "batch width"], Bool[Tensor, "batch width"]]:
    """Token-id rows as one left-padded batch and its mask (as a tokenizer pads prompts)."""
    if not rows:
        raise ValueError("generate() needs at least one prompt")
    if any(len(row) == 0 for row in rows):
        raise ValueError("a prompt of token ids is empty")
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for index, row in enumerate(rows):
        ids[index, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
        mask[index, width - len(row) :] = True
    return ids, mask
