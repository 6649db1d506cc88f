"""`FailureWatch`: each kind of reward failure shown once a run, and the stop after
``reward.max_failed_steps`` steps on which every call failed. No processes: results are
built by hand (tests/shell/test_reward_pool.py shows the pool filling them in)."""

from __future__ import annotations

import pytest

from rlshell.cluster.errors import WorkerError
from rlshell.rewards.failures import (
    TIMEOUT,
    FailureWatch,
    RewardFailedError,
    RewardFailure,
    function_name,
)
from rlshell.rewards.pool import RewardResult
from rlshell.rewards.rule_based import math_reward

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "my_rewards.py", line 12, in score\n'
    "    raise ValueError('no number')\n"
    "ValueError: no number"
)
RAISED = RewardFailure(
    kind="ValueError at my_rewards.py:12 in score",
    index=1,
    response="twelve",
    answer="12",
    details=TRACEBACK,
    count=2,
)
HUNG = RewardFailure(
    kind=TIMEOUT, index=3, response="13", answer="12", details="score did not return", count=1
)


def result(size: int, *failures: RewardFailure, failed: tuple[int, ...] = ()) -> RewardResult:
    failed = failed or tuple(sorted(f.index for f in failures))
    scores = tuple(0.0 if i in failed else 1.0 for i in range(size))
    return RewardResult(scores, 0, len(failed), 0.1, failed=failed, failures=failures)


def watch(max_failed_steps: int = 3) -> FailureWatch:
    return FailureWatch("mine", "my_rewards.score", max_failed_steps)


def test_the_function_name_is_module_and_qualified_name() -> None:
    assert function_name(math_reward) == "rlshell.rewards.rule_based.math_reward"

    class Scorer:
        def __call__(self, response: str, answer: str) -> float:
            return 0.0

    assert function_name(Scorer()).endswith(
        "test_the_function_name_is_module_and_qualified_name.<locals>.Scorer"
    )


def test_each_kind_is_shown_once_with_the_reward_the_sample_and_the_traceback() -> None:
    w = watch()
    (first,) = w.notices(result(4, RAISED, failed=(1, 2)), "step 1")
    assert first == (
        "reward 'mine' (my_rewards.score) failed at step 1 on 2 of 4 samples, 2 of them: "
        "ValueError at my_rewards.py:12 in score; the first, shown once a run:\n"
        "  sample 1: response 'twelve', answer '12'\n"
        "  Traceback (most recent call last):\n"
        '    File "my_rewards.py", line 12, in score\n'
        "      raise ValueError('no number')\n"
        "  ValueError: no number"
    )
    assert w.notices(result(4, RAISED, failed=(1, 2)), "step 2") == []
    (timeout,) = w.notices(result(4, RAISED, HUNG), "step 3")
    assert timeout.startswith("reward 'mine' (my_rewards.score) failed at step 3 on 2 of 4 ")
    assert "2 of 4 samples, 1 of them: timed out; the first, shown once a run:" in timeout
    assert w.notices(result(4), "step 4") == []


def test_every_call_failing_for_max_failed_steps_in_a_row_stops_naming_the_reward() -> None:
    w = watch(max_failed_steps=3)
    everything = result(2, RAISED, failed=(0, 1))
    w.notices(everything, "step 1")
    w.check(1, everything)
    w.check(2, result(2, RAISED, failed=(1,)))  # a sample scored: the streak ends
    for step in (3, 4):
        w.check(step, everything)
    with pytest.raises(RewardFailedError) as caught:
        w.check(5, everything)
    error = caught.value
    assert isinstance(error, WorkerError)  # the command line's exit status 1
    assert str(error) == (
        "reward 'mine' (my_rewards.score) failed on every sample of steps 3-5 "
        "(reward.max_failed_steps=3); stopping before step 5's update. Step 5: "
        "2 × ValueError at my_rewards.py:12 in score; the first, sample 1 (response 'twelve', "
        "answer '12'): ValueError: no number (its traceback is printed above, at step 1)"
    )
    assert (error.component, error.method) == ("reward", "score")
    assert error.remote_traceback == TRACEBACK
    assert error.reward_failure is RAISED


def test_a_traceback_not_shown_yet_is_in_the_error() -> None:
    w = watch(max_failed_steps=1)
    with pytest.raises(RewardFailedError) as caught:
        w.check(7, result(2, RAISED, failed=(0, 1)))
    message = str(caught.value)
    assert "failed on every sample of step 7 (reward.max_failed_steps=1)" in message
    assert message.endswith("answer '12'):\n" + TRACEBACK)


def test_zero_never_stops_and_an_empty_batch_is_no_failure() -> None:
    w = watch(max_failed_steps=0)
    for step in range(1, 20):
        w.check(step, result(2, RAISED, failed=(0, 1)))
    w = watch(max_failed_steps=1)
    w.check(1, result(0))
    assert w.failed_streak == 0
    with pytest.raises(ValueError, match=r"reward\.max_failed_steps: expected an integer ≥ 0"):
        watch(max_failed_steps=-1)
