"""Several rewards with weights: the rewards ``reward.*`` names, their total and its metrics.

    rewards = WeightedReward.of(config.reward)             # reward_type, weights
    parts = pool.score_each(responses, answers, rewards.pooled)  # {name: RewardResult}
    scored = rewards.combine(parts, batch.response_lengths, group_size)
    scored.scores       # sᵢ = Σₖ wₖ sₖᵢ per sample (rlcore.shaping.combine_rewards)
    scored.metrics()    # reward/mean (the total), reward/<name>/mean, reward/<name>/failed_frac

``reward.weights`` maps names to weights: registered rewards, scored per
sample in the reward pool (`rlshell.rewards.pool`), and `LENGTH_PENALTY`,
Kimi k1.5's group length penalty (`rlcore.shaping.length_penalty`), computed
here from the responses' token lengths and the correctness reward's scores.
``reward.reward_type`` is the correctness reward: one of the weights' names
(weight 0 evaluates by it without training on it), the reward whose mean on
the held-out split is ``eval/accuracy``, and the one ``length_penalty``
reads (score > 0: correct, as ``rollout/groups_solved`` counts). Without
weights, ``reward_type`` alone is the training reward, with weight 1, and
the metrics are those of one `RewardResult`.

A call of one reward that fails (raises, times out, dies, returns a
non-finite number) scores that reward's failure value, 0.0, so its term adds
nothing to the sample's total; the other rewards' terms stand.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from attrs import frozen

from rlshell.config import RewardConfig
from rlshell.rewards import REWARDS, get_reward
from rlshell.rewards.failures import function_name
from rlshell.rewards.pool import RewardResult

if TYPE_CHECKING:
    from jaxtyping import Int
    from torch import Tensor

__all__ = ["LENGTH_PENALTY", "WeightedReward", "WeightedScores", "weights_problems"]

LENGTH_PENALTY = "length_penalty"


def weights_problems(cfg: RewardConfig, group_size: int) -> list[str]:
    """What is wrong with ``reward.weights`` (``cfg.weights``), a line per problem.

    Each name must be a registered reward or `LENGTH_PENALTY` (and not both);
    ``reward.reward_type`` must be one of them, so that ``eval/accuracy``
    says which reward it measures; `LENGTH_PENALTY` needs groups of 2 or more
    (``group_size``); not every weight may be 0.
    """
    weights = cfg.weights
    if not weights:
        return []
    problems = []
    for name in weights:
        if name == LENGTH_PENALTY:
            if name in REWARDS:
                problems.append(
                    f"reward.weights: '{name}' names the built-in length penalty "
                    f"(rlcore.shaping.length_penalty), and the reward registered under that "
                    f"name ({function_name(get_reward(name))}) would never be called; "
                    "register it under another name"
                )
            elif group_size < 2:
                problems.append(
                    f"reward.weights: '{name}' compares the lengths of the responses to one "
                    f"prompt, and algorithm.group_size is {group_size}: it would be 0 for "
                    "every sample; sample 2 or more per prompt or leave it out"
                )
        elif name not in REWARDS:
            known = [*REWARDS.names(), LENGTH_PENALTY]
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
            problems.append(
                f"reward.weights: unknown reward type '{name}'{hint}; registered: "
                f"{', '.join(REWARDS.names()) or 'none'}, and the built-in '{LENGTH_PENALTY}'"
            )
    if cfg.reward_type not in weights:
        problems.append(
            f"reward.weights: no weight for reward.reward_type '{cfg.reward_type}', the "
            "correctness reward whose held-out mean is eval/accuracy (and which length_penalty "
            f"reads); add it ('{cfg.reward_type}': 0.0 evaluates by it without training on it) "
            f"or set reward.reward_type to one of {', '.join(map(repr, weights))}"
        )
    if all(weight == 0 for weight in weights.values()):
        problems.append(
            f"reward.weights: every weight is 0 ({dict(weights)}), so every sample's reward "
            "would be 0 and nothing would be learnt"
        )
    return problems


@frozen
class WeightedScores:
    """One batch scored by every reward of a run, and the weighted total.

    ``scores[i]`` = Σₖ wₖ sₖᵢ; ``parts`` each reward's `RewardResult` (the
    length penalty's among them, which never fails), in the order of
    ``weights``; ``correctness`` names ``reward.reward_type``'s part;
    ``per_reward``: whether the metrics name each reward (``reward.weights``
    is set).
    """

    scores: tuple[float, ...]
    parts: Mapping[str, RewardResult]
    weights: Mapping[str, float]
    correctness: str
    per_reward: bool

    @property
    def correct(self) -> RewardResult:
        """The correctness reward's (``reward.reward_type``'s) result."""
        return self.parts[self.correctness]

    def metrics(self) -> dict[str, float]:
        """One reward's `RewardResult.metrics`, or with ``reward.weights``:

        - ``reward/mean``: the mean total, failed calls counting 0 in their term;
        - ``reward/timeouts``, ``reward/errors``: the failed calls of every reward;
        - ``reward/failed_frac``: those over all calls of the pooled rewards
          (samples × rewards, the length penalty not counted);
        - ``reward/seconds``: the wall time of scoring the batch;
        - ``reward/<name>/mean`` for each reward, and ``reward/<name>/failed_frac``
          for each pooled one: its failed calls over the samples.
        """
        if not self.per_reward:
            return self.correct.metrics()
        pooled = [result for name, result in self.parts.items() if name != LENGTH_PENALTY]
        timeouts = sum(result.timeouts for result in pooled)
        errors = sum(result.errors for result in pooled)
        calls = len(self.scores) * len(pooled)
        metrics = {
            "reward/mean": _mean(self.scores),
            "reward/timeouts": float(timeouts),
            "reward/errors": float(errors),
            "reward/failed_frac": (timeouts + errors) / calls if calls else 0.0,
            "reward/seconds": max(result.seconds for result in pooled),
        }
        for name, result in self.parts.items():
            metrics[f"reward/{name}/mean"] = _mean(result.scores)
            if name != LENGTH_PENALTY:
                metrics[f"reward/{name}/failed_frac"] = result.failed_frac
        return metrics


@frozen
class WeightedReward:
    """``reward.reward_type`` and ``reward.weights`` as a run scores with them.

    ``weights``: name → weight in the config's order (``{reward_type: 1.0}``
    without ``reward.weights``); ``correctness``: ``reward.reward_type``.
    Build it with `of` from a config that validation passed
    (`weights_problems`).
    """

    weights: Mapping[str, float]
    correctness: str
    per_reward: bool

    @classmethod
    def of(cls, cfg: RewardConfig) -> WeightedReward:
        weights = dict(cfg.weights) if cfg.weights else {cfg.reward_type: 1.0}
        return cls(weights=weights, correctness=cfg.reward_type, per_reward=bool(cfg.weights))

    @property
    def pooled(self) -> tuple[str, ...]:
        """The registered rewards, scored per sample in the reward pool, in order."""
        return tuple(name for name in self.weights if name != LENGTH_PENALTY)

    def functions(self) -> dict[str, str]:
        """Each pooled reward's function, ``module.qualname`` (for failure messages)."""
        return {name: function_name(get_reward(name)) for name in self.pooled}

    def combine(
        self, parts: Mapping[str, RewardResult], lengths: Int[Tensor, "batch"], group_size: int
    ) -> WeightedScores:
        """The total of ``parts`` (every pooled reward's result) and the length penalty.

        ``lengths``: each response's token count, rows grouped ``group_size``
        at a time by prompt (the length penalty compares a group's lengths).
        """
        # torch and rlcore's maths here, where the driver combines: the reward worker, which
        # only names the pooled rewards, starts without them.
        import torch

        from rlcore.shaping import combine_rewards

        missing = [name for name in self.pooled if name not in parts]
        if missing:
            raise ValueError(f"no scores of {missing} among the rewards' results {list(parts)}")
        results = {name: parts[name] for name in self.pooled}
        samples = len(results[self.correctness].scores)
        sizes = {name: len(result.scores) for name, result in results.items()}
        if set(sizes.values()) != {samples} or lengths.shape[0] != samples:
            raise ValueError(
                f"the rewards scored {sizes} samples and there are {lengths.shape[0]} lengths; "
                "they must agree"
            )
        if LENGTH_PENALTY in self.weights:
            results[LENGTH_PENALTY] = self._length_penalty(results, lengths, group_size)
        ordered = [results[name].scores for name in self.weights]
        scores = torch.tensor(ordered, dtype=torch.float64).view(len(ordered), samples)
        weights = torch.tensor(list(self.weights.values()), dtype=torch.float64)
        total = combine_rewards(scores, weights)
        return WeightedScores(
            scores=tuple(total.tolist()),
            parts={name: results[name] for name in self.weights},
            weights=self.weights,
            correctness=self.correctness,
            per_reward=self.per_reward,
        )

    def _length_penalty(
        self, results: Mapping[str, RewardResult], lengths: Tensor, group_size: int
    ) -> RewardResult:
        import torch

        from rlcore.shaping import length_penalty

        samples = lengths.shape[0]
        if group_size < 1 or samples % group_size:
            raise ValueError(
                f"{samples} responses do not make groups of {group_size} for {LENGTH_PENALTY}"
            )
        correct = torch.tensor(results[self.correctness].scores) > 0
        penalty = length_penalty(
            lengths.long().view(-1, group_size), correct.view(-1, group_size)
        ).view(-1)
        return RewardResult(scores=tuple(penalty.tolist()), timeouts=0, errors=0, seconds=0.0)


def _mean(values: tuple[float, ...]) -> float:
    return sum(values) / len(values) if values else 0.0
