"""configs/grpo_megatron.py through ``python -m rlshell.train``, on two pipeline stages.

A short run (Megatron's 1F1B schedule in Ray actor workers, HF rollout engines
synced from the stages' weights gathered back to Hugging Face names) leaves
checkpoints; ``checkpoint.resume=auto`` continues it without a gap or a
repeated step; ``python -m rlshell.export`` writes a Hugging Face directory that
transformers loads, with the checkpoint's weights. (configs/grpo_megatron.py
itself, at tensor parallel 2, runs two steps in tests/shell/test_config_reads.py.)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (the megatron extra)")

from rlshell.metrics import read_metrics
from tests import launcher
from tests.shell.test_run import cli_env, train

pytestmark = pytest.mark.slow

ARGS = [
    "configs/grpo_megatron.py",
    "actor.megatron.tensor_model_parallel_size=1",
    "actor.megatron.pipeline_model_parallel_size=2",
    "actor.micro_batch_max_tokens=128",  # several micro-batches in the pipeline
    "runner.prompts_per_step=4",
    "runner.eval_interval=2",
    "data.num_val=8",
    "checkpoint.interval=1",
    "checkpoint.keep_last=null",
]


def test_a_pipeline_parallel_run_resumes_and_exports(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlshell.export import load_policy

    env = cli_env(Path(tempfile.mkdtemp(prefix="mg", dir="/tmp")))
    out = f"runner.output_dir={tmp_path}"
    first = train(*ARGS, "runner.max_steps=2", out, env=env, timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    resumed = train(
        *ARGS, "runner.max_steps=3", out, "checkpoint.resume=auto", env=env, timeout=400
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    run = tmp_path / "grpo_megatron"
    records = read_metrics(run / "metrics.jsonl")
    assert [int(r["step"]) for r in records] == [0, 1, 2, 3]
    steps = [r for r in records if "train/loss" in r]
    assert all(r["train/micro_batches"] >= 2 for r in steps)  # the schedule had a pipeline
    assert all("train/grad_norm" in r and "time/update" in r for r in steps)
    assert "Apex is not installed" not in first.stderr  # Megatron's notices are filtered

    checkpoint = run / "checkpoints" / "global_step_3"
    exported = tmp_path / "exported"
    result = launcher.run(
        [sys.executable, "-m", "rlshell.export", str(checkpoint), str(exported)],
        env=dict(os.environ),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True)
    saved = load_policy(checkpoint).model
    ids = torch.tensor([[5, 14, 6, 14, 7, 15]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, saved(ids).logits)
    # The end-of-run export (checkpoint.export_hf) is that same policy.
    final = AutoModelForCausalLM.from_pretrained(run / "hf_model", local_files_only=True)
    with torch.no_grad():
        assert torch.equal(final(ids).logits, model(ids).logits)
