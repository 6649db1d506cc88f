"""A GRPO update step: the FSDP backend (2 ranks) against Megatron-core at TP=2 and at DP=2.

What is timed: `rlshell.workers.actor.ActorWorker.run_training` (advantages,
micro-batched forward and backward of the GRPO loss, the optimizer step) on
one fixed batch, in two processes over gloo, as the actor worker group runs
it (no Ray: the processes are spawned here; the same code runs in Ray's
workers). The model is configs/grpo.py's tiny Qwen2 (fp32), or a ~5M one
(hidden 256, 6 layers, 8 heads, 2 key/value heads); the batch is 16 prompts
× 8 samples its HF engine sampled (the same batch for every backend). Each
backend gets the same two processes with one torch thread each, one after
the other; the first two steps are a warm-up, the rest are timed (median).

- baseline: ``actor.backend=fsdp``, two FSDP2 ranks (each trains half the rows), in
  its best configuration (``actor.share_prompt_forward``: a group's prompt runs once);
- ``fsdp_unshared_prompts``: the same without that, the forward Megatron runs;
- ``megatron_tp2``: one model split over the two ranks (tensor parallel 2);
- ``megatron_dp2``: two whole replicas (Megatron at TP=1; gradients averaged).

Megatron on CPU is here for correctness (its kernels and communication are
built for GPUs), so there is no speed target: the JSON reports each
backend's median step and its ratio to FSDP's.

    .venv/bin/python benchmarks/actor_backends.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
GRPO = ROOT / "configs" / "grpo.py"

# Megatron's forward has no shared-prompt (KV-cache) path; configs/grpo.py's FSDP wrap policy,
# back to its default (Megatron does not read it).
MEGATRON = [
    "actor.backend=megatron",
    "actor.share_prompt_forward=false",
    "actor.fsdp_config.wrap_policy.min_num_params=0",
]
BACKENDS: dict[str, list[str]] = {
    "fsdp": [],  # the baseline in its best configuration: each group's prompt runs once
    "fsdp_unshared_prompts": ["actor.share_prompt_forward=false"],  # Megatron's forward
    "megatron_tp2": [*MEGATRON, "actor.megatron.tensor_model_parallel_size=2"],
    "megatron_dp2": MEGATRON,
}
# The batch and loss measured here until configs/grpo.py moved to 16 samples and an entropy bonus.
MEASURED = ["algorithm.group_size=8", "algorithm.entropy_coef=0"]
SIZES: dict[str, list[str]] = {
    # configs/grpo.py's model until 2026-11-25 (2 layers, MLP 128), the size measured here.
    "grpo.py (0.1M)": [
        "actor.model.model_kwargs.intermediate_size=128",
        "actor.model.model_kwargs.num_hidden_layers=2",
    ],
    "5M": [
        "actor.model.model_kwargs.hidden_size=256",
        "actor.model.model_kwargs.intermediate_size=768",
        "actor.model.model_kwargs.num_hidden_layers=6",
        "actor.model.model_kwargs.num_attention_heads=8",
        "actor.model.model_kwargs.num_key_value_heads=2",
    ],
}
FULL = {"sizes": list(SIZES), "prompts": 16, "warmup": 2, "steps": 10}
QUICK = {"sizes": ["grpo.py (0.1M)"], "prompts": 2, "warmup": 1, "steps": 1}


def _config(size: str, backend: str, tokenizer_dir: str) -> Any:
    from rlshell.runners.validation import load_config
    from rlshell.tokenizer import with_tokenizer_ids

    overrides = [*MEASURED, *SIZES[size], *BACKENDS[backend]]
    return with_tokenizer_ids(load_config(GRPO, overrides), tokenizer_dir)


def _batch(size: str, prompts: int, tokenizer_dir: str) -> tuple[Any, torch.Tensor]:
    from rlshell.data import ArithmeticTask, arithmetic_task
    from rlshell.engines.rollout.hf import HFRolloutEngine
    from rlshell.models import get_model
    from rlshell.rollout import SamplingParams
    from rlshell.tokenizer import load_tokenizer

    config = _config(size, "fsdp", tokenizer_dir)
    torch.manual_seed(config.actor.seed)
    engine = HFRolloutEngine(
        get_model(config.actor.model), load_tokenizer(tokenizer_dir), torch.device("cpu")
    )
    task = ArithmeticTask.of(config.data)
    texts = [example.prompt for example in arithmetic_task("train", task)[:prompts]]
    params = SamplingParams(n=config.algorithm.group_size, max_new_tokens=4, min_new_tokens=4)
    batch = engine.generate(texts, params, seed=0)
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 2, (batch.rows,), generator=generator).float()
    return batch, scores


def _rank(rank: int, port: int, work: str, plan: dict[str, Any]) -> None:
    from rlshell.rollout.advantages import compute_advantages
    from rlshell.workers.actor import ActorWorker

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    tokenizer_dir = str(Path(work) / "tokenizer")
    out: dict[str, Any] = {}
    for size in plan["sizes"]:
        batch, scores = torch.load(
            Path(work) / f"batch_{plan['sizes'].index(size)}.pt", weights_only=False
        )
        for backend in BACKENDS:
            config = _config(size, backend, tokenizer_dir)
            worker = ActorWorker(config, total_steps=100, rollout_in_actor=False)
            worker.rank, worker.world_size = rank, 2
            worker.init_worker(tokenizer_dir)
            seconds = []
            for step in range(plan["warmup"] + plan["steps"]):
                started = time.perf_counter()
                metrics = worker.run_training(
                    batch, compute_advantages(batch, scores, worker.config).advantages
                )
                if step >= plan["warmup"]:
                    seconds.append(time.perf_counter() - started)
            out[f"{size}/{backend}"] = {
                "seconds_per_step_median": statistics.median(seconds),
                "seconds_per_step": seconds,
                "last_loss": metrics["train/loss"],
            }
    if rank == 0:
        (Path(work) / "result.json").write_text(json.dumps(out))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run; figures mean nothing")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    from rlshell.runners.validation import load_config
    from rlshell.tokenizer import prepare_tokenizer

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="actor-backends") as work:
        tokenizer_dir = prepare_tokenizer(load_config(GRPO), Path(work))
        for index, size in enumerate(plan["sizes"]):
            batch = _batch(size, plan["prompts"], tokenizer_dir)
            torch.save(batch, Path(work) / f"batch_{index}.pt")
        mp.spawn(_rank, args=(_free_port(), work, plan), nprocs=2, join=True)
        timed = json.loads((Path(work) / "result.json").read_text())
    by_size: dict[str, Any] = {}
    for size in plan["sizes"]:
        fsdp = timed[f"{size}/fsdp"]["seconds_per_step_median"]
        by_size[size] = {
            backend: {
                **timed[f"{size}/{backend}"],
                "speed_vs_fsdp": fsdp / timed[f"{size}/{backend}"]["seconds_per_step_median"],
            }
            for backend in BACKENDS
        }
    report = {
        "benchmark": "actor_backends",
        "quick": args.quick,
        "what": f"ActorWorker.run_training on {plan['prompts']} prompts × 8 samples, 2 processes "
        f"(gloo, 1 thread each); median of {plan['steps']} steps after {plan['warmup']} warm-up",
        "baseline": "fsdp (2 FSDP2 ranks)",
        "target": None,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "by_size": by_size,
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
