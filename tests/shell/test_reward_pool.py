"""Rewards scored in a RewardPool: math, timeouts, errors, a RewardWorker on Ray; the format reward.

Misbehaving rewards come from `reward_ext_chaos`, an extension module beside
this file, so reward processes (and a Ray worker's) register them too.
Pools start once per module: the fork server a pool's processes fork from takes
a few seconds to import torch and math-verify.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlshell.cluster.placement import ComponentPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import RewardConfig
from rlshell.rewards import REWARDS, get_reward, register_reward
from rlshell.rewards.failures import CRASH, NON_FINITE, TIMEOUT
from rlshell.rewards.pool import RewardPool, RewardPoolError, RewardResult
from rlshell.rewards.rule_based import format_reward, has_final_answer, math_reward
from rlshell.workers.reward import RewardWorker

PlanFactory = Callable[..., ComponentPlan]

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 1.0
# A hung call is noticed at its deadline; reading and killing take well under this.
SLACK_S = 2.5
FAILED = -1.0


@pytest.fixture(scope="module")
def chaos_extension() -> Iterator[None]:
    """RLSHELL_EXT_MODULE names reward_ext_chaos, importable here and in every child process."""
    with pytest.MonkeyPatch.context() as patch:
        path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
        patch.setenv("PYTHONPATH", path)
        patch.setenv("RLSHELL_EXT_MODULE", "reward_ext_chaos")
        patch.syspath_prepend(str(HERE))
        yield


@pytest.fixture(scope="module")
def math_pool() -> Iterator[RewardPool]:
    with RewardPool("math", timeout_s=30.0, num_processes=1) as pool:
        yield pool


@pytest.fixture(scope="module")
def chaos_pool(chaos_extension: None) -> Iterator[RewardPool]:
    with RewardPool("chaos", timeout_s=TIMEOUT_S, num_processes=2, failure_score=FAILED) as pool:
        yield pool


# ------------------------------------------------------------- math


def test_math_scores_equivalent_answers_and_reports_metrics(math_pool: RewardPool) -> None:
    responses = ["12", "#### 12", "so it is \\boxed{\\frac{1}{2}}", "13", "no idea"]
    answers = ["12", "12", "0.5", "12", "12"]
    result = math_pool.score(responses, answers)
    assert result.scores == (1.0, 1.0, 1.0, 0.0, 0.0)
    assert (result.timeouts, result.errors, result.failed, result.error_examples) == (0, 0, (), ())
    metrics = result.metrics()
    assert metrics.pop("reward/seconds") == result.seconds > 0
    assert metrics == {
        "reward/mean": 0.6,
        "reward/timeouts": 0.0,
        "reward/errors": 0.0,
        "reward/failed_frac": 0.0,
    }
    assert result.failures == ()
    assert math_pool.function == "rlshell.rewards.rule_based.math_reward"


def test_math_scores_in_the_pool_match_direct_calls(math_pool: RewardPool) -> None:
    responses = ["#### 1,000", "1000", "\\boxed{2^{3}}", "x = 8", "-4", "0.25", "1/4", ""] * 4
    answers = ["1000", "1000", "8", "8", "-4", "\\frac{1}{4}", "0.25", "3"] * 4
    result = math_pool.score(responses, answers)
    expected = tuple(math_reward(r, a) for r, a in zip(responses, answers, strict=True))
    assert result.scores == expected
    assert result.failed == ()


def test_arithmetic_left_undone_is_not_an_answer() -> None:
    """Where the reference is a number, an unevaluated sum, difference or product of integers
    scores 0 although math-verify accepts it; fractions and the rest keep its verdict."""
    from math_verify import parse, verify

    undone = [("19+1", "20"), ("1+9", "10"), ("2*10", "20"), ("\\boxed{25-5}", "20"), ("7+0", "7")]
    for response, answer in undone:
        assert verify(parse(answer), parse(response)), (response, answer)  # math-verify: equal
        assert math_reward(response, answer) == 0.0, (response, answer)
    kept = [
        ("20", "20"),
        ("#### 20", "20"),
        ("1/4", "0.25"),
        ("\\frac{1}{4}", "0.25"),
        ("-4", "-4"),
    ]
    kept += [("x = 8", "8"), ("14++", "14"), ("\\boxed{2^{3}}", "8"), ("$1+x$", "$x+1$")]
    for response, answer in kept:
        assert math_reward(response, answer) == 1.0, (response, answer)


def test_memoised_math_verdicts_equal_fresh_math_verify_ones() -> None:
    """The parse and verdict caches change cost only: every call agrees with math-verify's own
    (on answers that are not arithmetic left undone, where the reward differs on purpose)."""
    from math_verify import parse, verify

    responses = ["#### 1,000", "1000", "\\boxed{2^{3}}", "x = 8", "-4", "0.25", "1/4", "", "7"]
    answers = ["1000", "1000", "8", "8", "-4", "\\frac{1}{4}", "0.25", "3", "7"]
    for _ in range(2):  # cold caches, then warm ones
        for response, answer in zip(responses, answers, strict=True):
            gold, predicted = parse(answer), parse(response)
            fresh = 1.0 if gold and predicted and verify(gold, predicted) else 0.0
            assert math_reward(response, answer) == fresh, (response, answer)


# ------------------------------------------------------------- failures


def test_hung_and_spinning_calls_are_killed_and_the_pool_scores_on(chaos_pool: RewardPool) -> None:
    start = time.monotonic()
    result = chaos_pool.score(["a", "b", "SPIN", "HANG"], ["a", "x", "-", "-"])
    elapsed = time.monotonic() - start
    assert result.scores == (1.0, 0.0, FAILED, FAILED)
    assert (result.timeouts, result.errors, result.failed) == (2, 0, (2, 3))
    assert result.error_examples == tuple(f"sample {i}: timed out after 1 s" for i in (2, 3))
    (hang,) = result.failures  # one kind: the first of it, and how many
    assert (hang.kind, hang.index, hang.count, hang.response, hang.answer) == (
        TIMEOUT,
        2,
        2,
        "SPIN",
        "-",
    )
    assert hang.details == (
        "reward_ext_chaos.chaos_reward did not return within reward.timeout_s = 1 s; its "
        "process was killed (SIGKILL) and replaced"
    )
    assert result.metrics()["reward/failed_frac"] == 0.5
    # Two processes, two hangs: they time out side by side, not one after the other.
    assert elapsed < TIMEOUT_S + SLACK_S, elapsed
    # Both processes were killed; the next batch waits for their replacements.
    again = chaos_pool.score(["a", "b", "c"], ["a", "b", "x"])
    assert again.scores == (1.0, 1.0, 0.0)
    assert again.failed == ()


def test_each_call_of_a_chunk_has_its_own_deadline(chaos_pool: RewardPool) -> None:
    # The first process gets samples 0-9 in one chunk: three SLOW calls take
    # 1.2 s together, longer than the timeout, but each is well inside it.
    responses = ["SLOW"] * 3 + ["a"] * 37
    result = chaos_pool.score(responses, ["a"] * 40)
    assert result.scores == (1.0,) * 40
    assert result.timeouts == 0


def test_raising_and_bad_values_count_as_errors(chaos_pool: RewardPool) -> None:
    result = chaos_pool.score(["BOOM", "NAN", "NONE", "TEXT", "ok"], ["a", "b", "c", "d", "ok"])
    assert result.scores == (FAILED,) * 4 + (1.0,)
    assert (result.timeouts, result.errors, result.failed) == (0, 4, (0, 1, 2, 3))
    assert result.error_examples == (
        "sample 0: ValueError: boom on 'a'",
        "sample 1: returned nan, expected a finite float",
        "sample 2: returned None, expected a finite float",
    )
    assert result.metrics()["reward/errors"] == 4.0
    assert result.metrics()["reward/failed_frac"] == 0.8
    raised, bad_value = result.failures
    assert re.fullmatch(r"ValueError at reward_ext_chaos\.py:\d+ in chaos_reward", raised.kind)
    assert (raised.index, raised.count, raised.response, raised.answer) == (0, 1, "BOOM", "a")
    # The reward's own frames, from the call down; the pool's frame is left out.
    assert raised.details.startswith("Traceback (most recent call last):\n  File ")
    assert 'reward_ext_chaos.py", line' in raised.details
    assert 'raise ValueError(f"boom on {answer!r}")' in raised.details
    assert "pool.py" not in raised.details
    assert raised.details.endswith("ValueError: boom on 'a'")
    assert raised.last_line == "ValueError: boom on 'a'"
    assert (bad_value.kind, bad_value.index, bad_value.count) == (NON_FINITE, 1, 3)
    assert bad_value.details == (
        "reward_ext_chaos.chaos_reward returned nan, expected a finite float"
    )


def test_a_long_sample_is_cut_in_the_failure_record(chaos_pool: RewardPool) -> None:
    (failure,) = chaos_pool.score(["BOOM"], ["y" * 500]).failures
    assert failure.response == "BOOM"
    assert failure.answer == "y" * 197 + "..."


def test_a_process_that_dies_mid_call_fails_that_sample_and_is_replaced(
    chaos_pool: RewardPool,
) -> None:
    result = chaos_pool.score(["EXIT", "a"], ["-", "a"])
    assert result.scores == (FAILED, 1.0)
    assert (result.timeouts, result.errors) == (0, 1)
    assert "exited with code 3" in result.error_examples[0]
    (crash,) = result.failures
    assert (crash.kind, crash.index, crash.response) == (CRASH, 0, "EXIT")
    assert "exited with code 3 while reward_ext_chaos.chaos_reward was scoring" in crash.details
    assert "there is no traceback to show" in crash.details
    assert chaos_pool.score(["b"], ["b"]).scores == (1.0,)


def test_a_reward_past_its_memory_limit_fails_that_sample_and_the_pool_scores_on(
    chaos_extension: None,
) -> None:
    """``memory_mb`` (``reward.memory_mb``): a call that allocates 1 GiB in a process
    allowed 200 MiB more fails with MemoryError, scored and counted; the next calls score."""
    with RewardPool(
        "chaos", timeout_s=TIMEOUT_S, num_processes=1, failure_score=FAILED, memory_mb=200
    ) as pool:
        result = pool.score(["HOG", "a"], ["-", "a"])
        assert result.scores == (FAILED, 1.0)
        assert (result.timeouts, result.errors) == (0, 1)
        (failure,) = result.failures
        assert failure.last_line == "MemoryError"
        assert pool.score(["b"], ["b"]).scores == (1.0,)


ORPHANED = """
import sys, time
from rlshell.rewards.pool import RewardPool
pool = RewardPool("chaos", timeout_s=600.0, num_processes=1)
print(pool.pids[0], flush=True)
pool.score(["HANG"], ["-"])  # hangs in the reward process until this process is killed
"""


def test_reward_processes_end_when_the_pools_process_is_killed_even_mid_call(
    chaos_extension: None,
) -> None:
    import signal
    import subprocess
    import sys

    owner = subprocess.Popen(
        [sys.executable, "-c", ORPHANED], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    assert owner.stdout is not None
    child = int(owner.stdout.readline())
    time.sleep(0.5)  # the call is under way
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(timeout=10)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists():
        status = (
            Path(f"/proc/{child}/status").read_text() if Path(f"/proc/{child}").exists() else ""
        )
        if "State:\tZ" in status:
            break  # ended; its parent (the fork server, or init) has not reaped it yet
        assert time.monotonic() < deadline, "the reward process outlived its pool's process"
        time.sleep(0.1)


def test_a_reward_process_sees_the_pools_environment_when_it_started(
    chaos_extension: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``isolation='weak'``: processes fork from a fork server started by an earlier pool;
    each still sees the environment of the pool that started it, as a spawned process
    would. In a sandbox (the default) a reward process sees none of it: the environment is
    cleared but for extension modules, thread counts and the locale."""
    weak = {"timeout_s": 30.0, "num_processes": 1, "failure_score": FAILED, "isolation": "weak"}
    with RewardPool("chaos", **weak) as first:  # type: ignore[arg-type]
        assert first.score(["ENV:RLSHELL_TEST_REWARD_ENV"], ["unset"]).scores == (1.0,)
    monkeypatch.setenv("RLSHELL_TEST_REWARD_ENV", "set later")
    with RewardPool("chaos", **weak) as second:  # type: ignore[arg-type]
        assert second.score(["ENV:RLSHELL_TEST_REWARD_ENV"], ["set later"]).scores == (1.0,)
    with RewardPool("chaos", timeout_s=30.0, num_processes=1, failure_score=FAILED) as boxed:
        assert boxed.score(["ENV:RLSHELL_TEST_REWARD_ENV"], ["unset"]).scores == (1.0,)


# ------------------------------------------------------------- several rewards in one pool


@pytest.fixture(scope="module")
def mixed_pool(chaos_extension: None) -> Iterator[RewardPool]:
    """Three rewards in one process: a hang in the second kills the process mid-batch."""
    names = ["exact_match", "chaos", "format"]
    with RewardPool(names, timeout_s=TIMEOUT_S, num_processes=1, failure_score=FAILED) as pool:
        yield pool


def test_a_hang_in_one_of_several_rewards_fails_that_reward_alone(mixed_pool: RewardPool) -> None:
    responses, answers = ["a", "HANG", "12", "BOOM"], ["a", "-", "12", "x"]
    results = mixed_pool.score_each(responses, answers)
    assert list(results) == ["exact_match", "chaos", "format"]
    exact, chaos, form = results.values()
    assert exact.scores == (1.0, 0.0, 1.0, 0.0)
    assert form.scores == (0.0, 0.0, 1.0, 0.0)
    assert exact.failed == form.failed == ()
    assert chaos.scores == (1.0, FAILED, 1.0, FAILED)
    assert (chaos.timeouts, chaos.errors, chaos.failed) == (1, 1, (1, 3))
    hang, boom = chaos.failures
    assert (hang.kind, hang.index, hang.response) == (TIMEOUT, 1, "HANG")
    assert hang.details.startswith("reward_ext_chaos.chaos_reward did not return within")
    assert (boom.index, boom.response, boom.last_line) == (3, "BOOM", "ValueError: boom on 'x'")
    assert chaos.error_examples == (
        "sample 1: timed out after 1 s",
        "sample 3: ValueError: boom on 'x'",
    )
    # The replacement process holds every reward; some of them can be asked for, in any order.
    again = mixed_pool.score_each(["12", "b"], ["12", "c"], ["format", "exact_match"])
    assert list(again) == ["format", "exact_match"]
    assert (again["format"].scores, again["exact_match"].scores) == ((1.0, 0.0), (1.0, 0.0))


def test_a_pool_of_several_rewards_names_them_where_one_is_expected(
    mixed_pool: RewardPool,
) -> None:
    assert mixed_pool.functions["format"] == "rlshell.rewards.rule_based.format_reward"
    with pytest.raises(ValueError, match=r"scores 3 rewards \(exact_match, chaos, format\); "):
        mixed_pool.score(["a"], ["a"])
    with pytest.raises(ValueError, match="use score_each and functions"):
        _ = mixed_pool.function
    with pytest.raises(ValueError, match=r"expected distinct rewards of this pool .*\['math'\]"):
        mixed_pool.score_each(["a"], ["a"], ["math"])
    with pytest.raises(ValueError, match="several distinct ones"):
        RewardPool(["math", "math"], timeout_s=1.0, num_processes=1)


def test_mismatched_lengths_and_empty_batches(chaos_pool: RewardPool) -> None:
    with pytest.raises(ValueError, match="got 2 responses and 1 answers"):
        chaos_pool.score(["a", "b"], ["a"])
    empty = chaos_pool.score([], [])
    assert empty == RewardResult(scores=(), timeouts=0, errors=0, seconds=empty.seconds)
    assert empty.metrics()["reward/mean"] == 0.0


def test_an_unknown_reward_fails_at_construction_with_close_names() -> None:
    with pytest.raises(KeyError, match="unknown reward type 'maht' \\(did you mean 'math'"):
        RewardPool("maht", timeout_s=1.0, num_processes=1)
    with pytest.raises(ValueError, match="timeout_s: expected a positive number"):
        RewardPool("math", timeout_s=0.0, num_processes=1)
    with pytest.raises(ValueError, match="num_processes: expected a positive integer, got 0"):
        RewardPool("math", timeout_s=1.0, num_processes=0)


def test_a_reward_registered_outside_an_extension_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RLSHELL_EXT_MODULE", raising=False)
    register_reward("only_in_this_process", math_reward)
    try:
        with pytest.raises(RewardPoolError, match="failed to start: KeyError: unknown") as info:
            RewardPool("only_in_this_process", timeout_s=1.0, num_processes=1)
        assert "registered by a module named in RLSHELL_EXT_MODULE" in str(info.value)
    finally:
        REWARDS.unregister("only_in_this_process")


# ------------------------------------------------------------- on Ray


def test_a_reward_worker_scores_in_a_ray_worker_with_extensions(
    ray_cluster: Cluster, plan_component: PlanFactory, chaos_extension: None
) -> None:
    cfg = RewardConfig(reward_type="chaos", timeout_s=TIMEOUT_S, num_processes=1)
    group = RewardWorker.create_group(cfg).launch(ray_cluster, plan_component("reward", 1))
    try:
        ((name, result),) = group.score(["a", "b", "HANG"], ["a", "x", "-"]).wait()[0].items()
        assert name == "chaos"
        assert result.scores == (1.0, 0.0, 0.0)
        assert (result.timeouts, result.errors) == (1, 0)
        group.close().wait()
        with pytest.raises(RuntimeError, match="RewardPool for 'chaos' is closed"):
            group.score(["a"], ["a"]).wait()
    finally:
        group.shutdown()


# ------------------------------------------------------------- the format reward


@pytest.mark.parametrize(
    "response",
    [
        "12",
        " -3.5\n",
        "1,000",
        "Add them.\n#### 72",
        "#### $18\n",
        "so the answer is $\\boxed{\\frac{1}{2}}$.",
        "\\boxed {7}",
    ],
)
def test_format_rewards_a_stated_final_answer(response: str) -> None:
    assert has_final_answer(response)
    assert format_reward(response, "anything") == 1.0


@pytest.mark.parametrize(
    "response",
    ["", "the answer is 12", "12 apples", "12.", "1,00", "#### twelve", "x #### 12", "\\boxed{}"],
)
def test_format_rejects_answers_in_no_recognised_format(response: str) -> None:
    assert format_reward(response, "12") == 0.0


def test_format_is_a_registered_reward() -> None:
    assert get_reward("format") is format_reward
