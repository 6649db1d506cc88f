"""Benchmark scripts run end to end in their ``--quick`` mode and print the JSON they promise.

Only the keys are checked: timings and memory figures from tiny sizes mean nothing, and
the full runs belong to ``make bench``. Scripts run by path (torchrl installs a
top-level ``benchmarks`` package, so ``import benchmarks`` would find the wrong one).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests import launcher

# Each starts a script in a process of its own (15-80 s): long tests start first (conftest).
pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def quick_run(script: str, ray: bool = False) -> dict[str, Any]:
    """``script --quick``'s JSON; ``ray``: with a short Ray temp dir of its own (socket paths)."""
    env = dict(os.environ)
    ray_tmpdir = tempfile.mkdtemp(prefix="rb", dir="/tmp") if ray else None
    if ray_tmpdir is not None:
        env.update(RAY_TMPDIR=ray_tmpdir)
        # Its Ray workers (and those of the runs it starts) are forked from the workers'
        # zygote, as the shared cluster's are; `tests/worker_client.py` starts one cold where
        # its environment would make a fork differ. A smoke run's start-up figures mean
        # nothing; the code that measures them runs all the same.
        job_config = launcher.worker_job_config()
        if job_config is not None:
            env[launcher.RAY_JOB_CONFIG] = job_config
    try:
        # Forked from the warm interpreter (tests/launcher.py); a benchmark that starts Ray
        # starts its own, as it measures it.
        completed = launcher.run(
            [sys.executable, str(BENCHMARKS / script), "--quick"],
            env=env,
            timeout=300,
            shared_ray=False,
        )
        if completed.returncode != 0:
            raise AssertionError(
                f"{script} --quick exited {completed.returncode}:\n{completed.stderr[-4000:]}"
            )
    finally:
        if ray_tmpdir is not None:
            shutil.rmtree(ray_tmpdir, ignore_errors=True)
    report: dict[str, Any] = json.loads(completed.stdout)
    return report


def test_core_logprobs_quick_run_prints_the_expected_json() -> None:
    report = quick_run("core_logprobs.py")
    assert report["benchmark"] == "core_logprobs"
    assert report["quick"] is True
    assert isinstance(report["met"], bool)
    logits = report["token_logprobs"]
    for key in ("memory_ratio", "memory_target", "memory_met", "time_target", "time_met"):
        assert key in logits
    assert set(logits["extra_peak_mib"]) == {"naive", "chunked"}
    for threads in ("1_thread", "2_threads"):
        assert {"naive", "chunked", "ratio", "met"} <= set(logits["time_s"][threads])
    hidden = report["token_logprobs_from_hidden"]
    for key in ("hidden_size", "total_memory_ratio", "memory_target", "memory_met"):
        assert key in hidden
    assert set(hidden["max_abs_diff"]) == {"logprobs", "hidden", "weight"}
    assert isinstance(hidden["grads_equal"], bool)


def test_core_advantages_quick_run_prints_the_expected_json() -> None:
    report = quick_run("core_advantages.py")
    assert report["benchmark"] == "core_advantages"
    assert isinstance(report["met"], bool)
    for threads in ("threads_1", "threads_2"):
        run = report["results"][threads]
        for estimator in ("gae", "token_gae"):
            assert {"rlcore_ms", "loop_ms", "speedup_vs_loop"} <= set(run[estimator])
            # The baseline loop computes the same numbers: a correctness check, not timing.
            assert run[estimator]["max_abs_diff_vs_loop"] < 1e-4


def test_core_jax_quick_run_prints_the_expected_json() -> None:
    report = quick_run("core_jax.py")
    assert report["benchmark"] == "core_jax"
    assert report["quick"] is True
    assert isinstance(report["met"], bool)
    run = report["results"]["threads_1"]
    implementations = {"torch_eager", "torch_eager_checked", "jax_jit", "jax_eager"}
    for case in ("gae", "ppo_loss", "ppo_loss_grad"):
        assert implementations <= set(run[case])
        assert run[case]["fastest"] in run[case]
        assert run[case]["jax_jit"]["compile_s"] > 0
        for name in implementations - {"torch_eager"}:
            assert {"ms", "speedup_vs_torch_eager"} <= set(run[case][name])
            # Every implementation computes the baseline's numbers: correctness, not timing.
            assert run[case][name]["max_rel_diff"] < 1e-5, (case, name, run[case][name])
    assert run["gae"]["jax_jit_lax_scan"]["max_rel_diff"] < 1e-5


def test_shell_workers_quick_run_prints_the_expected_json() -> None:
    report = quick_run("shell_workers.py", ray=True)
    assert report["benchmark"] == "shell_workers"
    assert report["quick"] is True
    assert isinstance(report["met"], bool)
    assert set(report["noop_call_ms"]) == {"worker_group", "raw_ray"}
    assert report["ray_startup_s"] > 0


def test_grpo_step_quick_run_prints_the_expected_json() -> None:
    report = quick_run("grpo_step.py", ray=True)
    assert report["benchmark"] == "grpo_step"
    assert report["quick"] is True
    assert isinstance(report["met"], bool)
    (size,) = report["sizes"].values()
    assert size["rlstack"]["completion_tokens_per_s"] > 0
    # TRL on the same cores in one process and (on 2+ cores) in torchrun's processes; the full
    # run adds one process with a thread per core.
    setups = size["trl"]
    assert "1_process_1_thread" in setups
    if min(report["cores_per_side"], report["cpus"]) > 1:
        assert any(setup["setup"]["processes"] > 1 for setup in setups.values())
    for setup in setups.values():
        assert setup["same_prompts"] is True
        if not setup["dropped_after_warmup"]:
            assert setup["completion_tokens"] == size["rlstack"]["completion_tokens"]
    # The target is held against the fastest TRL setup: the smallest of the ratios.
    ratios = size["throughput_ratio_by_trl_setup"]
    assert size["throughput_ratio"] == ratios[size["trl_fastest"]] == min(ratios.values())
    assert report["weight_sync"]["synced_equal"] is True


def test_grpo_compute_quick_run_prints_the_expected_json() -> None:
    report = quick_run("grpo_compute.py")
    assert report["benchmark"] == "grpo_compute"
    assert report["quick"] is True
    assert report["threads"] == 1
    (size,) = report["sizes"].values()
    timed = size["generate_s"]
    for key in ("generate", "decode_forward_only", "generate_static_cache"):
        assert timed[key] > 0
    assert timed["generate_loop_share"] == pytest.approx(
        (timed["generate"] - timed["decode_forward_only"]) / timed["generate"]
    )
    workload = report["workload"]
    assert size["rows"] == workload["prompts"] * workload["group_size"]
    # The update's rows hold the prompt and the new tokens.
    assert size["update_forward"]["tokens"] > size["rows"] * workload["new_tokens"]
    assert size["update_forward"]["gflop_per_s"] > 0
    assert size["update_forward_backward"]["eager_s"] > 0
    assert size["update_forward_backward"]["compiled"] == "skipped in --quick"


def test_async_runner_quick_run_prints_the_expected_json() -> None:
    report = quick_run("async_runner.py", ray=True)
    assert report["benchmark"] == "async_runner"
    assert report["quick"] is True
    assert isinstance(report["met"], bool)
    sync, asynchronous = report["results"]["sync"], report["results"]["async"]
    for run in (sync, asynchronous):
        assert run["steps"] == report["workload"]["max_steps"]
        assert run["samples"] == run["steps"] * 2 * 2  # --quick: 2 prompts x 2 samples a step
        assert 0 < run["busy_frac"]["actor"] < 1
        assert 0 < run["busy_frac"]["rollout"] < 1
        assert run["eval_curve"][0][0] == 0.0
    assert report["samples_per_s_ratio"] == pytest.approx(
        asynchronous["samples_per_s"] / sync["samples_per_s"]
    )
    # 4 steps, a bound of 1: steps 1 and 2 sampled by version 0, steps 3 and 4 one behind.
    assert asynchronous["staleness_mean"] == pytest.approx(0.75)


def test_embodied_ppo_quick_run_prints_the_expected_json() -> None:
    report = quick_run("embodied_ppo.py", ray=True)
    assert report["benchmark"] == "embodied_ppo"
    assert report["quick"] is True
    assert isinstance(report["met"], bool)
    for side in ("rlstack", "sb3"):
        (run,) = report["results"][side]
        assert run["env_steps"] >= 4096 or run["reached"]
        assert run["startup_s"] >= 0


def skip_without_metaworld() -> None:
    from rlshell.envs.metaworld import metaworld_unavailable_reason

    reason = metaworld_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs metaworld (`make install` installs it): {reason}")


def test_metaworld_ppo_quick_run_prints_the_expected_json() -> None:
    skip_without_metaworld()
    report = quick_run("metaworld_ppo.py", ray=True)
    assert report["benchmark"] == "metaworld_ppo"
    assert report["quick"] is True
    assert report["torch_threads"] == 1
    # rlstack's side is the flow config with the Gaussian MLP in its place.
    assert "actor.model.model_type=mlp_policy" in report["rlstack"]["overrides"]
    for side in ("rlstack", "sb3"):
        # --quick asks for a target of 0 over 4 episodes: the first 400 env steps reach it.
        (run,) = report["results"][side]
        assert run["reached"] is True
        assert run["env_steps"] == 400
        assert run["env_steps_run"] >= run["env_steps"]
        assert run["episodes"] >= 4
        assert run["wall_s"] > 0
        assert run["startup_s"] > 0
        summary = report["over_seeds"][side]
        assert summary["seeds_reached"] == summary["seeds"] == 1
        assert summary["wall_s"]["mean"] == run["wall_s"]
    walls = {side: report["over_seeds"][side]["wall_s"]["mean"] for side in ("rlstack", "sb3")}
    assert report["rlstack_over_sb3_wall"] == pytest.approx(walls["rlstack"] / walls["sb3"])
    assert report["rlstack_over_sb3_env_steps_per_s"] > 0


def test_flow_rollout_quick_run_prints_the_expected_json() -> None:
    skip_without_metaworld()
    report = quick_run("flow_rollout.py")
    assert report["benchmark"] == "flow_rollout"
    assert report["quick"] is True
    assert report["threads"] == 1
    policies = report["policies"]
    assert {name: p["action_chunk"] for name, p in policies.items()} == {
        "mlp": 1,
        "flow_chunk1": 1,
        "flow_chunk5": 5,
    }
    assert policies["mlp"]["model_type"] == "mlp_policy"
    assert policies["flow_chunk5"]["model_type"] == "flow_policy"
    rates = {name: row["env_steps_per_s"] for name, row in report["rollout"].items()}
    assert set(rates) == {*policies, "env_only"}
    assert all(rate > 0 for rate in rates.values())
    for name in ("flow_chunk1", "flow_chunk5"):
        assert report["rollout_speed_vs_mlp"][name] == pytest.approx(rates[name] / rates["mlp"])
    for name, call in report["policy_call"].items():
        assert call["ms_per_env_step"] == pytest.approx(
            call["ms_per_call"] / policies[name]["action_chunk"]
        )
    assert set(report["policy_share_of_rollout"]) == set(policies)


def test_rollout_engines_quick_run_prints_the_expected_json() -> None:
    report = quick_run("rollout_engines.py", ray=True)
    assert report["benchmark"] == "rollout_engines"
    assert report["quick"] is True
    assert isinstance(report["met"], bool)
    (size,) = report["sampling"]["by_size"].values()
    # Both engines sample exactly max_new_tokens per completion: the same token count.
    assert size["hf"]["completion_tokens_per_call"] == size["vllm"]["completion_tokens_per_call"]
    assert size["vllm_over_hf"] > 0
    step = report["grpo_step"]
    assert step["rlstack_vllm"]["seconds_per_step_median"] > 0
    assert step["rlstack_vllm"]["mismatch_abs_diff_mean"] < 1e-4
    assert isinstance(step["trl_use_vllm_colocate"]["ran"], bool)


def test_actor_backends_quick_run_prints_the_expected_json() -> None:
    pytest.importorskip(
        "megatron.core", reason="megatron-core is not installed (the megatron extra)"
    )
    report = quick_run("actor_backends.py")
    assert report["benchmark"] == "actor_backends"
    assert report["quick"] is True
    (size,) = report["by_size"].values()
    assert set(size) == {"fsdp", "fsdp_unshared_prompts", "megatron_tp2", "megatron_dp2"}
    assert size["fsdp"]["speed_vs_fsdp"] == 1.0
    assert all(side["seconds_per_step_median"] > 0 for side in size.values())


def test_packing_quick_run_prints_the_expected_json() -> None:
    report = quick_run("packing.py")
    assert report["benchmark"] == "packing"
    assert report["quick"] is True
    (budget,) = report["results"].values()
    for layout in ("padded", "shared_prompts", "packed"):
        assert budget[layout]["tokens_per_s"] > 0
        assert budget[layout]["tokens_per_cpu_s"] > 0
        # The same update in every layout: a correctness check, not a timing.
        assert budget["max_abs_grad_diff_vs_padded"][layout] < 1e-5
    assert budget["packed_vs_padded"] > 0
    assert budget["cpu_packed_vs_padded"] > 0
    assert 0 < budget["padding_share"] < 1


@pytest.mark.xdist_group("real_model")
def test_tool_call_rate_quick_run_prints_the_expected_json() -> None:
    report = quick_run("tool_call_rate.py")
    assert report["benchmark"] == "tool_call_rate"
    assert report["quick"] is True
    assert list(report["rows"]) == [
        "system_prompt_only",
        "example_in_system_prompt",
        "one_example_turns",
        "three_example_turns",
    ]
    for row in report["rows"].values():
        assert row["samples"] == 4
        assert 0 <= row["calls"] <= 4
        assert row["rate_95"][0] <= row["rate"] <= row["rate_95"][1]


def test_seeds_summarises_runs_already_made(tmp_path: Path) -> None:
    # Two runs' metrics as `rlshell.train` writes them: seed 0 reaches 0.9 in its rolling
    # mean at step 4 and ends at 1.0; seed 1 ends at 0.5.
    successes = {0: [0.0, 0.5, 1.0, 1.0, 1.0, 1.0], 1: [0.0, 0.0, 0.5, 0.5, 0.5, 0.5]}
    run_dirs = []
    for seed, values in successes.items():
        run_dir = tmp_path / f"seed_{seed}" / "ppo"
        run_dir.mkdir(parents=True)
        (run_dir / "config.json").write_text(json.dumps({"runner": {"seed": seed}}))
        rows = [{"step": 1, "train/loss": 0.0}]  # a step without the metric is skipped
        rows += [
            {"step": i + 1, "env/success": v, "env/total_steps": 200.0 * (i + 1)}
            for i, v in enumerate(values)
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        run_dirs.append(str(run_dir))
    completed = launcher.run(
        [
            sys.executable,
            str(BENCHMARKS / "seeds.py"),
            "--last",
            "2",
            "--window",
            "2",
            "--runs",
            *run_dirs,
        ],
        env=dict(os.environ),
        timeout=60,
        shared_ray=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(completed.stdout)
    first, second = report["by_seed"]["0"], report["by_seed"]["1"]
    assert first["last_mean"] == 1.0
    assert second["last_mean"] == 0.5
    assert first["first_reached"] == {"step": 4, "env_steps": 800.0, "elapsed_s": None}
    assert second["first_reached"] is None
    over = report["over_seeds"]
    assert over["last_mean"]["mean"] == 0.75
    assert over["last_mean"]["min"] == 0.5
    assert over["every_seed_reached"] is False


def test_sft_then_rl_summarises_and_plots_runs_already_made(tmp_path: Path) -> None:
    # Two seeds' runs of both starts as `rlshell.train` writes them (the runs themselves are
    # tests/shell/test_embodied_sft.py's, on MetaWorld): cloned succeeds from the start.
    for seed in (0, 1):
        for start, values in (("cloned", [0.5, 1.0, 1.0, 0.5]), ("scratch", [0.0, 0.0, 0.5, 0.5])):
            run_dir = tmp_path / f"seed_{seed}" / start
            run_dir.mkdir(parents=True)
            rows = [
                {
                    "step": i + 1,
                    "env/success_once": v,
                    "env/success": v / 2,
                    "env/episode_return": 100 * v,
                    "env/total_steps": 400.0 * (i + 1),
                }
                for i, v in enumerate(values)
            ]
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    png = tmp_path / "curves.png"
    script = [sys.executable, str(BENCHMARKS / "sft_then_rl.py"), "--runs", str(tmp_path)]
    completed = launcher.run(
        [*script, "--seeds", "0", "1", "--window", "2", "--plot", str(png)],
        env=dict(os.environ),
        timeout=60,
        shared_ray=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(completed.stdout)
    cloned = report["summary"]["cloned"]["env/success_once"]
    assert cloned["run_mean"] == {"mean": 0.75, "std": 0.0}
    assert cloned["first_mean"]["mean"] == 0.75
    assert cloned["last_mean"]["mean"] == 0.75
    assert report["summary"]["scratch"]["env/success_once"]["last_mean"]["mean"] == 0.5
    assert report["ratio_run_mean_success_once"] == 3.0
    assert [run["env_steps"] for run in report["runs"]["cloned"]] == [1600.0, 1600.0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # One start only: summarised alone, with no ratio to a start that was not run.
    completed = launcher.run(
        [*script, "--seeds", "0", "1", "--window", "2", "--starts", "cloned"],
        env=dict(os.environ),
        timeout=60,
        shared_ray=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(completed.stdout)
    assert set(report["summary"]) == {"cloned"}
    assert report["ratio_run_mean_success_once"] is None
