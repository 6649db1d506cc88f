"""Several rewards with weights (``reward.weights``): the total, its metrics, each reward's
failures watched apart, and the config refused before start. No processes: the rewards'
results are built by hand (tests/shell/test_reward_pool.py scores several in one pool)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlshell.config import ConfigError, RewardConfig
from rlshell.rewards import REWARDS, register_reward
from rlshell.rewards.failures import FailureWatches, RewardFailedError, RewardFailure
from rlshell.rewards.pool import RewardResult
from rlshell.rewards.rule_based import exact_match_reward
from rlshell.rewards.weighted import LENGTH_PENALTY, WeightedReward, weights_problems
from rlshell.runners.validation import load_config

ROOT = Path(__file__).resolve().parents[2]


def scored(*scores: float, failed: tuple[int, ...] = (), timeouts: int = 0) -> RewardResult:
    """A reward's result; the calls at ``failed`` failed (the first ``timeouts`` timed out)."""
    failures = tuple(
        RewardFailure(kind="boom", index=i, response="r", answer="a", details="d") for i in failed
    )[:1]
    return RewardResult(
        tuple(scores),
        timeouts=timeouts,
        errors=len(failed) - timeouts,
        seconds=0.25,
        failed=failed,
        failures=failures,
    )


def test_one_reward_is_its_own_total_with_the_metrics_it_always_had() -> None:
    rewards = WeightedReward.of(RewardConfig(reward_type="exact_match"))
    assert rewards.pooled == ("exact_match",)
    result = scored(1.0, 0.0, 0.0, 1.0, failed=(2,))
    total = rewards.combine({"exact_match": result}, torch.tensor([3, 1, 2, 2]), group_size=2)
    assert total.scores == result.scores
    assert total.correct is result
    assert total.metrics() == result.metrics()


def test_the_total_is_the_weighted_sum_and_each_reward_is_logged() -> None:
    cfg = RewardConfig(weights={"math": 1.0, "format": 0.5, LENGTH_PENALTY: 0.2})
    rewards = WeightedReward.of(cfg)
    assert rewards.pooled == ("math", "format")
    # Two groups of two. Group 1: both right, lengths 2 and 6; group 2: sample 2's math call
    # timed out (scored 0, so wrong), sample 3 wrong; lengths 4 and 4.
    math = scored(1.0, 1.0, 0.0, 0.0, failed=(2,), timeouts=1)
    form = scored(1.0, 0.0, 1.0, 1.0)
    total = rewards.combine({"math": math, "format": form}, torch.tensor([2, 6, 4, 4]), 2)
    # Length penalty: +0.5 for the shorter right answer, -0.5 for the longer; 0 in a group
    # of one length.
    assert total.parts[LENGTH_PENALTY].scores == (0.5, -0.5, 0.0, 0.0)
    assert list(total.parts) == ["math", "format", LENGTH_PENALTY]
    expected = (1.0 + 0.5 + 0.1, 1.0 + 0.0 - 0.1, 0.0 + 0.5 + 0.0, 0.0 + 0.5 + 0.0)
    assert total.scores == pytest.approx(expected)
    metrics = total.metrics()
    assert metrics == pytest.approx(
        {
            "reward/mean": sum(expected) / 4,
            "reward/timeouts": 1.0,
            "reward/errors": 0.0,
            "reward/failed_frac": 1 / 8,  # one failed call of 4 samples × 2 pooled rewards
            "reward/seconds": 0.25,
            "reward/math/mean": 0.5,
            "reward/math/failed_frac": 0.25,
            "reward/format/mean": 0.75,
            "reward/format/failed_frac": 0.0,
            "reward/length_penalty/mean": 0.0,
        }
    )


def test_a_weight_of_zero_scores_the_correctness_reward_without_training_on_it() -> None:
    rewards = WeightedReward.of(RewardConfig(weights={"math": 0.0, "format": 1.0}))
    total = rewards.combine(
        {"math": scored(1.0, 0.0), "format": scored(0.0, 1.0)}, torch.tensor([1, 1]), 2
    )
    assert total.scores == (0.0, 1.0)
    assert total.correct.scores == (1.0, 0.0)


def test_combining_refuses_results_that_do_not_fit() -> None:
    rewards = WeightedReward.of(RewardConfig(weights={"math": 1.0, LENGTH_PENALTY: 0.1}))
    with pytest.raises(ValueError, match=r"no scores of \['math'\]"):
        rewards.combine({"format": scored(1.0)}, torch.tensor([1]), 1)
    with pytest.raises(ValueError, match="they must agree"):
        rewards.combine({"math": scored(1.0, 0.0)}, torch.tensor([1, 2, 3]), 1)
    with pytest.raises(ValueError, match="3 responses do not make groups of 2"):
        rewards.combine({"math": scored(1.0, 0.0, 1.0)}, torch.tensor([1, 2, 3]), 2)


# ------------------------------------------------------------- failures, reward by reward


def test_each_rewards_failures_are_shown_under_its_own_name() -> None:
    watches = FailureWatches({"math": "m.math", "judge": "j.judge"}, max_failed_steps=3)
    results = {"math": scored(1.0, 0.0), "judge": scored(0.0, 0.0, failed=(1,))}
    (line,) = watches.notices(results, "step 1")
    assert line.startswith("reward 'judge' (j.judge) failed at step 1 on 1 of 2 samples")
    assert watches.notices(results, "step 2") == []
    # The evaluation scores the correctness reward alone; the length penalty is not watched.
    assert watches.notices({"math": scored(1.0), LENGTH_PENALTY: scored(0.5)}, "eval") == []


def test_one_reward_failing_every_call_stops_the_run_while_the_others_work() -> None:
    watches = FailureWatches({"math": "m.math", "judge": "j.judge"}, max_failed_steps=2)
    broken = {"math": scored(1.0, 0.0), "judge": scored(0.0, 0.0, failed=(0, 1))}
    watches.check(1, broken)
    watches.check(2, {"math": scored(1.0, 0.0), "judge": scored(0.0, 1.0, failed=(0,))})
    watches.check(3, broken)
    with pytest.raises(RewardFailedError) as caught:
        watches.check(4, broken)
    assert str(caught.value).startswith(
        "reward 'judge' (j.judge) failed on every sample of steps 3-4 "
        "(reward.max_failed_steps=2); stopping before step 4's update."
    )
    with pytest.raises(ValueError, match=r"step 5: no results of the rewards \['judge'\]"):
        watches.check(5, {"math": scored(1.0)})


# ------------------------------------------------------------- refused before start


def test_weights_problems_name_each_mistake() -> None:
    def problems(weights: dict[str, float], reward_type: str = "math", group: int = 4) -> list[str]:
        return weights_problems(RewardConfig(reward_type=reward_type, weights=weights), group)

    assert problems({}) == []
    assert problems({"math": 1.0, "format": 0.1, LENGTH_PENALTY: 0.1}) == []
    (typo,) = problems({"math": 1.0, "formt": 0.1})
    assert typo.startswith(
        "reward.weights: unknown reward type 'formt' (did you mean 'format'?); registered: "
    )
    assert typo.endswith(", and the built-in 'length_penalty'")
    (typo,) = problems({"math": 1.0, "length_penality": 0.1})
    assert "(did you mean 'length_penalty'?)" in typo
    assert problems({"format": 1.0}) == [
        "reward.weights: no weight for reward.reward_type 'math', the correctness reward whose "
        "held-out mean is eval/accuracy (and which length_penalty reads); add it ('math': 0.0 "
        "evaluates by it without training on it) or set reward.reward_type to one of 'format'"
    ]
    assert problems({"math": 0.0, "format": 0.0}) == [
        "reward.weights: every weight is 0 ({'math': 0.0, 'format': 0.0}), so every sample's "
        "reward would be 0 and nothing would be learnt"
    ]
    assert problems({"math": 1.0, LENGTH_PENALTY: 0.1}, group=1) == [
        "reward.weights: 'length_penalty' compares the lengths of the responses to one prompt, "
        "and algorithm.group_size is 1: it would be 0 for every sample; sample 2 or more per "
        "prompt or leave it out"
    ]


def test_a_registered_reward_named_length_penalty_is_ambiguous() -> None:
    register_reward(LENGTH_PENALTY, exact_match_reward)
    try:
        (line,) = weights_problems(RewardConfig(weights={"math": 1.0, LENGTH_PENALTY: 0.1}), 4)
    finally:
        REWARDS.unregister(LENGTH_PENALTY)
    assert line == (
        "reward.weights: 'length_penalty' names the built-in length penalty "
        "(rlcore.shaping.length_penalty), and the reward registered under that name "
        "(rlshell.rewards.rule_based.exact_match_reward) would never be called; register it "
        "under another name"
    )


def test_the_config_refuses_bad_weights_before_start() -> None:
    config = load_config(
        ROOT / "configs" / "grpo.py", ["reward.weights.math=1", "reward.weights.format=0.1"]
    )
    assert config.reward.weights == {"math": 1.0, "format": 0.1}
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs" / "grpo.py", ['reward.weights={"math": 1, "fromat": NaN}'])
    assert caught.value.problems[0] == (
        "reward.weights: expected a mapping of names to finite numbers, got "
        "{'math': 1.0, 'fromat': nan}"
    )
    assert caught.value.problems[1].startswith("reward.weights: unknown reward type 'fromat'")
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "configs" / "ppo_cartpole.py", ["reward.weights.math=1"])
    assert caught.value.problems == [
        "reward.weights: the embodied PPO runner scores with the env's rewards; reward.* "
        "configures the reasoning runner's reward workers"
    ]
