"""examples/python_api.py: the notebook-style tour of rlshell.api runs as a script and says so."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from rlshell.metrics import read_metrics
from tests import launcher

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "python_api.py"


@pytest.mark.slow
def test_the_example_trains_evaluates_exports_and_loads_back_with_its_own_reward(
    tmp_path: Path,
) -> None:
    # Ray's socket paths must stay under 107 characters: a short temp dir of its own.
    ray_tmp = Path(tempfile.mkdtemp(prefix="pa", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLSHELL_EXT_")}
    env.update(RAY_TMPDIR=str(ray_tmp), PYTHONUNBUFFERED="1")
    try:
        # Run from an empty directory: the example needs no file of the repository.
        # Forked from the warm interpreter, on the shared cluster (tests/launcher.py).
        result = launcher.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, timeout=400)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        "close_enough('12', '12') = 1.0",
        "close_enough('9', '12') = 0.7",
        "config: 4 steps of grpo on arithmetic, scored by close_enough",
    ]
    assert "trained 4 steps in runs/python_api" in lines
    assert any(line.startswith("evaluation: eval/accuracy ") for line in lines)
    summary = json.loads(lines[-1])
    assert summary["example"] == "python_api"
    assert summary["final_step"] == 4
    assert summary["checkpoint"] == "runs/python_api/checkpoints/global_step_4"
    assert summary["exported"] == "runs/python_api/exported"
    assert isinstance(summary["completion"], str)
    run = tmp_path / "runs" / "python_api"
    assert (run / "exported" / "config.json").is_file()
    assert (run / "exported" / "model.safetensors").is_file()
    # close_enough scores in tenths; the last step's mean is what train() returned.
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [0, 1, 2, 3, 4]
    assert records[-1]["reward/mean"] == pytest.approx(summary["reward_mean"])
    assert 0.0 <= summary["eval_accuracy"] <= 1.0
