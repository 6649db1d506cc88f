"""The docs run: the example script, every Python snippet and every shell command in them.

Conventions every page under docs/ follows (docs/index.md repeats them for writers):

- Every ```python block is executed, in document order, in one namespace per
  page, in a fresh interpreter (snippets register estimators; the registries
  of this test process stay untouched). A block that shows an error catches
  it and prints it.
- A ```text block that directly follows a ```python or ```bash block (blank
  lines between are allowed) is that block's exact standard output.
- Every command in a ```bash block is either run here (`RUN_HERE`) or listed
  in `COVERED_ELSEWHERE` with the place that runs it. A command in neither
  list, or a list entry no page shows any more, fails the test.

docs/core.md must also show every public function of rlcore with the
signature it has in the source (names in order, defaults), so a changed
signature fails here until the reference is updated.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests import launcher

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
EXAMPLE = DOCS / "examples" / "custom_estimator.py"
BIN = Path(sys.executable).parent
EXAMPLE_COMMAND = ".venv/bin/python docs/examples/custom_estimator.py"

RUN_HERE = {
    'RLCORE_TYPECHECK=0 .venv/bin/python -c "import rlcore; print(rlcore.typecheck_enabled())"',
    ".venv/bin/mypy --strict docs/examples/custom_estimator.py",
    ".venv/bin/ruff check docs/examples && .venv/bin/ruff format --check docs/examples",
    # docs/config.md
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run",
    ".venv/bin/python -m rlshell.train --help",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run actor.optim.lr=1e-4 "
    'algorithm.group_size=4 rollout.temperature=0.7 logger.backends=\'["console","jsonl"]\'',
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run && .venv/bin/python -m "
    "rlshell.train --config runs/grpo/dry_run/config.json --dry-run "
    "runner.experiment_name=grpo_again",
    "RLSHELL_TRACE_CONFIG_READS=runs/cartpole_reads .venv/bin/python -m rlshell.train "
    "configs/ppo_cartpole.py runner.max_steps=2 runner.experiment_name=cartpole_traced "
    "--overwrite > /dev/null && cut -f1 runs/cartpole_reads/*.keys | sort -u | "
    "grep '^algorithm\\.'",
    # docs/rollout.md
    ".venv/bin/python -m rlshell.train configs/grpo_vllm.py --dry-run "
    """cluster.component_placement='{"actor": "0:0-1", "rollout": "0:0", "reward": "0"}' """
    "runner.experiment_name=grpo_vllm_disagg",
    ".venv/bin/python -m rlshell.train configs/grpo_vllm.py --dry-run "
    "algorithm.old_logprobs=rollout algorithm.rollout_is=sequence_mask "
    "algorithm.rollout_is_threshold=1.5 runner.experiment_name=grpo_vllm_masked",
    # docs/placement.md
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run cluster.simulate=4x8 "
    "rollout.backend=vllm rollout.tensor_parallel_size=4 cluster.component_placement="
    """'{"actor": "all", "rollout": "16-31", "reward": "0-3"}' runner.experiment_name=grpo_4x8""",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run cluster.simulate=1x0x2",
    # docs/embodied.md
    ".venv/bin/python -m rlshell.envs.vulkan status",
    ".venv/bin/python -m rlshell.envs.osmesa status",
    ".venv/bin/python -m rlshell.train configs/ppo_cartpole.py --dry-run cluster.simulate=1x2 "
    """cluster.component_placement='{"actor": "0-1", "rollout": "1", "env": "0:0-1"}' """
    "rollout.pipeline_stage_num=2 runner.experiment_name=ppo_cartpole_hybrid",
    # docs/reasoning.md
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run algorithm.adv_type=dr_grpo "
    "algorithm.loss_agg_mode=seq-mean-token-sum-norm runner.experiment_name=dr_grpo",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run algorithm.clip_low=0.2 "
    "algorithm.clip_high=0.28 algorithm.loss_agg_mode=token-mean "
    "runner.experiment_name=clip_higher",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run algorithm.adv_type=rloo "
    "algorithm.loss_type=vanilla algorithm.loss_agg_mode=seq-mean-token-sum "
    "runner.experiment_name=rloo",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run algorithm.adv_type=reinforce_pp "
    "algorithm.kl_coef=0.001 algorithm.kl_kind=k2 runner.experiment_name=reinforce_pp_kl",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run algorithm.adv_type=reinforce_pp "
    "algorithm.kl_coef=0.01 algorithm.kl_in_reward=true algorithm.kl_kind=k1 "
    "algorithm.kl_target=0.5 runner.experiment_name=kl_in_reward",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run rollout.weight_sync=shared "
    "runner.experiment_name=shared",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run "
    """'reward.weights={"math": 1.0, "format": 0.1, "length_penalty": 0.1}' """
    "runner.experiment_name=weighted_rewards",
    ".venv/bin/python -m rlshell.train configs/ppo_critic.py --dry-run "
    "runner.experiment_name=ppo_critic_plan",
    ".venv/bin/python -m rlshell.train configs/dapo.py --dry-run runner.experiment_name=dapo_plan",
    ".venv/bin/python -m rlshell.train configs/grpo.py --dry-run actor.pack_sequences=true "
    "actor.micro_batch_max_tokens=1024 runner.experiment_name=packed",
    # docs/async.md
    ".venv/bin/python -m rlshell.train configs/grpo_async.py --dry-run",
    ".venv/bin/python -m rlshell.train configs/grpo_async.py --dry-run "
    "rollout.partial_rollouts=true runner.experiment_name=grpo_async_partial",
    # docs/extending.md
    "PYTHONPATH=examples/extension RLSHELL_EXT_MODULE=rlshell_example_ext .venv/bin/python -m "
    "rlshell.train configs/grpo.py --dry-run reward.reward_type=contains_answer "
    "runner.experiment_name=ext_example",
    "PYTHONPATH=examples/typed_extension RLSHELL_EXT_MODULE=rlstack_typed_ext .venv/bin/python -m "
    "rlshell.train configs/grpo.py --dry-run algorithm.adv_type=win_rate algorithm.loss_type=cispo "
    "runner.experiment_name=typed_ext",
    ".venv/bin/mypy --config-file examples/typed_extension/pyproject.toml "
    "examples/typed_extension/rlstack_typed_ext",
    "PYTHONPATH=tests/shell RLSHELL_EXT_MODULE=rlinf_plugins_ext .venv/bin/python -m rlshell.train "
    "configs/ppo_cartpole.py --dry-run algorithm.adv_type=rlinf_sign "
    "algorithm.loss_type=rlinf_clip algorithm.group_size=2 algorithm.gamma=1 algorithm.lam=1 "
    "algorithm.vf_coef=0.5 runner.experiment_name=rlinf_plugins",
    # docs/real_model.md (make install made the snapshot: this verifies it and keeps it)
    ".venv/bin/python -m rlshell.gguf install-smollm2",
    ".venv/bin/python -m rlshell.train configs/grpo_smollm2_lora.py --dry-run",
    # docs/from_rlinf.md
    ".venv/bin/python -m rlshell.train "
    "tests/fixtures/rlinf/reasoning/config/math/tiny-grpo-fsdp.yaml --dry-run",
}
COVERED_ELSEWHERE = {
    ".venv/bin/python -m rlshell.record configs/ppo_flow_metaworld_reach.py --expert metaworld "
    "--episodes 40 --out runs/demos/reach_train.safetensors": (
        "tests/shell/test_embodied_sft.py::"
        "test_on_metaworld_reach_rl_from_cloned_demonstrations_beats_rl_from_scratch records "
        "16 episodes this way (into a folder of its own)"
    ),
    ".venv/bin/python -m rlshell.record configs/ppo_flow_metaworld_reach.py --expert metaworld "
    "--episodes 8 --seed 1 --out runs/demos/reach_val.safetensors": (
        "the same test records its 4 held-out episodes with --seed 1"
    ),
    ".venv/bin/python -m rlshell.train configs/sft_flow_metaworld_reach.py": (
        "the same test runs it for 150 steps on its recordings; benchmarks/sft_then_rl.py "
        "runs it at full size (docs/benchmarks.md)"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_flow_metaworld_reach.py "
    "actor.model.checkpoint=runs/sft_flow_metaworld_reach/checkpoints/global_step_300": (
        "the same test starts it from its sft checkpoint for 8 updates; "
        "benchmarks/sft_then_rl.py runs 200 (docs/benchmarks.md)"
    ),
    ".venv/bin/python -m rlshell.signing keygen ~/.rlstack-signing-key": (
        "tests/shell/test_signing.py::test_keygen_writes_a_private_key_and_never_overwrites_one "
        "runs it with a key path of its own (not the user's home)"
    ),
    "export RLSHELL_SIGNING_KEY=~/.rlstack-signing-key": (
        "tests/shell/test_signing.py sets the variable for saves, loads and runs"
    ),
    ".venv/bin/python -m rlshell.checkpoint verify outputs/grpo/checkpoints/global_step_10": (
        "tests/shell/test_signing.py::test_verify_names_the_checkpoint_and_the_reason runs it "
        "on a checkpoint of its own, with and without the key"
    ),
    "RLSHELL_EXT_MODULE=recording_engine PYTHONPATH=examples .venv/bin/python -m rlshell.train "
    "configs/grpo.py rollout.backend=recording_hf rollout.engine_options.record_path="
    "/tmp/calls.jsonl": (
        "tests/shell/test_engine_plugins.py::"
        "test_an_engine_from_an_extension_module_runs_the_reasoning_runner runs it for 2 steps "
        "(smaller batches) and reads the record"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_smollm2_lora.py": (
        "its dry run is run here; tests/shell/test_real_model.py's LoRA test trains LoRA "
        "adapters on every linear layer of the same model for 2 steps (vLLM sampling, the "
        "merged weights synced, the export merged); the 20-step runs are docs/real_model.md's"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_smollm2.py": (
        "tests/shell/test_real_model.py runs it for 2 steps of 4 samples (vLLM sampling, the "
        "update, an evaluation, a checkpoint and the export); the hour's run is "
        "docs/real_model.md's"
    ),
    ".venv/bin/python -m rlshell.gguf convert path/to/model.gguf --repo-id me/my-model": (
        "tests/shell/test_gguf.py::test_any_gguf_file_converts_with_the_documented_command "
        "converts a real GGUF file (SmolLM2's, cut to one layer) this way, then verifies it"
    ),
    ".venv/bin/python -m rlshell.gguf verify me/my-model": (
        "tests/shell/test_gguf.py::test_any_gguf_file_converts_with_the_documented_command"
    ),
    ".venv/bin/python -m rlshell.evaluate HuggingFaceTB/SmolLM2-135M-Instruct --config "
    "configs/grpo_smollm2.py --samples 8": (
        "tests/shell/test_gguf.py::test_the_base_model_evaluation_runs_on_the_real_model runs "
        "it on 4 held-out prompts with 2 samples each (the full one takes ~10 min)"
    ),
    ".venv/bin/python -m rlshell.train configs/sft_tool_calls.py": (
        "tests/shell/test_agent_run.py runs it (4 steps) and starts the RL run from its checkpoint"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_tool_agent.py": (
        "tests/shell/test_agent_run.py runs it from the SFT checkpoint (3 steps, asynchronous, "
        "resumed mid multi-turn batch)"
    ),
    ".venv/bin/python -m rlshell.evaluate runs/grpo_tool_agent/checkpoints/global_step_100 "
    "--no-tools": (
        "tests/shell/test_agent_run.py evaluates its RL run's checkpoint with and without "
        "--no-tools"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_cartpole.py cluster.component_placement="
    """'{"actor": "0:0", "rollout": "0:0", "env": "0:0"}' rollout.pipeline_stage_num=2 """
    "runner.mode=async": (
        "tests/shell/test_config_reads.py runs it for 2 steps (its 'ppo_pipelined' run) and "
        "checks the lag of each step's window"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_async.py": (
        "tests/shell/test_async_run.py runs it (3 steps against the synchronous runner; 6 "
        "steps with a rollout worker killed, resumed twice); the full run's figures are "
        "benchmarks/async_runner.py's"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_async.py rollout.partial_rollouts=true": (
        "tests/shell/test_async_run.py::"
        "test_partial_rollouts_switch_weights_mid_request_and_at_bound_0_are_the_synchronous_run "
        "trains this config's trainer with partial rollouts (3 steps, then a request "
        "interrupted by new weights); benchmarks/async_runner.py --partial runs it in full"
    ),
    ".venv/bin/python benchmarks/async_runner.py --quick": (
        "tests/test_benchmarks_smoke.py::test_async_runner_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_cartpole.py": (
        "tests/shell/test_embodied_run.py runs it for 4 steps and resumes it"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_cartpole.py actor.compile=true "
    "rollout.compile=true": (
        "tests/shell/test_embodied_run.py::"
        "test_a_short_ppo_run_logs_env_and_train_metrics_and_resumes resumes a 4-step run "
        "with both for 2 steps"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_cartpole.py algorithm.adv_type=grpo "
    "algorithm.group_size=4 algorithm.gamma=1 algorithm.lam=1 algorithm.vf_coef=0.5 "
    "runner.rollout_steps=500 runner.max_steps=40 runner.experiment_name=grpo_cartpole": (
        "tests/shell/test_embodied_grpo.py::test_the_runner_trains_embodied_grpo_from_the_cli "
        "runs it for 3 steps"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_cartpole.py cluster.component_placement="
    """'{"actor": "0:0", "rollout": "0:0", "env": "0:0"}' rollout.pipeline_stage_num=2""": (
        "tests/shell/test_embodied_pipeline.py::"
        "test_a_hybrid_cartpole_run_in_two_stages_logs_overlap_metrics_and_resumes runs it for "
        "2 steps (16-step windows) and resumes it for a third"
    ),
    ".venv/bin/python -m rlshell.train configs/sac_pendulum.py": (
        "tests/shell/test_sac_run.py runs it for 6 steps and resumes it with its replay buffer"
    ),
    ".venv/bin/python -m rlshell.train configs/sac_fetchreach.py": (
        "tests/shell/test_sac_run.py::test_a_short_fetchreach_run_reports_success_from_mujoco"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_halfcheetah.py": (
        "tests/shell/test_embodied_run.py::"
        "test_a_short_halfcheetah_run_normalises_and_resumes_its_reward_scaler"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_pushcube.py --dry-run": (
        "tests/shell/test_embodied_run.py::"
        "test_the_gpu_pushcube_config_plans_here_and_a_real_run_names_what_is_missing"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_pushcube_cpu.py": (
        "tests/shell/test_maniskill.py::"
        "test_a_short_ppo_run_on_pushcube_trains_and_evaluates_with_a_gif (2 steps; the full run "
        "takes half an hour)"
    ),
    ".venv/bin/python -m rlshell.evaluate "
    "runs/ppo_pushcube_cpu/checkpoints/global_step_1500 --episodes 50": (
        "tests/shell/test_maniskill.py::"
        "test_a_short_ppo_run_on_pushcube_trains_and_evaluates_with_a_gif (on its 2-step run)"
    ),
    ".venv/bin/python -m rlshell.train configs/ppo_pushcube_rgb_cpu.py": (
        "tests/shell/test_maniskill.py::test_the_camera_config_trains_a_step (1 step)"
    ),
    ".venv/bin/python -m rlshell.evaluate runs/ppo_cartpole/checkpoints/global_step_390": (
        "tests/shell/test_embodied_evaluate.py runs it on a 2-step run's checkpoint "
        "(the 390-step run takes minutes)"
    ),
    ".venv/bin/python -m rlshell.export runs/grpo/checkpoints/global_step_1500 "
    "runs/grpo/exported": (
        "tests/shell/test_export.py::"
        "test_a_reasoning_checkpoint_exports_a_hugging_face_model_and_tokenizer runs it on a "
        "checkpoint of configs/grpo.py's model (the run takes minutes)"
    ),
    ".venv/bin/python -m rlshell.export runs/ppo_cartpole/checkpoints/global_step_390 "
    "runs/ppo_cartpole/exported": (
        "tests/shell/test_export.py::test_an_mlp_policy_exports_its_weights_and_model_config "
        "exports a checkpoint of configs/ppo_cartpole.py's policy"
    ),
    "PYTHONPATH=examples/extension RLSHELL_EXT_MODULE=rlshell_example_ext .venv/bin/python -m "
    "rlshell.export runs/bandit/checkpoints/global_step_3 runs/bandit/exported": (
        "tests/shell/test_export.py::"
        "test_an_extensions_model_is_exported_and_loaded_back_as_its_own_class runs it on a "
        "checkpoint of the extension's bandit_mlp"
    ),
    ".venv/bin/python -m rlshell.export backup/global_step_390 exported "
    "--config runs/ppo_cartpole/config.json": (
        "tests/shell/test_export.py::test_a_checkpoint_away_from_its_run_config_needs_config "
        "runs it (through rlshell.export.main) on a copied checkpoint"
    ),
    EXAMPLE_COMMAND: "test_custom_estimator_example_runs_and_prints_what_core_md_shows",
    ".venv/bin/python examples/python_api.py": (
        "tests/test_python_api_example.py::"
        "test_the_example_trains_evaluates_exports_and_loads_back_with_its_own_reward"
    ),
    "PYTHONPATH=examples/custom_policy RLSHELL_EXT_MODULE=rlshell_point_reach .venv/bin/python "
    "-m rlshell.train examples/custom_policy/config.py": (
        "tests/shell/test_custom_policy.py::"
        "test_ppo_with_the_examples_policy_and_env_learns_in_ray_workers runs it for 12 steps"
    ),
    "make test": "the CI entry point .ci/run; this test is part of it",
    ".venv/bin/python -m pytest -q -p no:cacheprovider tests/peers/test_verl.py": (
        "make test runs tests/peers/test_verl.py with the rest of the suite"
    ),
    ".venv/bin/python examples/custom_trainer/grpo_arithmetic.py --steps 2000": (
        "tests/shell/test_reasoning_parts.py::test_the_custom_trainer_example_trains_and_evaluates"
        " runs it for 3 steps"
    ),
    "make install": "the CI entry point .ci/run (make test installs from nothing first)",
    ".venv/bin/python -m rlshell.train configs/grpo.py": (
        "tests/shell/test_reasoning_run.py runs it shortened (runner.max_steps=6, small "
        "batches); the full run takes minutes and its figures are in docs/quickstart.md"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_vllm.py": (
        "tests/shell/test_vllm_run.py::"
        "test_the_engine_killed_mid_generation_is_named_and_resume_auto_continues runs it for "
        "4 steps (disaggregated, evaluations at 0, 2, 4) and resumes it; the full run's figures "
        "are in docs/rollout.md"
    ),
    ".venv/bin/python -m rlshell.train configs/sft_arithmetic.py": (
        "tests/shell/test_config_reads.py runs it for 2 steps through the command line (its actor "
        "on Megatron, tensor parallel 2) and checks its losses and export; "
        "tests/shell/test_sft.py trains its trainer on two FSDP ranks (4 steps on small "
        "demonstrations, resumed, exported); the full run's figures are in docs/agents.md"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo.py "
    "actor.model.checkpoint=runs/sft_arithmetic/checkpoints/global_step_300": (
        "tests/shell/test_sft.py::test_a_reasoning_run_starts_from_the_sft_checkpoint builds this "
        "run's tokenizer, actor, rollout engine and reference from an sft run's checkpoint; "
        "test_a_missing_or_empty_start_checkpoint_is_refused_before_ray_starts runs it with a "
        "missing one; the full run's figures are in docs/agents.md"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_lora.py": (
        "tests/shell/test_config_reads.py runs it for 2 steps (disaggregated, with a KL term); "
        "the full run's figures are in docs/reasoning.md#lora"
    ),
    ".venv/bin/python -m rlshell.train configs/grpo_megatron.py": (
        "tests/shell/test_config_reads.py runs it for 2 steps (tensor parallel 2) and "
        "tests/shell/test_megatron_run.py::test_a_pipeline_parallel_run_resumes_and_exports runs "
        "it on two pipeline stages, resumes and exports it; the full run's figures are in "
        "docs/megatron.md"
    ),
    ".venv/bin/python benchmarks/actor_backends.py --quick": (
        "tests/test_benchmarks_smoke.py::test_actor_backends_quick_run_prints_the_expected_json"
    ),
    "make bench": "minutes of benchmarks; their --quick forms below are run by tests",
    ".venv/bin/python benchmarks/soak.py --steps 500 --eval-interval 250 "
    "--checkpoint-interval 25 --kill-every 30 --minutes 10": (
        "minutes by design (two quickstart runs, one killed every 30 s), so not in CI; run by "
        "hand for the figures docs/reliability.md gives, its pieces (kills, resume=auto, "
        "metrics without a gap) tested by tests/shell/test_multinode.py and "
        "test_reasoning_run.py"
    ),
    ".venv/bin/python benchmarks/driver_share.py": (
        "over a minute on two CPUs (two pipelined trainers launched), run by hand for the figures "
        "docs/benchmarks.md gives; the two routes it compares are tested by "
        "tests/shell/test_channel.py::"
        "test_the_pipeline_sends_through_the_channel_the_windows_it_handed_the_driver and "
        "tests/shell/test_embodied_pipeline.py's hybrid run"
    ),
    ".venv/bin/python benchmarks/packing.py --quick": (
        "tests/test_benchmarks_smoke.py::test_packing_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python benchmarks/core_advantages.py --quick": (
        "tests/test_benchmarks_smoke.py::test_core_advantages_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python benchmarks/grpo_step.py --quick": (
        "tests/test_benchmarks_smoke.py::test_grpo_step_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python benchmarks/grpo_compute.py --quick": (
        "tests/test_benchmarks_smoke.py::test_grpo_compute_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python benchmarks/shell_workers.py --quick": (
        "tests/test_benchmarks_smoke.py::test_shell_workers_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python benchmarks/core_logprobs.py --quick": (
        "tests/test_benchmarks_smoke.py::test_core_logprobs_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python benchmarks/rollout_engines.py --quick": (
        "tests/test_benchmarks_smoke.py::test_rollout_engines_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python benchmarks/core_jax.py --quick": (
        "tests/test_benchmarks_smoke.py::test_core_jax_quick_run_prints_the_expected_json"
    ),
    ".venv/bin/python examples/jax_ppo_cartpole.py --seed 0": (
        "tests/test_jax_example.py::test_the_quick_run_learns_and_prints_its_summary runs its "
        "--quick form (4,096 env steps); the full run is a measurement, its figures in docs/jax.md"
    ),
    # docs/from_rlinf.md
    ".venv/bin/python -m rlshell.config.convert "
    "tests/fixtures/rlinf/embodiment/config/maniskill_ppo_mlp.yaml > configs/mine.py": (
        "tests/shell/test_rlinf_yaml.py::test_the_convert_command_prints_the_module_and_applies_"
        "overrides runs the command's main on this fixture, its output to a temporary file (not "
        "configs/), and reads that back to the YAML's Config"
    ),
    "RLINF_EXT_MODULE=rlshell_example_ext PYTHONPATH=examples/extension .venv/bin/python -m "
    "rlshell.train configs/grpo.py --dry-run reward.reward_type=contains_answer": (
        "tests/shell/test_rlinf_yaml.py::test_rlinf_ext_module_registers_for_the_train_command "
        "runs it, its output directory a temporary folder"
    ),
}


class Block(NamedTuple):
    language: str
    code: str
    line: int  # 1-based line of the opening fence
    output: str | None  # the ```text block that follows, if any


def read_blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    fenced: list[tuple[str, str, int, int]] = []  # language, body, open line, close line
    index = 0
    while index < len(lines):
        match = re.fullmatch(r"```(\w*)\s*", lines[index])
        if match is None:
            index += 1
            continue
        start = index
        index += 1
        while index < len(lines) and lines[index].rstrip() != "```":
            index += 1
        if index == len(lines):
            raise AssertionError(f"{page.name}:{start + 1}: code block is never closed")
        fenced.append((match[1], "\n".join(lines[start + 1 : index]) + "\n", start, index))
        index += 1
    blocks: list[Block] = []
    for position, (language, body, start, end) in enumerate(fenced):
        if language == "text":
            continue
        output = None
        if position + 1 < len(fenced):
            next_language, next_body, next_start, _ = fenced[position + 1]
            between = lines[end + 1 : next_start]
            if next_language == "text" and all(not line.strip() for line in between):
                output = next_body
        blocks.append(Block(language, body, start + 1, output))
    return blocks


def shell_commands(block: Block) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    commands: list[str] = []
    pending = ""
    for raw in block.code.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        commands.append(pending + line)
        pending = ""
    return commands


def normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def with_this_venv(command: str) -> str:
    """Point `.venv/bin/` at the interpreter running the tests (same thing under `make test`)."""
    return command.replace(".venv/bin/", f"{BIN}/")


def test_custom_estimator_example_runs_and_prints_what_core_md_shows() -> None:
    shown = [
        block.output
        for block in read_blocks(DOCS / "core.md")
        if block.language == "bash" and shell_commands(block) == [EXAMPLE_COMMAND]
    ]
    assert len(shown) == 1, "core.md must show the example's command once"
    assert shown[0] is not None, "core.md must show the example's output after its command"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert normalise(result.stdout) == normalise(shown[0])


# Runs in a child interpreter: executes each block, records its stdout or its traceback.
_RUNNER = textwrap.dedent(
    """
    import contextlib, io, json, sys, traceback
    blocks = json.load(sys.stdin)
    namespace = {"__name__": "__main__"}
    results = []
    for block in blocks:
        buffer = io.StringIO()
        error = None
        try:
            with contextlib.redirect_stdout(buffer):
                exec(compile(block["code"], block["where"], "exec"), namespace)
        except BaseException:
            error = traceback.format_exc()
        results.append({"stdout": buffer.getvalue(), "error": error})
        if error is not None:
            break
    sys.__stdout__.write(json.dumps(results))
    """
)


def test_the_reference_pages_exist_and_have_examples() -> None:
    assert DOCS / "index.md" in PAGES
    assert any(block.language == "python" for block in read_blocks(DOCS / "core.md"))


@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(block.language == "python" for block in read_blocks(page))],
    ids=lambda page: str(page.relative_to(DOCS)),
)
def test_python_snippets_run_and_print_what_the_page_shows(page: Path) -> None:
    blocks = [block for block in read_blocks(page) if block.language == "python"]
    payload = [
        {"code": block.code, "where": f"{page.relative_to(ROOT)}:{block.line}"} for block in blocks
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("RLCORE_TYPECHECK", None)
    # Forked from the warm interpreter (tests/launcher.py: hash seed 0 included), and a run a
    # page starts joins this process's Ray cluster.
    result = launcher.run(
        [sys.executable, "-c", _RUNNER], input=json.dumps(payload), env=env, timeout=240
    )
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    for block, outcome in zip(blocks, results, strict=False):
        where = f"{page.relative_to(ROOT)}:{block.line}"
        assert outcome["error"] is None, f"the python block at {where} failed:\n{outcome['error']}"
        if block.output is not None:
            assert normalise(outcome["stdout"]) == normalise(block.output), (
                f"the python block at {where} printed\n{outcome['stdout']}\n"
                f"but the page shows\n{block.output}"
            )
    assert len(results) == len(blocks)


def test_every_shell_command_is_run_or_covered_elsewhere() -> None:
    shown = {
        command
        for page in PAGES
        for block in read_blocks(page)
        if block.language in ("bash", "sh", "shell", "console")
        for command in shell_commands(block)
    }
    unaccounted = shown - RUN_HERE - set(COVERED_ELSEWHERE)
    assert not unaccounted, f"shell commands in the docs that no test runs: {sorted(unaccounted)}"
    stale = (RUN_HERE | set(COVERED_ELSEWHERE)) - shown
    assert not stale, f"commands listed here that no page shows any more: {sorted(stale)}"


def _shell_blocks_to_run() -> list[tuple[str, str | None]]:
    runs: list[tuple[str, str | None]] = []
    for page in PAGES:
        for block in read_blocks(page):
            if block.language not in ("bash", "sh", "shell", "console"):
                continue
            commands = [c for c in shell_commands(block) if c in RUN_HERE]
            for command in commands:
                runs.append((command, block.output if len(commands) == 1 else None))
    return runs


# A plain ``python -m rlshell.train`` command (no shell syntax, no environment of its own) is
# run by `rlshell.train.main` in one interpreter shared by all of them: they differ only in
# their arguments, and each would otherwise pay the interpreter's start-up and imports again.
TRAIN = ".venv/bin/python -m rlshell.train "
SHELL_SYNTAX = re.compile(r"&&|\|\||[|<>;`]|\$\(")

_MAIN_RUNNER = textwrap.dedent(
    """
    import contextlib, io, json, shlex, sys, traceback
    from rlshell.train import main
    results = []
    for arguments in json.load(sys.stdin):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(shlex.split(arguments))
            except SystemExit as exit:  # argparse's --help and usage errors
                status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
            except BaseException:
                traceback.print_exc()
                status = 1
        results.append({"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()})
    sys.__stdout__.write(json.dumps(results))
    """
)


def in_one_interpreter(command: str) -> bool:
    return command.startswith(TRAIN) and SHELL_SYNTAX.search(command) is None


@pytest.fixture(scope="module")
def train_commands() -> dict[str, subprocess.CompletedProcess[str]]:
    """Every plain ``rlshell.train`` command the docs run, run one after another by
    `rlshell.train.main` in one fresh interpreter: its status, stdout and stderr."""
    commands = sorted(
        {command for command, _ in _shell_blocks_to_run() if in_one_interpreter(command)}
    )
    result = subprocess.run(
        [sys.executable, "-c", _MAIN_RUNNER],
        input=json.dumps([command.removeprefix(TRAIN) for command in commands]),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return {
        command: subprocess.CompletedProcess(command, run["status"], run["stdout"], run["stderr"])
        for command, run in zip(commands, json.loads(result.stdout), strict=True)
    }


def test_the_shared_interpreter_takes_only_plain_train_commands() -> None:
    assert in_one_interpreter(f"{TRAIN}configs/grpo.py --dry-run actor.optim.lr=1e-4")
    assert in_one_interpreter(f"""{TRAIN}configs/grpo.py --dry-run a='{{"b": "0:0"}}'""")
    for other in (
        f"{TRAIN}configs/grpo.py --dry-run && {TRAIN}--config x.json --dry-run",
        f"{TRAIN}configs/ppo_cartpole.py > /dev/null",
        f"{TRAIN}configs/grpo.py | grep x",
        f"X=1 {TRAIN}configs/grpo.py --dry-run",
        ".venv/bin/python -m rlshell.envs.vulkan status",
    ):
        assert not in_one_interpreter(other), other


# One worker runs them all, so the shared interpreter starts once (--dist loadgroup).
@pytest.mark.xdist_group("docs_shell_commands")
@pytest.mark.parametrize(("command", "output"), _shell_blocks_to_run())
def test_shell_commands_shown_in_the_docs_succeed(
    command: str, output: str | None, request: pytest.FixtureRequest
) -> None:
    if in_one_interpreter(command):
        result = request.getfixturevalue("train_commands")[command]
    else:
        result = subprocess.run(
            ["bash", "-c", with_this_venv(command)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    if output is not None:
        assert normalise(result.stdout) == normalise(output), result.stdout


# Every public function of these modules must appear in docs/core.md with its
# current signature: parameter names in order, and the defaults it shows.
DOCUMENTED_MODULES = [
    "rlcore.masked",
    "rlcore.advantages",
    "rlcore.losses",
    "rlcore.mismatch",
    "rlcore.logprobs",
    "rlcore.distributions",
    "rlcore.tokens",
    "rlcore.shaping",
    "rlcore.packing",
    "rlcore.batching",
    "rlcore.normalize",
    "rlcore.testing",
]


def _public_functions() -> list[tuple[str, Any]]:
    found = []
    for module_name in DOCUMENTED_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            item = getattr(module, name)
            if inspect.isfunction(item):
                found.append((f"{module_name}.{name}", item))
    return found


def _shown_calls(text: str, name: str) -> list[ast.Call]:
    calls = []
    for match in re.finditer(rf"(?<!\w){re.escape(name)}\(", text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        source = re.sub(r"\s+", " ", text[match.start() : end + 1])
        try:
            node = ast.parse(source, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call):
            calls.append(node)
    return calls


def _default_matches(shown: ast.expr, default: Any) -> bool:
    try:
        return bool(ast.literal_eval(shown) == default)
    except ValueError:
        return ast.unparse(shown) in {repr(default), str(default).removeprefix("torch.")}


def _is_signature_of(call: ast.Call, parameters: list[inspect.Parameter]) -> bool:
    if not all(isinstance(arg, ast.Name) for arg in call.args):
        return False
    shown = [arg.id for arg in call.args if isinstance(arg, ast.Name)]
    shown += [keyword.arg for keyword in call.keywords if keyword.arg is not None]
    if shown != [parameter.name for parameter in parameters]:
        return False
    by_name = {parameter.name: parameter for parameter in parameters}
    for arg in call.args:
        if isinstance(arg, ast.Name) and by_name[arg.id].default is not inspect.Parameter.empty:
            return False
    return all(
        keyword.arg is not None and _default_matches(keyword.value, by_name[keyword.arg].default)
        for keyword in call.keywords
    )


@pytest.mark.parametrize(
    ("qualified", "function"), _public_functions(), ids=[q for q, _ in _public_functions()]
)
def test_core_md_shows_the_current_signature_of_every_public_function(
    qualified: str, function: Any
) -> None:
    text = (DOCS / "core.md").read_text(encoding="utf-8")
    parameters = list(inspect.signature(function).parameters.values())
    name = qualified.rsplit(".", 1)[1]
    calls = _shown_calls(text, name)
    assert calls, f"docs/core.md never mentions {qualified}"
    expected = ", ".join(str(parameter) for parameter in parameters)
    assert any(_is_signature_of(call, parameters) for call in calls), (
        f"docs/core.md shows no signature of {qualified} matching the source: {name}({expected})"
    )


# ----------------------------------------------------------------- quoted figures

BENCHMARKS = DOCS / "benchmarks.md"
QUOTING_PAGES = (ROOT / "README.md", DOCS / "quickstart.md")
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# A measured claim: a duration, a ratio, a percentage, a rate, or a decimal below one
# (an accuracy or a reward). Counts of things ("16 prompts", "75k parameters") are
# config facts, not measurements, and are not matched.
FIGURE = re.compile(
    rf"""(?x)
      {_NUMBER}\s?min\s\d+\s?s\b
    | {_NUMBER}(?:\s?[–-]\s?{_NUMBER})?\s?(?:ms|s|min|minutes|seconds|hours)\b(?!/)
    | {_NUMBER}(?:[–-]{_NUMBER})?×
    | {_NUMBER}(?:[–-]{_NUMBER})?\s?%
    | {_NUMBER}\s(?:tokens|steps|env\ssteps)/s
    | \b0\.\d+\b
    """
)
# A figure spelt in words cannot be checked against a record: write it in digits.
# ("a second" is also an ordinal: "a second run" is not a duration.)
SPELT_FIGURE = re.compile(
    r"(?i)\b(?:(?:one|two|three|four|five|six|seven|eight|nine|ten|twenty|thirty)"
    r"\s(?:minutes?|seconds?|hours?)|(?:an?|a\squarter\sof\san?|half\san?)\s(?:minute|hour)s?)\b"
)


def _prose(text: str) -> str:
    """``text`` without code blocks and inline code (commands and outputs are not claims)."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))


def quoted_figures(text: str) -> list[str]:
    return [match.group(0) for match in FIGURE.finditer(_prose(text))]


def test_the_figure_pattern_finds_claims_and_leaves_counts() -> None:
    text = (
        "It took 2 min 34 s (9.4 s to start), 0.32–0.39× SB3's time, 23–27× faster, "
        "75% accuracy, 15,360 tokens/s and 0.785 at step 1,000, with 16 prompts of "
        "`runner.max_steps=3` and 75k parameters.\n```text\nup in 1.5 s\n```"
    )
    assert quoted_figures(text) == [
        "2 min 34 s",
        "9.4 s",
        "0.32–0.39×",
        "23–27×",
        "75%",
        "15,360 tokens/s",
        "0.785",
    ]
    assert SPELT_FIGURE.search("in about a quarter of an hour")
    assert SPELT_FIGURE.search("in about three minutes")
    assert SPELT_FIGURE.search("about a minute")
    assert not SPELT_FIGURE.search("three prompts, a minimal run of one step, a second run")


@pytest.mark.parametrize("page", QUOTING_PAGES, ids=lambda path: path.name)
def test_quoted_figures_are_the_ones_benchmarks_md_records(page: Path) -> None:
    """One source for each number: a timing, ratio or accuracy that the README or the
    quickstart states is written in docs/benchmarks.md, where its measurement is."""
    record = BENCHMARKS.read_text(encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    unrecorded = sorted({figure for figure in quoted_figures(text) if figure not in record})
    assert not unrecorded, (
        f"{page.name} states figures docs/benchmarks.md does not record: {unrecorded}; "
        "measure them there (the Headline figures table) and quote them from it"
    )
    spelt = [match.group(0) for match in SPELT_FIGURE.finditer(_prose(text))]
    assert not spelt, f"{page.name} spells figures in words (write the measured figure): {spelt}"
