"""One GRPO step, rlstack against TRL's `GRPOTrainer`; weight-sync bytes and time, bucket and patch.

(1) A GRPO step (generation, scoring, one optimizer step) on the same tiny
    Qwen2-style causal LM (built from a `Qwen2Config`, the project's character
    tokenizer), the same prompts of the generated arithmetic task, the same
    group size and completion length, fp32, at two model sizes (~0.5M and ~5M
    parameters):

    - rlstack: `rlshell.runners.reasoning.ReasoningTrainer` with
      ``configs/grpo.py``: two FSDP2 actor ranks (gloo) with the HF rollout
      engine collocated in each (each rank samples half the prompts, with
      ``rollout.weight_sync=shared``: the engine borrows the rank's gathered
      FSDP weights, so there is nothing to sync), the reward in a worker of
      its own;
    - TRL (the baseline): `trl.GRPOTrainer` with ``GRPOConfig(use_cpu=True)``,
      everything in the trainer process (``model.generate``, the reward
      function, the update), ``per_device_train_batch_size`` = prompts ×
      group size, so one optimizer step covers the same completions. TRL's
      defaults ``bf16=True`` and ``gradient_checkpointing=True`` are turned off
      to match rlstack's fp32 without checkpointing.

    Both sides sample exactly ``max_new_tokens`` tokens per completion
    (``min_new_tokens`` = ``max_new_tokens``: TRL's ``generation_kwargs``; on
    rlstack the model's generation config, set through
    ``actor.model.model_kwargs``), and the JSON reports the completion tokens
    each side counted. One torch thread per process. Both trainers live in
    one fresh driver process per size and alternate step by step (a TRL step,
    then the rlstack step on the same prompts), so that load from other
    processes on a shared machine falls on both alike; Ray's workers run at
    nice 0 like the driver (``RAY_worker_niceness=0``; Ray's default is 15,
    which lets any other process starve the ranks). The first step of each
    is a warm-up, not timed; start-up (Ray, worker launch, the first full
    weight sync; the trainer's construction) is reported apart. Target
    (reported, not asserted): rlstack's completion tokens/s ≥ 1.5× TRL's at
    both sizes.

(2) Weight sync (`rlshell.sync.transfer.WeightSender`, in memory) on the
    ~5M model after one AdamW step (lr 1e-6, a random gradient): the bytes of
    a ``bucket`` sync against a ``patch`` sync, with the engine in bf16 (what
    ``rollout.precision="bf16"`` does) and in fp32. Target: patch ≤ 0.1× the
    bucket bytes (bf16). And the time of an fp32 bucket sync against a plain
    ``Tensor.copy_`` of every tensor into the same targets (the bound), the
    targets laid out as a collocated engine lays out its weights
    (`rlshell.sync.codec.FlatBuckets`: the buckets are packed into them).
    Target: bucket time ≤ 1.25× the plain copy (≥ 0.8× its speed).

Prints one JSON object. ``--quick`` is a smoke run (the small model, a small
batch, one timed step each; its figures mean nothing).

    RAY_AUTH_MODE=disabled .venv/bin/python benchmarks/grpo_step.py [--quick]
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
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

# A throwaway local cluster needs no auth token (Ray would write one under ~/.ray).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "grpo.py"

THROUGHPUT_TARGET = 1.5  # rlstack completion tokens/s ≥ 1.5× TRL's
PATCH_BYTES_TARGET = 0.1  # patch bytes ≤ 0.1× bucket bytes after one step (bf16 engine)
COPY_TIME_TARGET = 1.25  # bucket sync time ≤ 1.25× a plain copy of every tensor
LEARNING_RATE = 1e-6  # a typical RL learning rate; both trainers and the sync measurement use it
BUCKET_SIZE_MB = 64.0  # rollout.bucket_size_mb's default
# The collocated HF engine borrows each actor rank's gathered weights: nothing to sync.
WEIGHT_SYNC = "shared"

# Qwen2Config arguments; vocabulary size and special ids come from the tokenizer.
SIZES: dict[str, dict[str, int]] = {
    "0.5M": {
        "hidden_size": 128,
        "intermediate_size": 320,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    },
    "5M": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    },
}
FULL = {
    "sizes": ["0.5M", "5M"],
    "prompts": 16,
    "group_size": 8,
    "max_new_tokens": 32,
    "warmup": 1,
    "steps": 10,
    "sync_size": "5M",
    "sync_repeats": 20,
}
QUICK = {
    "sizes": ["0.5M"],
    "prompts": 4,
    "group_size": 4,
    "max_new_tokens": 8,
    "warmup": 1,
    "steps": 1,
    "sync_size": "0.5M",
    "sync_repeats": 3,
}


# ---------------------------------------------------------------------------
# Shared pieces


def model_kwargs(size: str, max_new_tokens: int) -> dict[str, Any]:
    """The Qwen2Config arguments of a size, sampling exactly ``max_new_tokens`` tokens."""
    return {**SIZES[size], "min_new_tokens": max_new_tokens}


def build_model(kwargs: dict[str, Any], tokenizer: Any) -> Any:
    """The causal LM both sides train, seeded (fp32)."""
    import torch
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **kwargs,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def parameter_count(size: str) -> int:
    from rlshell.tokenizer import build_char_tokenizer

    model = build_model(SIZES[size], build_char_tokenizer())
    return sum(p.numel() for p in model.parameters())


def prompt_batches(prompts: int, count: int) -> list[list[list[str]]]:
    """``count`` batches of ``[prompt, answer]``, as a run of ``configs/grpo.py`` draws them."""
    from rlshell.data import PromptSampler, load_dataset
    from rlshell.runners.validation import load_config

    config = load_config(CONFIG)
    train = load_dataset(config.data, "train")
    sampler = PromptSampler(train, prompts, seed=0)
    return [[[e.prompt, e.answer] for e in sampler.next()] for _ in range(count)]


def short_temp_dir() -> str:
    """A fresh directory under ``RAY_TMPDIR`` (or /tmp): Ray's socket paths must stay short."""
    parent = os.environ.get("RAY_TMPDIR", "/tmp")
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix="rb", dir=parent)


# ---------------------------------------------------------------------------
# (1a) rlstack: ReasoningTrainer


STEP_METRICS = (
    "time/step",
    "time/rollout",
    "time/reward",
    "time/update",
    "time/actor_prepare",
    "time/actor_forward_backward",
    "time/actor_optimizer",
    "time/sync",
    "perf/completion_tokens_per_s",
    "rollout/sync_bytes",
    "rollout/response_length",
)


@contextmanager
def rlstack_trainer(spec: dict[str, Any]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A launched `ReasoningTrainer` after its first full weight sync, and its start-up times."""
    from rlshell.cluster.ray_cluster import Cluster
    from rlshell.runners.reasoning import ReasoningTrainer
    from rlshell.runners.spec import resolve_spec
    from rlshell.runners.validation import load_config, plan_for

    kwargs = model_kwargs(spec["size"], spec["max_new_tokens"])
    overrides = [
        f"runner.prompts_per_step={spec['prompts']}",
        f"runner.max_steps={spec['warmup'] + spec['steps']}",
        f"algorithm.group_size={spec['group_size']}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        f"actor.optim.lr={LEARNING_RATE}",
        f"rollout.weight_sync={WEIGHT_SYNC}",
        *(f"actor.model.model_kwargs.{key}={value}" for key, value in kwargs.items()),
    ]
    config = load_config(CONFIG, overrides)
    temp_dir = short_temp_dir()
    try:
        with Cluster(
            num_cpus=2, temp_dir=temp_dir, runtime_env_vars=config.cluster.worker_env_vars
        ) as cluster:
            plan = plan_for(config, cluster.spec())
            started = time.perf_counter()
            run_dir = Path(temp_dir) / "run"
            with closing(
                ReasoningTrainer.launch(resolve_spec(config), cluster, plan, run_dir)
            ) as trainer:
                launch_s = time.perf_counter() - started
                started = time.perf_counter()
                trainer.sync_weights(full=True)
                startup = {
                    "ray": cluster.startup_seconds,
                    "workers": launch_s,
                    "first_full_sync": time.perf_counter() - started,
                    "weight_sync": config.rollout.weight_sync,
                }
                yield trainer, startup
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def rlstack_summary(steps: list[dict[str, float]], startup: dict[str, Any]) -> dict[str, Any]:
    return {
        "startup_s": {key: value for key, value in startup.items() if key != "weight_sync"},
        "weight_sync": startup["weight_sync"],
        "steps": [{key: float(step[key]) for key in STEP_METRICS if key in step} for step in steps],
        "step_seconds": [float(step["time/step"]) for step in steps],
        "completion_tokens": [
            round(float(step["perf/completion_tokens_per_s"]) * float(step["time/step"]))
            for step in steps
        ],
    }


def run_pair(spec: dict[str, Any]) -> dict[str, Any]:
    """Both trainers in one driver process, alternating step by step.

    Each TRL step (timed by its callback) is followed by the rlstack step on
    the same prompts, so that load from other processes on a shared machine
    falls on both alike.
    """
    import torch

    torch.set_num_threads(1)
    from rlshell.data import PromptExample

    batches = [[PromptExample(p, a) for p, a in batch] for batch in spec["batches"]]
    rlstack_steps: list[dict[str, float]] = []
    with rlstack_trainer(spec) as (trainer, startup):

        def rlstack_step(index: int) -> None:
            rlstack_steps.append(trainer.train_on(index + 1, batches[index]))

        baseline = run_trl(spec, after_step=rlstack_step)
    warmup = spec["warmup"]
    return {"rlstack": rlstack_summary(rlstack_steps[warmup:], startup), "trl": baseline}


# ---------------------------------------------------------------------------
# (1b) TRL: GRPOTrainer


def run_trl(spec: dict[str, Any], after_step: Callable[[int], None]) -> dict[str, Any]:
    """TRL's GRPO steps, timed; ``after_step(i)`` runs after step i's timing (0-based)."""
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from rlshell.rewards.rule_based import math_reward
    from rlshell.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = build_model(model_kwargs(spec["size"], spec["max_new_tokens"]), tokenizer)
    rows = [{"prompt": p, "answer": a} for batch in spec["batches"] for p, a in batch]
    tokens_scored: list[int] = []

    def math_answer(
        completions: list[str], answer: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        tokens_scored.append(sum(len(ids) for ids in completion_ids))
        return [math_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.tokens: list[int] = []
            self._start = 0.0
            self._scored = 0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self._scored = len(tokens_scored)
            self._start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.seconds.append(time.perf_counter() - self._start)
            self.tokens.append(sum(tokens_scored[self._scored :]))
            after_step(len(self.seconds) - 1)

    work_dir = tempfile.mkdtemp(prefix="trl-grpo")
    max_new = spec["max_new_tokens"]
    args = trl.GRPOConfig(
        output_dir=work_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=spec["prompts"] * spec["group_size"],
        gradient_accumulation_steps=1,
        num_generations=spec["group_size"],
        max_completion_length=max_new,
        generation_kwargs={"min_new_tokens": max_new},
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        learning_rate=LEARNING_RATE,
        max_grad_norm=1.0,
        max_steps=spec["warmup"] + spec["steps"],
        shuffle_dataset=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    timer = StepTimer()
    started = time.perf_counter()
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=math_answer,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    construct_s = time.perf_counter() - started
    # Time generation + scoring inside each step (the rest is the update).
    generate_and_score = trainer._generate_and_score_completions
    rollout_seconds: list[float] = []

    def timed_generate_and_score(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        result = generate_and_score(*a, **k)
        rollout_seconds.append(time.perf_counter() - start)
        return result

    trainer._generate_and_score_completions = timed_generate_and_score
    try:
        trainer.train()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    warmup = spec["warmup"]
    step_seconds = timer.seconds[warmup:]
    rollout = rollout_seconds[warmup:]
    return {
        "trl": trl.__version__,
        "startup_s": {"trainer": construct_s},
        "steps": [
            {
                "time/step": seconds,
                "time/generate_and_score": gen,
                "time/update_and_rest": seconds - gen,
            }
            for seconds, gen in zip(step_seconds, rollout, strict=True)
        ],
        "step_seconds": step_seconds,
        "completion_tokens": timer.tokens[warmup:],
    }


# ---------------------------------------------------------------------------
# (2) Weight sync: bytes after one step, and time against a plain copy


def run_sync(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from rlshell.sync.codec import FlatBuckets, bucket_bytes_for
    from rlshell.sync.transfer import WeightSender
    from rlshell.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    source = build_model(SIZES[spec["size"]], tokenizer)
    state = source.state_dict()
    engines = {"bf16": torch.bfloat16, "fp32": torch.float32}
    targets = {
        label: {name: t.detach().to(dtype).clone() for name, t in state.items()}
        for label, dtype in engines.items()
    }
    senders = {
        (mode, label): WeightSender(mode, BUCKET_SIZE_MB, dtype=dtype)
        for mode in ("bucket", "patch")
        for label, dtype in engines.items()
    }
    # The patch encoders' snapshots: what the engine holds before the step.
    for label in engines:
        senders["patch", label].send_in_memory(state.items(), targets[label], full=True)

    before_bf16 = {name: t.detach().to(torch.bfloat16) for name, t in state.items()}
    optimizer = torch.optim.AdamW(source.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(1)
    for param in source.parameters():
        param.grad = torch.randn(param.shape, generator=generator)
    optimizer.step()

    syncs: dict[str, dict[str, dict[str, float]]] = {"patch": {}, "bucket": {}}
    for mode in ("patch", "bucket"):
        for label in engines:
            stats = senders[mode, label].send_in_memory(state.items(), targets[label], full=False)
            syncs[mode][label] = {"bytes": stats["bytes"], "seconds": stats["seconds"]}
    synced = all(
        torch.equal(targets[label][name], t.to(dtype))
        for label, dtype in engines.items()
        for name, t in state.items()
    )
    changed_bf16 = sum(
        int((t.to(torch.bfloat16) != before_bf16[name]).sum()) for name, t in state.items()
    )

    # Time: an fp32 bucket sync against copy_ of every tensor into the same targets, laid out
    # as the collocated engine lays them out (FlatBuckets: buckets are packed into them).
    fp32 = targets["fp32"]
    flat = FlatBuckets(fp32, bucket_bytes_for(BUCKET_SIZE_MB))

    def plain_copy() -> None:
        with torch.no_grad():
            for name, tensor in state.items():
                fp32[name].copy_(tensor)

    def bucket_sync() -> None:
        senders["bucket", "fp32"].send_in_memory(state.items(), fp32, full=False, flat=flat)

    samples: dict[str, list[float]] = {"bucket": [], "plain_copy": []}
    for fn in (plain_copy, bucket_sync):  # warm-up
        fn()
    for _ in range(spec["repeats"]):
        for name, fn in (("plain_copy", plain_copy), ("bucket", bucket_sync)):
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    with torch.no_grad():  # the in-place sync on its own: from zeros to the weights
        for tensor in fp32.values():
            tensor.zero_()
    bucket_sync()
    timed_synced = all(torch.equal(fp32[name], t) for name, t in state.items())
    numel = sum(t.numel() for t in state.values())
    return {
        "parameters": numel,
        "synced_equal": synced and timed_synced,
        "bf16_elements_changed": changed_bf16,
        "after_one_step": syncs,
        "time_ms": {name: statistics.median(s) * 1000.0 for name, s in samples.items()},
        "time_ms_min": {name: min(s) * 1000.0 for name, s in samples.items()},
    }


# ---------------------------------------------------------------------------
# The parent: a subprocess per GRPO measurement; the sync measured here


CHILDREN = {"pair": run_pair}


def run_child(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="grpo-bench") as scratch:
        spec_path, out_path = Path(scratch) / "spec.json", Path(scratch) / "out.json"
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        # Ray starts its workers at nice 15; the TRL trainer runs at the driver's nice 0.
        # Same priority for both, or any other process on the machine starves rlstack alone.
        env.setdefault("RAY_worker_niceness", "0")
        completed = subprocess.run(
            [sys.executable, __file__, "--child", kind, str(spec_path), str(out_path)],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            check=False,
        )
        if completed.returncode != 0 or not out_path.is_file():
            tail = (completed.stdout + completed.stderr)[-6000:]
            raise RuntimeError(f"the {kind} measurement failed ({completed.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads(out_path.read_text())
        return result


def summarise(side: dict[str, Any]) -> dict[str, Any]:
    seconds, tokens = side["step_seconds"], side["completion_tokens"]
    return {
        "seconds_per_step": statistics.median(seconds),
        "completion_tokens_per_step": statistics.median(tokens),
        "completion_tokens_per_s": sum(tokens) / sum(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small and short, for smoke tests")
    parser.add_argument("--steps", type=int, help="timed steps per side (after the warm-up)")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, spec_path, out_path = args.child
        result = CHILDREN[kind](json.loads(Path(spec_path).read_text()))
        Path(out_path).write_text(json.dumps(result))
        return

    plan = dict(QUICK if args.quick else FULL)
    if args.steps:
        plan["steps"] = args.steps
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    batches = prompt_batches(plan["prompts"], plan["warmup"] + plan["steps"])
    step_spec = {key: plan[key] for key in ("prompts", "group_size", "max_new_tokens")}
    step_spec.update(warmup=plan["warmup"], steps=plan["steps"], batches=batches)
    sizes: dict[str, Any] = {}
    for size in plan["sizes"]:
        spec = {**step_spec, "size": size}
        pair = run_child("pair", spec)
        rlstack, baseline = pair["rlstack"], pair["trl"]
        ours, theirs = summarise(rlstack), summarise(baseline)
        ratio = ours["completion_tokens_per_s"] / theirs["completion_tokens_per_s"]
        sizes[size] = {
            "parameters": parameter_count(size),
            "model_kwargs": SIZES[size],
            "rlstack": {**ours, **rlstack},
            "trl": {**theirs, **baseline},
            "throughput_ratio": ratio,
            "step_time_ratio_trl_over_rlstack": theirs["seconds_per_step"]
            / ours["seconds_per_step"],
            "met": ratio >= THROUGHPUT_TARGET,
        }
    sync = run_sync({"size": plan["sync_size"], "repeats": plan["sync_repeats"]})
    after = sync["after_one_step"]
    patch_ratio = after["patch"]["bf16"]["bytes"] / after["bucket"]["bf16"]["bytes"]
    copy_ratio = sync["time_ms"]["bucket"] / sync["time_ms"]["plain_copy"]
    report = {
        "benchmark": "grpo_step",
        "quick": args.quick,
        "torch": version("torch"),
        "trl": version("trl"),
        "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
        "threads_per_process": 1,
        "workload": {
            "prompts_per_step": plan["prompts"],
            "group_size": plan["group_size"],
            "completions_per_step": plan["prompts"] * plan["group_size"],
            "max_new_tokens": plan["max_new_tokens"],
            "min_new_tokens": plan["max_new_tokens"],
            "warmup_steps": plan["warmup"],
            "timed_steps": plan["steps"],
            "learning_rate": LEARNING_RATE,
            "precision": "fp32",
            "task": "arithmetic (configs/grpo.py data), math_reward",
        },
        "rlstack_setup": (
            "ReasoningTrainer, configs/grpo.py: 2 FSDP2 actor ranks (gloo, 1 thread each) with "
            "the HF rollout collocated (each rank generates half the prompts with its own "
            f"gathered weights: rollout.weight_sync={WEIGHT_SYNC}), reward in its own worker "
            "(2 scoring processes); Ray on 2 CPUs, workers at nice 0; "
            "alternating step by step with TRL in one driver process"
        ),
        "baseline": (
            "trl.GRPOTrainer(use_cpu=True, bf16=False, gradient_checkpointing=False), one "
            "process, 1 thread: model.generate, the reward function and the update in turn; "
            "per_device_train_batch_size = prompts x group size (one generation per step)"
        ),
        "sizes": sizes,
        "throughput_target": {"rlstack_over_trl_at_least": THROUGHPUT_TARGET},
        "weight_sync": {
            "model": plan["sync_size"],
            **sync,
            "bucket_size_mb": BUCKET_SIZE_MB,
            "optimizer": f"AdamW(lr={LEARNING_RATE}), one step, random gradient",
            "patch_over_bucket_bytes_bf16": patch_ratio,
            "patch_over_bucket_bytes_fp32": after["patch"]["fp32"]["bytes"]
            / after["bucket"]["fp32"]["bytes"],
            "bucket_over_plain_copy_time": copy_ratio,
            "target": {
                "patch_over_bucket_bytes_at_most": PATCH_BYTES_TARGET,
                "bucket_over_plain_copy_time_at_most": COPY_TIME_TARGET,
            },
            "bytes_met": patch_ratio <= PATCH_BYTES_TARGET,
            "time_met": copy_ratio <= COPY_TIME_TARGET,
        },
        "wall_s": time.perf_counter() - started,
        # Other processes' load (1-minute average) when the run began and ended: the
        # machine is shared, and two busy ranks gain little when its 2 cores are taken.
        "load_average": {"before": load_before, "after": os.getloadavg()[0]},
    }
    report["met"] = (
        all(entry["met"] for entry in sizes.values())
        and report["weight_sync"]["bytes_met"]
        and report["weight_sync"]["time_met"]
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
