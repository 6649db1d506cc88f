"""DAPO's dynamic sampling in the reasoning trainer: which groups a step trains on.

`DynamicSampling.informative_batch` (`rlshell.runners.reasoning.scoring`) is
driven here without workers: the trainer's sampling and scoring is replaced by a table of
which prompts every sample answers right, so that each case says exactly which
groups are informative. What runs is the trainer's own selection: rounds,
the cap, the top-up with dropped groups, the batch it hands the update and
its metrics. (tests/shell/test_config_reads.py runs configs/dapo.py end to end
with real workers.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlshell.config import Config
from rlshell.data import PromptExample, PromptSampler
from rlshell.rewards.pool import RewardResult
from rlshell.rewards.weighted import WeightedScores
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.runners.reasoning.scoring import DynamicSampling, SampleAndScore, shaped_scores
from rlshell.runners.validation import load_config

N = 2  # samples per prompt
PROMPTS = 4  # prompts a step wants


class _Case:
    """A run's config and prompt sampler; ``sample_and_score`` is `_scripted`'s."""

    def __init__(self, config: Config, sampler: Any) -> None:
        self.config = config
        self.sampler = sampler
        self.sample_and_score: SampleAndScore | None = None


def _trainer(examples: list[PromptExample], rounds: int) -> _Case:
    config = load_config(
        Path("configs/dapo.py"),
        [
            f"algorithm.group_size={N}",
            f"runner.prompts_per_step={PROMPTS}",
            f"algorithm.max_sampling_rounds={rounds}",
        ],
    )
    return _Case(config, PromptSampler(examples, PROMPTS, seed=0))


def _scripted(trainer: _Case, right: Mapping[str, tuple[bool, ...]]) -> list[list[str]]:
    """Replace sampling and scoring: prompt p's samples are right as ``right[p]`` says; each
    response's text is its prompt, so a batch says which prompts it holds. Returns the
    prompts of each round, as drawn."""
    drawn: list[list[str]] = []

    def sample_and_score(
        prompts: Sequence[PromptExample],
        params: SamplingParams,
        step: int,
        round_: int,
        metrics: dict[str, float],
    ) -> tuple[RolloutBatch, WeightedScores]:
        assert round_ == len(drawn)
        drawn.append([p.prompt for p in prompts])
        rows = len(prompts) * params.n
        # Responses of different lengths per round (the batch re-pads them), short of
        # configs/dapo.py's overlong penalty, which starts past 4 tokens.
        width = 2 + round_ % 2
        batch = RolloutBatch(
            prompt_ids=torch.ones(rows, 3, dtype=torch.long),
            prompt_mask=torch.ones(rows, 3, dtype=torch.bool),
            response_ids=torch.ones(rows, width, dtype=torch.long),
            response_mask=torch.ones(rows, width, dtype=torch.bool),
            logprobs=torch.zeros(rows, width),
            response_texts=tuple(p.prompt for p in prompts for _ in range(params.n)),
            group_size=params.n,
        )
        scores = tuple(float(ok) for p in prompts for ok in right[p.prompt])
        result = RewardResult(scores=scores, timeouts=0, errors=0, seconds=0.0)
        weighted = WeightedScores(
            scores=scores,
            parts={"math": result},
            weights={"math": 1.0},
            correctness="math",
            per_reward=False,
        )
        return batch, weighted

    trainer.sample_and_score = sample_and_score
    return drawn


def _step(trainer: _Case) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
    params = SamplingParams(n=N, max_new_tokens=4)
    metrics: dict[str, float] = {}
    assert trainer.sample_and_score is not None
    dynamic = DynamicSampling(trainer.config, trainer.sample_and_score, trainer.sampler.next, 0)
    first = trainer.sampler.next()
    batch, scored = trainer.sample_and_score(first, params, 1, 0, metrics)
    scores = shaped_scores(trainer.config, batch, scored)
    out, out_scores = dynamic.informative_batch(
        batch, scores, scored, len(first), params, 1, metrics
    )
    return out, out_scores, metrics


@settings(max_examples=40, deadline=None)
@given(
    patterns=st.lists(
        st.sampled_from([(True, True), (False, False), (True, False), (False, True)]),
        min_size=16,
        max_size=16,
    ),
    rounds=st.integers(1, 4),
)
def test_a_step_keeps_informative_groups_first_and_tops_up_only_after_the_last_round(
    patterns: list[tuple[bool, ...]], rounds: int
) -> None:
    examples = [PromptExample(prompt=f"p{i}", answer="0") for i in range(len(patterns))]
    right = {e.prompt: pattern for e, pattern in zip(examples, patterns, strict=True)}
    trainer = _trainer(examples, rounds)
    drawn = _scripted(trainer, right)
    batch, scores, metrics = _step(trainer)

    def informative(prompt: str) -> bool:
        return len(set(right[prompt])) > 1

    seen = [p for round_prompts in drawn for p in round_prompts]
    kept = [p for p in seen if informative(p)]
    # More rounds only while the informative groups fall short, never beyond the cap.
    assert len(drawn) <= rounds
    assert len(drawn) == rounds or len(kept) >= PROMPTS
    if len(drawn) > 1:
        before_last = [p for r in drawn[:-1] for p in r if informative(p)]
        assert len(before_last) < PROMPTS
    # The batch: the first informative groups in the order drawn, then dropped ones to fill.
    dropped = [p for p in seen if not informative(p)]
    expected = kept[:PROMPTS] + dropped[: max(0, PROMPTS - len(kept))]
    assert list(batch.response_texts[::N]) == expected
    assert batch.rows == PROMPTS * N
    assert batch.group_size == N
    for group, prompt in enumerate(expected):
        assert batch.response_texts[group * N : (group + 1) * N] == (prompt,) * N
        assert scores[group * N : (group + 1) * N].tolist() == [float(ok) for ok in right[prompt]]
    assert metrics["rollout/sampling_rounds"] == len(drawn)
    assert metrics["rollout/prompts_drawn"] == len(seen)
    assert metrics["rollout/filled_groups"] == max(0, PROMPTS - len(kept))
    assert metrics["rollout/informative_groups_frac"] == pytest.approx(len(kept) / len(seen))


class _InOrder:
    """Prompts in the order given, ``PROMPTS`` at a time (the hand case's rounds)."""

    def __init__(self, examples: list[PromptExample]) -> None:
        self.examples, self.position = examples, 0

    def next(self) -> list[PromptExample]:
        out = self.examples[self.position : self.position + PROMPTS]
        self.position += PROMPTS
        return out


def test_uniform_groups_are_replaced_by_a_second_rounds_informative_ones() -> None:
    """The hand case: round 0 has one informative group of four, round 1 three more."""
    patterns = [(True, True), (True, False), (False, False), (True, True)]
    patterns += [(False, True), (True, False), (False, False), (True, False)]
    patterns += [(True, False)] * 4  # a third round would find more
    examples = [PromptExample(prompt=f"p{i}", answer="0") for i in range(len(patterns))]
    trainer = _trainer(examples, rounds=3)
    trainer.sampler = _InOrder(examples)
    right = {e.prompt: pattern for e, pattern in zip(examples, patterns, strict=True)}
    drawn = _scripted(trainer, right)
    batch, scores, metrics = _step(trainer)
    assert drawn == [["p0", "p1", "p2", "p3"], ["p4", "p5", "p6", "p7"]]  # no third round
    assert list(batch.response_texts[::N]) == ["p1", "p4", "p5", "p7"]
    assert scores.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert metrics["rollout/filled_groups"] == 0
    assert metrics["rollout/informative_groups_frac"] == 0.5
    # Round 1's responses are wider than round 0's: the batch is padded to the widest.
    assert batch.response_ids.shape[1] == 3
    assert batch.response_mask[:N].sum(1).tolist() == [2, 2]
    assert batch.response_mask[N:].sum(1).tolist() == [3] * (3 * N)
