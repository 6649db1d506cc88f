"""Rewards of a reasoning step: scoring, loud failures, DAPO's shaping and dynamic sampling.

`Scoring` scores responses with ``reward.reward_type``'s reward or the
weighted total of ``reward.weights``' (`rlshell.rewards.weighted`), prints
the first failure of each kind of each reward once a run and stops a step on
which every call of a reward failed too many steps in a row
(`rlshell.rewards.failures.FailureWatches`). `shaped_scores` adds DAPO's
overlong penalty; `DynamicSampling` keeps the groups whose answers differ.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlcore.shaping import filter_informative_groups, overlong_penalty
from rlshell.config import Config, RewardConfig
from rlshell.data import PromptExample
from rlshell.rewards.failures import FailureWatches
from rlshell.rewards.pool import RewardResult
from rlshell.rewards.weighted import WeightedReward, WeightedScores
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.runners.loop import timed

__all__ = ["DynamicSampling", "SampleAndScore", "Scoring", "shaped_scores"]


def print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Scoring:
    """The run's rewards and their failure watches; ``print_line`` hears the notices."""

    def __init__(self, config: RewardConfig) -> None:
        self.rewards = WeightedReward.of(config)
        self.watch = FailureWatches(self.rewards.functions(), config.max_failed_steps)
        self.print_line: Callable[[str], None] = print_to_stderr

    def score(
        self,
        reward: Any,
        prompts: Sequence[PromptExample],
        batch: RolloutBatch,
        n: int,
        step: int,
        round_: int,
        metrics: dict[str, float],
    ) -> WeightedScores:
        """The rewards of ``batch``'s responses to ``prompts`` (``n`` each), scored by the
        reward worker ``reward``; ``round_`` 0 is a step's first sampling round."""
        suffix = "" if round_ == 0 else "_resample"
        answers = [p.answer for p in prompts for _ in range(n)]
        with timed(metrics, f"time/reward{suffix}"):
            parts = reward.score(list(batch.response_texts), answers).wait()[0]
            scored = self.rewards.combine(parts, batch.response_lengths, n)
        self.report(parts, f"step {step}")
        if round_ == 0:
            self.watch.check(step, parts)  # before the update: no step on 0s only
        return scored

    def correctness(
        self, reward: Any, texts: list[str], answers: list[str], when: str
    ) -> RewardResult:
        """The correctness reward's result alone (the evaluation's score)."""
        correctness = self.rewards.correctness
        results = reward.score(texts, answers, [correctness]).wait()[0]
        self.report(results, when)
        result: RewardResult = results[correctness]
        return result

    def report(self, results: Mapping[str, RewardResult], when: str) -> None:
        for line in self.watch.notices(results, when):
            self.print_line(line)


def shaped_scores(config: Config, batch: RolloutBatch, scored: WeightedScores) -> torch.Tensor:
    """The scores the advantages read: the rewards' total plus DAPO's overlong penalty
    (``algorithm.overlong_buffer``)."""
    scores = torch.tensor(scored.scores, dtype=torch.float32)
    algorithm = config.algorithm
    if algorithm.overlong_buffer is not None:
        scores = scores + overlong_penalty(
            batch.response_lengths,
            config.rollout.max_new_tokens,
            algorithm.overlong_buffer,
            algorithm.overlong_penalty_factor,
        ).to(scores)
    return scores


SampleAndScore = Callable[
    [Sequence[PromptExample], SamplingParams, int, int, dict[str, float]],
    tuple[RolloutBatch, WeightedScores],
]
"""``(prompts, params, step, round_, metrics) -> (batch, scores)``: one sampling round."""


class DynamicSampling:
    """DAPO's dynamic sampling: ``sample_and_score`` draws further rounds on
    ``next_prompts``' prompts until enough groups are informative."""

    def __init__(
        self,
        config: Config,
        sample_and_score: SampleAndScore,
        next_prompts: Callable[[], Sequence[PromptExample]],
        pad_id: int,
    ) -> None:
        self.config = config
        self.sample_and_score = sample_and_score
        self.next_prompts = next_prompts
        self.pad_id = pad_id

    def informative_batch(
        self,
        batch: RolloutBatch,
        scores: torch.Tensor,
        scored: WeightedScores,
        wanted: int,
        params: SamplingParams,
        step: int,
        metrics: dict[str, float],
    ) -> tuple[RolloutBatch, torch.Tensor]:
        """``wanted`` groups whose correctness scores differ, sampling further prompts for
        at most ``algorithm.max_sampling_rounds`` rounds; groups that do not differ fill up
        what the last round leaves short."""
        n = params.n
        kept: list[tuple[RolloutBatch, torch.Tensor]] = []
        dropped: list[tuple[RolloutBatch, torch.Tensor]] = []

        def split(part: RolloutBatch, part_scores: torch.Tensor, result: WeightedScores) -> None:
            correct = torch.tensor(result.correct.scores, dtype=torch.float32).view(-1, n)
            informative = filter_informative_groups(correct).tolist()
            for group, keep in enumerate(informative):
                rows = list(range(group * n, (group + 1) * n))
                (kept if keep else dropped).append(
                    (part.select(rows, group_size=n), part_scores[rows])
                )

        split(batch, scores, scored)
        rounds, drawn = 1, wanted
        while len(kept) < wanted and rounds < self.config.algorithm.max_sampling_rounds:
            more = self.next_prompts()
            more_batch, more_scored = self.sample_and_score(more, params, step, rounds, metrics)
            split(more_batch, shaped_scores(self.config, more_batch, more_scored), more_scored)
            rounds += 1
            drawn += len(more)
        filled = max(0, wanted - len(kept))
        chosen = kept[:wanted] + dropped[:filled]
        metrics["rollout/sampling_rounds"] = float(rounds)
        metrics["rollout/prompts_drawn"] = float(drawn)
        metrics["rollout/informative_groups_frac"] = (len(kept) / drawn) if drawn else 0.0
        metrics["rollout/filled_groups"] = float(filled)
        out = RolloutBatch.concat([part for part, _ in chosen], self.pad_id)
        return out, torch.cat([part_scores for _, part_scores in chosen])
