"""`python -m rlshell.train`: dry runs, errors before anything starts, --help, extension modules.

Commands that stop before Ray starts run through ``main`` in this process (`train_here`, with
Ray forbidden to start); the exit status and output of the command itself, usage errors and
extension modules (imported once per process) in a fresh interpreter (`train`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlshell.cluster.placement import Mode, read_plan
from rlshell.runners.validation import load_config
from tests import launcher
from tests.shell.conftest import TrainHere

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_EXT = ROOT / "examples" / "extension"


def train(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "RLSHELL_EXT_MODULE"}
    environment.update(env or {})
    # Forked from the warm interpreter (tests/launcher.py); a Ray of its own if it gets there.
    return launcher.run(
        [sys.executable, "-m", "rlshell.train", *args],
        cwd=cwd,
        env=environment,
        timeout=timeout,
        shared_ray=False,
    )


def test_dry_run_prints_the_plan_and_writes_config_and_placement_aside(
    tmp_path: Path, train_here: TrainHere
) -> None:
    result = train_here("configs/grpo.py", "--dry-run", f"runner.output_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "dry run of configs/grpo.py: nothing was started"
    assert lines[1].startswith("cluster: 1 CPU-only node")
    assert "mode: collocated" in lines[1]
    assert any(line.split()[:2] == ["actor", "0-1"] for line in lines)
    plan_dir = tmp_path / "grpo" / "dry_run"
    assert lines[-2:] == [
        f"config:    {plan_dir / 'config.json'}",
        f"placement: {plan_dir / 'placement.json'}",
    ]
    assert sorted(p.name for p in (tmp_path / "grpo").iterdir()) == ["dry_run"]
    plan = read_plan(plan_dir / "placement.json")
    assert [c.name for c in plan.components] == ["actor", "rollout", "reward"]
    assert plan.component("actor").world_size == 2
    assert load_config(plan_dir / "config.json") == load_config(
        ROOT / "configs" / "grpo.py", [f"runner.output_dir={tmp_path}"]
    )


def test_dry_run_on_a_simulated_4x8_cluster(tmp_path: Path, train_here: TrainHere) -> None:
    result = train_here(
        "configs/grpo.py",
        "--dry-run",
        "cluster.simulate=4x8",
        "rollout.backend=vllm",
        "rollout.tensor_parallel_size=4",
        'cluster.component_placement={"actor": "all", "rollout": "16-31", "reward": "0-3"}',
        f"runner.output_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr
    assert "4 nodes × 8 GPUs" in result.stdout
    plan = read_plan(tmp_path / "grpo" / "dry_run" / "placement.json")
    assert plan.mode is Mode.HYBRID
    assert plan.component("actor").world_size == 32
    rollout = plan.component("rollout")
    assert [w.gpus for w in rollout.workers] == [(0, 1, 2, 3), (4, 5, 6, 7)] * 2
    assert [w.node_rank for w in rollout.workers] == [2, 2, 3, 3]
    assert [w.node_rank for w in plan.component("reward").workers] == [0, 1, 2, 3]


def test_resolved_config_json_runs_again_with_overrides(
    tmp_path: Path, train_here: TrainHere
) -> None:
    first = train_here("configs/grpo.py", "--dry-run", f"runner.output_dir={tmp_path}")
    assert first.returncode == 0, first.stderr
    saved = tmp_path / "grpo" / "dry_run" / "config.json"
    again = train_here(
        "--config", str(saved), "--dry-run", "runner.experiment_name=again", "actor.optim.lr=1e-4"
    )
    assert again.returncode == 0, again.stderr
    resumed = json.loads((tmp_path / "again" / "dry_run" / "config.json").read_text())
    assert resumed["actor"]["optim"]["lr"] == 1e-4
    assert resumed["actor"]["model"] == json.loads(saved.read_text())["actor"]["model"]


def test_every_config_error_is_reported_before_anything_starts(tmp_path: Path) -> None:
    result = train(
        "configs/grpo.py",
        "runner.runner_type=probe",
        "actor.optim.lrr=1e-3",
        "actor.optim.lr=-0.1",
        "algorithm.group_size=1",
        f"data.train_path={tmp_path / 'missing.jsonl'}",
        f"runner.output_dir={tmp_path}",
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "error: configs/grpo.py: 4 problems in the config:",
        "  - unknown key 'actor.optim.lrr' (did you mean 'actor.optim.lr'?)",
        "  - actor.optim.lr: expected a positive number, got -0.1",
        "  - algorithm.group_size: grpo compares the samples of one prompt, so it needs at "
        "least 2 per prompt, got 1",
        f"  - data.train_path: {tmp_path / 'missing.jsonl'} does not exist",
    ]
    assert not (tmp_path / "grpo").exists(), "nothing may be written for an invalid config"


def test_a_missing_config_file_and_two_config_files_are_errors(tmp_path: Path) -> None:
    missing = train(str(tmp_path / "nope.py"), "--dry-run")
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr
    two = train("configs/grpo.py", "configs/grpo.py", "--dry-run")
    assert two.returncode == 2
    assert "expected one config file, got 2" in two.stderr


def test_a_dry_run_leaves_a_finished_runs_config_and_placement_as_they_were(
    tmp_path: Path, train_here: TrainHere
) -> None:
    run_dir = tmp_path / "grpo"
    checkpoint = run_dir / "checkpoints" / "global_step_2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"step": 2, "experiment_name": "grpo"}')
    (run_dir / "config.json").write_text('{"the run\'s": "own"}\n')
    (run_dir / "placement.json").write_text('{"its": "plan"}\n')
    before = {name: (run_dir / name).read_bytes() for name in ("config.json", "placement.json")}
    result = train_here(
        "configs/grpo.py", "--dry-run", "runner.max_steps=7", f"runner.output_dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert load_config(run_dir / "dry_run" / "config.json").runner.max_steps == 7
    overwrite = train("configs/grpo.py", "--dry-run", "--overwrite")
    assert overwrite.returncode == 2
    assert "--overwrite: a dry run writes nothing into the run directory" in overwrite.stderr


def test_without_a_config_the_usage_and_the_configs_are_printed_and_nothing_starts(
    tmp_path: Path,
) -> None:
    result = train(cwd=ROOT)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("usage: python -m rlshell.train")
    assert re.search(r"configs/grpo\.py +GRPO on a generated arithmetic task", result.stderr)
    assert result.stderr.rstrip().endswith(
        "error: no config given: name one of the configs above (or a run's config.json with "
        "--config)"
    )
    assert not (ROOT / "runs" / "grpo" / "run.lock").exists()


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        (
            "cluster.simulate=4x9x",
            "  - cluster.simulate: simulated cluster '4x9x': expected NODESxGPUS or "
            "NODESxGPUSxCPUS with at least one node, e.g. '4x8' (4 nodes, 8 GPUs each), "
            "'4x8x64' or '1x0' (one CPU-only node)",
        ),
        (
            'cluster.node_groups={"env": "0-"}',
            "  - cluster.node_groups: node group 'env': bad rank '0-' in '0-'; expected a rank "
            "like '5' or an inclusive range like '0-7'",
        ),
        (
            'cluster.node_groups={"env": "3"}',
            "  - cluster.node_groups: node group 'env': node ranks 3 are beyond the cluster's "
            "1 node (0-0)",
        ),
        ("cluster.node_groups=3", "  - cluster.node_groups: expected JSON for dict, got '3'"),
        (
            'cluster.component_placement={"actor": "0-", "rollout": "0", "reward": "0"}',
            "  - cluster.component_placement: actor: placement '0-': bad rank '0-' in '0-'; "
            "expected a rank like '5' or an inclusive range like '0-7'",
        ),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_malformed_cluster_string_is_a_config_error_naming_its_key(
    tmp_path: Path, override: str, problem: str, dry_run: bool, train_here: TrainHere
) -> None:
    args = ["configs/grpo.py", override, f"runner.output_dir={tmp_path}"]
    result = train_here(*args, *(["--dry-run"] if dry_run else []))
    assert result.returncode == 2, result.stderr
    assert problem in result.stderr.splitlines()[1:]  # (a real run also refuses to simulate)
    assert not (tmp_path / "grpo").exists()


def test_an_attached_clusters_node_groups_are_checked_before_connecting(
    tmp_path: Path, train_here: TrainHere
) -> None:
    result = train_here(
        "configs/grpo.py",
        "cluster.address=auto",
        'cluster.node_groups={"env": "1-x"}',
        f"runner.output_dir={tmp_path}",
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[1:] == [
        "  - cluster.node_groups: node group 'env': bad rank '1-x' in '1-x'; expected a rank "
        "like '5' or an inclusive range like '0-7'"
    ]


def test_a_run_dir_holding_a_run_is_refused_before_ray_starts(
    tmp_path: Path, train_here: TrainHere
) -> None:
    run_dir = tmp_path / "grpo"
    for step in (20, 40):
        checkpoint = run_dir / "checkpoints" / f"global_step_{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text("{}")
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": step, "reward/mean": 0.5}) + "\n" for step in range(44))
    )
    common = ["configs/grpo.py", "runner.runner_type=probe", f"runner.output_dir={tmp_path}"]
    again = train_here(*common)
    assert again.returncode == 2, again.stderr
    assert again.stdout == ""
    assert again.stderr == (
        f"error: {run_dir} already holds a run (checkpoints up to step 40, metrics to step "
        "43): continue it with checkpoint.resume=auto, start over with --overwrite "
        "(overwrite=True in rlshell.api.train), or choose another runner.experiment_name\n"
    )
    both = train_here(*common, "checkpoint.resume=auto", "--overwrite")
    assert both.returncode == 2
    assert "checkpoint.resume=auto continues the run in" in both.stderr
    for name in ("checkpoints/global_step_20", "checkpoints/global_step_40"):
        (run_dir / name).joinpath("trainer_state.json").unlink()
    no_checkpoint = train_here(*common, "checkpoint.resume=auto")
    assert no_checkpoint.returncode == 2
    assert no_checkpoint.stderr == (
        f"error: {run_dir} holds a run (no complete checkpoint, metrics to step 43) but no "
        "complete checkpoint for checkpoint.resume=auto to "
        "continue from; starting afresh would replace its metrics: start over with --overwrite "
        "(overwrite=True in rlshell.api.train), or choose another runner.experiment_name\n"
    )
    assert not (run_dir / "run.lock").exists()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 44


def test_help_lists_the_configs_and_the_top_level_keys() -> None:
    result = train("--help")
    assert result.returncode == 0
    # Names are padded to the longest config's, so match the spacing loosely.
    assert re.search(r"configs/grpo\.py +GRPO on a generated arithmetic task", result.stdout)
    for key in ["cluster", "actor", "rollout", "reward", "algorithm", "runner", "checkpoint"]:
        assert f"\n  {key} " in result.stdout


def test_names_registered_by_an_extension_module_are_accepted(tmp_path: Path) -> None:
    args = ["configs/grpo.py", "--dry-run", "reward.reward_type=contains_answer"]
    args.append(f"runner.output_dir={tmp_path}")
    without = train(*args)
    assert without.returncode == 2
    assert "reward.reward_type: unknown reward type 'contains_answer'" in without.stderr
    env = {"RLSHELL_EXT_MODULE": "rlshell_example_ext", "PYTHONPATH": str(EXAMPLE_EXT)}
    with_ext = train(*args, env=env)
    assert with_ext.returncode == 0, with_ext.stderr


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("no_such_extension", "module 'no_such_extension' could not be imported on the driver"),
        ("json", "module 'json'"),
    ],
)
def test_a_broken_extension_module_fails_fast_naming_it(module: str, message: str) -> None:
    result = train("configs/grpo.py", "--dry-run", env={"RLSHELL_EXT_MODULE": module})
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_a_missing_wandb_stops_the_run_with_status_2_before_ray_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ray_never_starts: None,
) -> None:
    from rlshell.train import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed, even where it is
    config = ROOT / "configs" / "grpo.py"
    status = main(
        [str(config), 'logger.backends=["console","wandb"]', f"runner.output_dir={tmp_path}"]
    )
    assert status == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {config}: 1 problem in the config:",
        "  - logger.backends: 'wandb' needs the wandb package, which is not installed: run "
        "`make install` (or `pip install wandb`), or remove 'wandb' from logger.backends",
    ]
    assert not (tmp_path / "grpo").exists()
