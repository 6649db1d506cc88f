"""One GRPO step, rlstack against TRL's `GRPOTrainer`; weight-sync bytes and time, bucket and patch.

(1) A GRPO step (generation, scoring, one optimizer step) on the same tiny
    Qwen2-style causal LM (built from a `Qwen2Config`, the project's character
    tokenizer), the same prompts of the generated arithmetic task, the same
    group size and completion length, fp32, at two model sizes (~0.5M and ~5M
    parameters), and on the real pretrained SmolLM2-135M-Instruct (its own
    tokenizer, configs/grpo_smollm2.py's prompts in its chat template, that
    config's batch of 8 prompts × 8 samples × 24 tokens: `REAL_WORKLOAD`), where
    rlstack runs that config as it trains (one FSDP2 rank with vLLM's CPU engine
    beside it in its process, its weights reloaded in place after each update)
    and TRL samples with HF ``generate`` (its colocated vLLM fails on this
    installation: benchmarks/rollout_engines.py records the error):

    - rlstack: `rlshell.runners.reasoning.ReasoningTrainer` with
      ``configs/grpo.py``: two FSDP2 actor ranks (gloo) with the HF rollout
      engine collocated in each (each rank samples half the prompts, with
      ``rollout.weight_sync=shared``: the engine borrows the rank's gathered
      FSDP weights, so there is nothing to sync), the reward in a worker of
      its own;
    - TRL (the baseline): `trl.GRPOTrainer` with ``GRPOConfig(use_cpu=True)``,
      everything in the trainer's process(es) (``model.generate``, the reward
      function, the update), one generation of prompts × group size
      completions per optimizer step. TRL's defaults ``bf16=True`` and
      ``gradient_checkpointing=True`` are turned off to match rlstack's fp32
      without checkpointing. It runs in each of its configurations on the
      same ``CORES`` cores (`trl_setups`): one process with one torch thread
      (the reference), one process with a thread per core, and TRL's
      multi-process launch (``torchrun``, a CPU process per core, gloo DDP:
      ``per_device_train_batch_size`` = prompts × group size / processes,
      each process generating and scoring its share of the prompts).

    Both sides sample exactly ``max_new_tokens`` tokens per completion
    (``min_new_tokens`` = ``max_new_tokens``: TRL's ``generation_kwargs``; on
    rlstack the model's generation config, set through
    ``actor.model.model_kwargs``), and the JSON reports the completion tokens
    each side counted and whether each TRL setup scored exactly the step's
    prompts. The race runs in one fresh driver process per size, held to
    ``CORES`` cores (and so is everything it starts): the TRL setups, each
    in its own process(es) waiting at the start of every step, and the
    rlstack trainer. They take turns step by step (step i of each TRL setup,
    then the rlstack step on the same prompts), no two steps at once, so that
    load from other processes on a shared machine falls on all alike (at the
    real size the sides do not fit in memory together: each runs all its steps
    alone, one after the other, `run_one_at_a_time`, on an idle machine); Ray's
    workers run at nice 0 like the rest (``RAY_worker_niceness=0``; Ray's
    default is 15, which lets any other process starve the ranks). The first
    step of each is a warm-up, not timed; a TRL setup whose warm-up step
    took over ``DROP_SLOWER_THAN``× the fastest's is stopped there
    (`drop_the_slow`). Start-up (Ray, worker launch, the first full weight
    sync; the trainer's construction) is reported apart. Target (reported,
    not asserted): rlstack's completion tokens/s on its median step ≥ 1.5×
    that of TRL's fastest setup in the same run, at both sizes.

(2) Weight sync (`rlshell.sync.transfer.WeightSender`, in memory) on the
    real pretrained SmolLM2-135M-Instruct (the targets' row) and the ~5M toy
    model, each after one AdamW step (lr 1e-6, a random gradient): the bytes of
    a ``bucket`` sync against a ``patch`` sync, with the engine in bf16 (what
    ``rollout.precision="bf16"`` does) and in fp32. Target: patch ≤ 0.1× the
    bucket bytes (bf16). And the time of an fp32 bucket sync against a plain
    ``Tensor.copy_`` of every tensor into the same targets (the bound), the
    targets laid out as a collocated engine lays out its weights
    (`rlshell.sync.codec.FlatBuckets`: the buckets are packed into them).
    Target: bucket time ≤ 1.25× the plain copy (≥ 0.8× its speed).

Prints one JSON object. ``--quick`` is a smoke run (the small model, a small
batch, one timed step each; its figures mean nothing). ``--sync-only`` runs part (2)
alone (about a minute).

    .venv/bin/python benchmarks/grpo_step.py [--quick] [--sync-only] \\
        [--sizes 135M ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "grpo.py"

THROUGHPUT_TARGET = 1.5  # rlstack completion tokens/s ≥ 1.5× TRL's fastest setup
CORES = 2  # both sides' share of the machine: rlstack's Ray CPUs, TRL's threads or processes
DROP_SLOWER_THAN = 3.0  # a TRL setup this many times slower than its fastest is timed no further
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
# The real pretrained model (make install converts it into the Hub cache, `rlshell.gguf`).
REAL = "135M"
# Its race: configs/grpo_smollm2.py (vLLM sampling in the actor's process, weights reloaded
# in place after each update) against TRL on the same chat-template prompts of its task,
# with that config's batch (a step of 64 samples of 24 tokens; the toy sizes' 128 of 32
# would make a TRL step of the real model take minutes).
REAL_CONFIG = ROOT / "configs" / "grpo_smollm2.py"
REAL_WORKLOAD = {"prompts": 8, "group_size": 8, "max_new_tokens": 24, "warmup": 1, "steps": 3}
# ... one side alive at a time: a TRL process of the real model holds 6-8 GB (its logits over
# 49,152 tokens for 64 samples), the rlstack actor with vLLM 8.7 GB; the four TRL processes
# and rlstack together exceed the machine's 24 GB (the kernel killed a torchrun rank).
REAL_ONE_AT_A_TIME = True
FULL = {
    "sizes": ["0.5M", "5M", REAL],
    "prompts": 16,
    "group_size": 8,
    "max_new_tokens": 32,
    "warmup": 1,
    "steps": 10,
    # The toy row, then the real pretrained model (the target's row).
    "sync_sizes": ["5M", REAL],
    "sync_repeats": 20,
}
QUICK = {
    "sizes": ["0.5M"],
    "prompts": 4,
    "group_size": 4,
    "max_new_tokens": 8,
    "warmup": 1,
    "steps": 1,
    "sync_sizes": ["0.5M"],
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

    model = real_model() if size == REAL else build_model(SIZES[size], build_char_tokenizer())
    return sum(p.numel() for p in model.parameters())


def real_model() -> Any:
    """SmolLM2-135M-Instruct from the Hub cache (fp32)."""
    from transformers import AutoModelForCausalLM

    from rlshell.gguf import SMOLLM2
    from rlshell.hub import from_pretrained

    return from_pretrained(AutoModelForCausalLM, SMOLLM2.repo_id)


def real_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from rlshell.gguf import SMOLLM2
    from rlshell.hub import from_pretrained

    return from_pretrained(AutoTokenizer, SMOLLM2.repo_id)


def prompt_batches(prompts: int, count: int, size: str = "") -> list[list[list[str]]]:
    """``count`` batches of ``[prompt, answer]``, as a run of ``configs/grpo.py`` draws them
    (of configs/grpo_smollm2.py, in the model's chat template, for the real model)."""
    from rlshell.data import PromptSampler, load_prompts
    from rlshell.runners.validation import load_config

    config = load_config(REAL_CONFIG if size == REAL else CONFIG)
    train = load_prompts(config.data, "train", real_tokenizer)
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

    overrides = [
        f"runner.prompts_per_step={spec['prompts']}",
        f"runner.max_steps={spec['warmup'] + spec['steps']}",
        f"algorithm.group_size={spec['group_size']}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        f"actor.optim.lr={LEARNING_RATE}",
        # The step TRL runs: its loss has no entropy bonus and its rate no schedule here.
        "algorithm.entropy_coef=0",
        "actor.optim.lr_scheduler=constant",
    ]
    # Ray's CPUs: logical; the race's process and all it starts are held to CORES cores.
    ray_cpus = CORES
    if spec["size"] == REAL:  # configs/grpo_smollm2.py: vLLM beside the actor, as it runs
        # ... with a torch thread per core in the actor's process (the config's 1 CPU a
        # worker gives it one thread: it shares the machine with evaluation runs), and
        # room beside it for the reward worker's quarter of a CPU (Ray counts whole CPUs).
        ray_cpus += 1
        overrides += [
            f"rollout.min_new_tokens={spec['max_new_tokens']}",
            f"actor.cpus_per_worker={CORES}",
            f"cluster.num_cpus={ray_cpus}",  # what the plan is checked against: this Ray's
        ]
        config = load_config(REAL_CONFIG, overrides)
    else:
        kwargs = model_kwargs(spec["size"], spec["max_new_tokens"])
        overrides.append(f"rollout.weight_sync={WEIGHT_SYNC}")
        overrides += [f"actor.model.model_kwargs.{key}={value}" for key, value in kwargs.items()]
        config = load_config(CONFIG, overrides)
    temp_dir = short_temp_dir()
    try:
        with Cluster(
            num_cpus=ray_cpus, temp_dir=temp_dir, runtime_env_vars=config.cluster.worker_env_vars
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


def run_race(spec: dict[str, Any]) -> dict[str, Any]:
    """rlstack and every TRL setup in turn, step by step, each alone on the machine.

    The TRL setups start first (each its own process or `torchrun` launch) and
    wait at their first step; then the rlstack trainer starts in this process.
    Each round runs step i of every TRL setup, then the rlstack step on the same
    prompts: no two steps overlap, and other processes' load on a shared
    machine falls on all of them alike.
    """
    # Both sides on the same CORES cores: every process started from here inherits this.
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:CORES])
    import torch

    torch.set_num_threads(1)
    from rlshell.data import PromptExample

    batches = [[PromptExample(p, a) for p, a in batch] for batch in spec["batches"]]
    if spec.get("one_at_a_time"):
        return run_one_at_a_time(spec, batches)
    rlstack_steps: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="grpo-trl") as scratch, ExitStack() as stack:
        setups = trl_setups(len(os.sched_getaffinity(0)))
        if spec["quick"]:  # the two launches (a process, torchrun's); threads change nothing there
            setups = {name: setup for name, setup in setups.items() if setup.threads == 1}
        contestants = {
            name: stack.enter_context(TRLContestant.launch(spec, name, setup, Path(scratch)))
            for name, setup in setups.items()
        }
        # Start-up times are clean when the sides start one after the other; the smoke run
        # (``--quick``) starts them together.
        if not spec["quick"]:
            for contestant in contestants.values():
                contestant.wait_ready()
        with rlstack_trainer(spec) as (trainer, startup):
            for contestant in contestants.values():
                contestant.wait_ready()
            for index, batch in enumerate(batches):
                running = [c for c in contestants.values() if not c.dropped]
                for contestant in running:
                    contestant.step()
                rlstack_steps.append(trainer.train_on(index + 1, batch))
                if index == spec["warmup"] - 1:
                    drop_the_slow(running)
        baselines = {name: contestant.summary() for name, contestant in contestants.items()}
    warmup = spec["warmup"]
    return {"rlstack": rlstack_summary(rlstack_steps[warmup:], startup), "trl": baselines}


def run_one_at_a_time(spec: dict[str, Any], batches: list[list[Any]]) -> dict[str, Any]:
    """The race where its sides do not fit in memory together (the real model): each TRL
    setup in turn runs all its steps alone, then stops, then the rlstack trainer runs its.
    No two steps overlap here either; load from other processes no longer falls on all
    sides alike, so it runs on an idle machine. A setup whose warm-up step took over
    ``DROP_SLOWER_THAN``× the fastest warm-up so far is stopped there (the reference runs
    first and is always timed)."""
    baselines: dict[str, Any] = {}
    fastest_warmup = float("inf")
    with tempfile.TemporaryDirectory(prefix="grpo-trl") as scratch:
        for name, setup in trl_setups(len(os.sched_getaffinity(0))).items():
            with TRLContestant.launch(spec, name, setup, Path(scratch)) as contestant:
                contestant.wait_ready()
                for index in range(len(batches)):
                    contestant.step()
                    if index == spec["warmup"] - 1:
                        warmup = contestant.step_seconds[-1]
                        if warmup > DROP_SLOWER_THAN * fastest_warmup:
                            contestant.drop()
                            break
                        fastest_warmup = min(fastest_warmup, warmup)
                baselines[name] = contestant.summary()
    with rlstack_trainer(spec) as (trainer, startup):
        rlstack_steps = [trainer.train_on(index + 1, batch) for index, batch in enumerate(batches)]
    return {"rlstack": rlstack_summary(rlstack_steps[spec["warmup"] :], startup), "trl": baselines}


def drop_the_slow(contestants: list[TRLContestant]) -> None:
    """Stop the TRL setups whose last warm-up step took over ``DROP_SLOWER_THAN``× the fastest's.

    Such a setup cannot be TRL's fastest here; on a loaded machine one
    process with two threads can be 2-11x slower than with one (each thread
    waits for the other at every operation), and timing it would take most
    of the run. The reference (one process, one thread) is always timed.
    """
    fastest = min(c.step_seconds[-1] for c in contestants)
    for contestant in contestants:
        reference = contestant.setup == TRLSetup(1, 1)
        if not reference and contestant.step_seconds[-1] > DROP_SLOWER_THAN * fastest:
            contestant.drop()


# ---------------------------------------------------------------------------
# (1b) TRL: GRPOTrainer in each of its configurations on the same cores


@dataclass(frozen=True)
class TRLSetup:
    """How TRL runs: ``processes`` (a `torchrun` launch when more than one), torch threads each."""

    processes: int
    threads: int

    def describe(self) -> str:
        if self.processes == 1:
            return f"one process, {self.threads} torch thread(s)"
        return f"torchrun, {self.processes} CPU processes (gloo DDP), {self.threads} thread(s) each"


def trl_setups(cores: int) -> dict[str, TRLSetup]:
    """TRL on ``cores`` cores: one thread (the reference), one process of ``cores`` threads,
    and ``cores`` processes of one thread (TRL's multi-process launch)."""
    setups = {"1_process_1_thread": TRLSetup(1, 1)}
    if cores > 1:
        setups[f"1_process_{cores}_threads"] = TRLSetup(1, cores)
        setups[f"{cores}_processes_1_thread"] = TRLSetup(cores, 1)
    return setups


AUTHKEY_ENV = "GRPO_BENCH_AUTHKEY"


class TRLContestant:
    """A TRL setup in its own process(es), driven one step at a time over a local socket.

    Each rank waits at the start of every step (``on_step_begin``) until
    `step` lets all ranks go, and reports when the step ends; TRL's logging
    after a step runs before the rank waits again, so it overlaps no one's step.
    """

    def __init__(
        self, name: str, setup: TRLSetup, process: subprocess.Popen[bytes], log: Path
    ) -> None:
        self.name, self.setup, self.process, self.log = name, setup, process, log
        self.ranks: list[Connection] = []
        self.construct_s: float | None = None  # known once every rank waits at its first step
        self.steps: list[list[dict[str, Any]]] = []  # per step, each rank's report
        self.step_seconds: list[float] = []  # from the first rank's start to the last one's end
        self.dropped = False
        self.spec: dict[str, Any] = {}

    @classmethod
    @contextmanager
    def launch(
        cls, spec: dict[str, Any], name: str, setup: TRLSetup, scratch: Path
    ) -> Iterator[TRLContestant]:
        spec_path, log = scratch / f"{name}.json", scratch / f"{name}.log"
        spec_path.write_text(json.dumps(spec))
        authkey = os.urandom(16)
        with Listener(("127.0.0.1", 0), authkey=authkey) as listener:
            port = str(listener.address[1])
            script = [__file__, "--trl", str(spec_path), json.dumps(vars(setup)), port]
            if setup.processes > 1:
                launcher = ["-m", "torch.distributed.run", "--standalone", "--nnodes=1"]
                script = [*launcher, f"--nproc-per-node={setup.processes}", *script]
            env = {
                **os.environ,
                AUTHKEY_ENV: authkey.hex(),
                "OMP_NUM_THREADS": str(setup.threads),
                "TOKENIZERS_PARALLELISM": "false",
            }
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [sys.executable, *script],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=ROOT,
                    start_new_session=True,
                )
            contestant = cls(name, setup, process, log)
            contestant.spec = spec
            try:
                contestant.ranks = contestant._accept(listener)
                yield contestant
            finally:
                for rank in contestant.ranks:
                    rank.close()
                contestant._stop()

    def _accept(self, listener: Listener) -> list[Connection]:
        """Every rank's connection, in rank order; fails if the launch dies first."""
        accepted: list[Connection] = []

        def accept_all() -> None:
            accepted.extend(listener.accept() for _ in range(self.setup.processes))

        thread = threading.Thread(target=accept_all, daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.5)
            if thread.is_alive() and self.process.poll() is not None:
                self._fail("exited before connecting")
        by_rank = {conn.recv()["rank"]: conn for conn in accepted}
        return [by_rank[rank] for rank in range(self.setup.processes)]

    def _receive(self, event: str) -> list[dict[str, Any]]:
        """Each rank's next message, which must be ``event``."""
        messages = []
        for conn in self.ranks:
            try:
                message: dict[str, Any] = conn.recv()
            except EOFError:
                self._fail(f"closed its connection waiting for '{event}'")
            if message["event"] != event:
                self._fail(f"sent '{message['event']}' where '{event}' was expected")
            messages.append(message)
        return messages

    def wait_ready(self) -> None:
        """Until every rank waits at its first step (the trainer built); once."""
        if self.construct_s is None:
            self.construct_s = max(m["construct_s"] for m in self._receive("ready"))

    def step(self) -> None:
        """One step on every rank at once; back when each waits for the next (or has finished)."""
        for conn in self.ranks:
            conn.send("go")
        ranks = self._receive("stepped")
        self.steps.append(ranks)
        self.step_seconds.append(max(r["end"] for r in ranks) - min(r["start"] for r in ranks))
        self._receive("finished" if len(self.steps) == len(self.spec["batches"]) else "ready")

    def drop(self) -> None:
        """Stop every rank before its next step (`drop_the_slow`); back when they have exited."""
        for conn in self.ranks:
            conn.send("stop")
        self.dropped = True
        self._stop()

    def summary(self) -> dict[str, Any]:
        import trl

        steps = []
        same_prompts = True
        for batch, ranks, seconds in zip(
            self.spec["batches"], self.steps, self.step_seconds, strict=False
        ):
            generate = max(r["generate_and_score_s"] for r in ranks)
            steps.append(
                {
                    "time/step": seconds,
                    "time/generate_and_score": generate,
                    "time/update_and_rest": seconds - generate,
                    "completion_tokens": sum(r["completion_tokens"] for r in ranks),
                }
            )
            scored = sorted(prompt for r in ranks for prompt in r["prompts"])
            expected = sorted(p for p, _ in batch for _ in range(self.spec["group_size"]))
            same_prompts = same_prompts and scored == expected
        warmup = self.spec["warmup"]
        timed = steps[warmup:]
        return {
            "trl": trl.__version__,
            "setup": {**vars(self.setup), "launch": self.setup.describe()},
            "startup_s": {"trainer": self.construct_s},
            "same_prompts": same_prompts,
            "dropped_after_warmup": self.dropped,
            "warmup_step_seconds": self.step_seconds[:warmup],
            "steps": timed,
            "step_seconds": [s["time/step"] for s in timed],
            "completion_tokens": [s["completion_tokens"] for s in timed],
        }

    def _stop(self) -> None:
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def _fail(self, what: str) -> NoReturn:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        tail = self.log.read_text(errors="replace")[-6000:]
        raise RuntimeError(f"TRL {self.name} ({self.setup.describe()}) {what}:\n{tail}")


def run_trl_rank(spec: dict[str, Any], setup: TRLSetup, port: int) -> None:
    """One rank of a TRL setup: `GRPOTrainer` stepping when `TRLContestant.step` says so."""
    import torch

    torch.set_num_threads(setup.threads)
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback

    from rlshell.rewards.rule_based import math_reward
    from rlshell.tokenizer import build_char_tokenizer

    rank = int(os.environ.get("RANK", "0"))
    driver = Client(("127.0.0.1", port), authkey=bytes.fromhex(os.environ[AUTHKEY_ENV]))
    driver.send({"rank": rank})
    if spec["size"] == REAL:
        tokenizer, model = real_tokenizer(), real_model()
    else:
        tokenizer = build_char_tokenizer()
        model = build_model(model_kwargs(spec["size"], spec["max_new_tokens"]), tokenizer)
    rows = [{"prompt": p, "answer": a} for batch in spec["batches"] for p, a in batch]
    scored: list[tuple[int, list[str]]] = []  # per reward call: completion tokens, prompts

    def math_answer(
        prompts: list[str],
        completions: list[str],
        answer: list[str],
        completion_ids: list[list[int]],
        **_: Any,
    ) -> list[float]:
        scored.append((sum(len(ids) for ids in completion_ids), list(prompts)))
        return [math_reward(c, a) for c, a in zip(completions, answer, strict=True)]

    generate_seconds: list[float] = []
    construct_s = 0.0

    class StepGate(TrainerCallback):
        """Waits for the driver before each step; reports the step's times, tokens and prompts."""

        def __init__(self) -> None:
            self._start = 0.0
            self._scored = 0
            self._generated = 0

        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            driver.send({"event": "ready", "construct_s": construct_s})
            if driver.recv() == "stop":  # too slow to be TRL's fastest setup: `drop_the_slow`
                driver.close()
                raise SystemExit(0)
            self._scored, self._generated = len(scored), len(generate_seconds)
            self._start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            end = time.perf_counter()
            calls = scored[self._scored :]
            driver.send(
                {
                    "event": "stepped",
                    "start": self._start,
                    "end": end,
                    "generate_and_score_s": sum(generate_seconds[self._generated :]),
                    "completion_tokens": sum(tokens for tokens, _ in calls),
                    "prompts": [prompt for _, prompts in calls for prompt in prompts],
                }
            )

    work_dir = tempfile.mkdtemp(prefix="trl-grpo")
    max_new = spec["max_new_tokens"]
    args = trl.GRPOConfig(
        output_dir=work_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        # The step's completions split over the processes: one generation per step.
        per_device_train_batch_size=spec["prompts"] * spec["group_size"] // setup.processes,
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
    started = time.perf_counter()
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=math_answer,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepGate()],
    )
    construct_s = time.perf_counter() - started
    # Time generation + scoring inside each step (the rest is the update).
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        result = generate_and_score(*a, **k)
        generate_seconds.append(time.perf_counter() - start)
        return result

    trainer._generate_and_score_completions = timed_generate_and_score
    try:
        trainer.train()
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    driver.send({"event": "finished"})
    driver.close()


# ---------------------------------------------------------------------------
# (2) Weight sync: bytes after one step, and time against a plain copy


def run_sync(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    from rlshell.sync.codec import FlatBuckets, bucket_bytes_for
    from rlshell.sync.transfer import WeightSender
    from rlshell.tokenizer import build_char_tokenizer

    if spec["size"] == REAL:
        from transformers import AutoModelForCausalLM

        from rlshell.gguf import SMOLLM2
        from rlshell.hub import from_pretrained

        source = from_pretrained(AutoModelForCausalLM, SMOLLM2.repo_id)
    else:
        source = build_model(SIZES[spec["size"]], build_char_tokenizer())
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


CHILDREN = {"race": run_race}


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
    """Completion tokens/s of the median step (what the ratios compare) and over all steps.

    On a shared machine one step in ten can take several times the others
    (another job's burst); the median step is what a side does, the total
    lets such a step weigh in.
    """
    seconds, tokens = side["step_seconds"], side["completion_tokens"]
    median_seconds, median_tokens = statistics.median(seconds), statistics.median(tokens)
    return {
        "seconds_per_step": median_seconds,
        "completion_tokens_per_step": median_tokens,
        "completion_tokens_per_s": median_tokens / median_seconds,
        "completion_tokens_per_s_all_steps": sum(tokens) / sum(seconds),
    }


def weight_sync_summary(size: str, sync: dict[str, Any]) -> dict[str, Any]:
    """`run_sync`'s figures with their ratios and targets."""
    after = sync["after_one_step"]
    patch_ratio = after["patch"]["bf16"]["bytes"] / after["bucket"]["bf16"]["bytes"]
    copy_ratio = sync["time_ms"]["bucket"] / sync["time_ms"]["plain_copy"]
    return {
        "model": size,
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
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small and short, for smoke tests")
    parser.add_argument("--steps", type=int, help="timed steps per side (after the warm-up)")
    parser.add_argument(
        "--sizes",
        nargs="+",
        choices=[*SIZES, REAL],
        help=f"part (1) at these sizes (default: the toy sizes, then {REAL})",
    )
    parser.add_argument(
        "--sync-only",
        action="store_true",
        help="part (2) alone: the weight sync, without the GRPO race (its 'sizes' empty)",
    )
    parser.add_argument("--child", nargs=3, metavar=("KIND", "SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--trl", nargs=3, metavar=("SPEC", "SETUP", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, spec_path, out_path = args.child
        result = CHILDREN[kind](json.loads(Path(spec_path).read_text()))
        Path(out_path).write_text(json.dumps(result))
        return
    if args.trl:
        spec_path, setup, port = args.trl
        spec = json.loads(Path(spec_path).read_text())
        run_trl_rank(spec, TRLSetup(**json.loads(setup)), int(port))
        return

    plan = dict(QUICK if args.quick else FULL)
    if args.steps:
        plan["steps"] = args.steps
    if args.sync_only:
        plan["sizes"] = []
    if args.sizes:
        plan["sizes"] = args.sizes
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    sizes: dict[str, Any] = {}
    for size in plan["sizes"]:
        workload = {
            key: plan[key] for key in ("prompts", "group_size", "max_new_tokens", "warmup", "steps")
        }
        if size == REAL:
            workload.update(REAL_WORKLOAD, one_at_a_time=REAL_ONE_AT_A_TIME)
        count = workload["warmup"] + workload["steps"]
        batches = prompt_batches(workload["prompts"], count, size)
        spec = {**workload, "batches": batches, "quick": args.quick, "size": size}
        race = run_child("race", spec)
        ours = summarise(race["rlstack"])
        baselines = {
            name: summarise(side)
            for name, side in race["trl"].items()
            if not side["dropped_after_warmup"]
        }
        # The target is held against TRL's fastest setup on this machine, in this run.
        fastest = max(baselines, key=lambda name: baselines[name]["completion_tokens_per_s"])
        ratios = {
            name: ours["completion_tokens_per_s"] / theirs["completion_tokens_per_s"]
            for name, theirs in baselines.items()
        }
        sizes[size] = {
            "parameters": parameter_count(size),
            "model_kwargs": SIZES.get(size, {"path": "HuggingFaceTB/SmolLM2-135M-Instruct"}),
            "workload": workload,
            "rlstack": {**ours, **race["rlstack"]},
            "trl": {
                name: {**baselines.get(name, {}), **side} for name, side in race["trl"].items()
            },
            "trl_fastest": fastest,
            "throughput_ratio": ratios[fastest],
            "throughput_ratio_by_trl_setup": ratios,
            "step_time_ratio_trl_over_rlstack": baselines[fastest]["seconds_per_step"]
            / ours["seconds_per_step"],
            "met": ratios[fastest] >= THROUGHPUT_TARGET,
        }
    syncs = {
        size: weight_sync_summary(size, run_sync({"size": size, "repeats": plan["sync_repeats"]}))
        for size in plan["sync_sizes"]
    }
    report = {
        "benchmark": "grpo_step",
        "quick": args.quick,
        "torch": version("torch"),
        "trl": version("trl"),
        "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)),
        "cores_per_side": CORES,
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
            f"(2 scoring processes); Ray on {CORES} CPUs, workers at nice 0; "
            "taking turns step by step with each TRL setup, no two steps at once. "
            f"{REAL}: configs/grpo_smollm2.py, one FSDP2 rank ({CORES} torch threads: "
            f"actor.cpus_per_worker={CORES}) with vLLM's CPU engine in its process (weights "
            "reloaded in place after each update, rollout.min_new_tokens = max_new_tokens), "
            "reward in its own worker (one logical CPU more for Ray, on the same "
            f"{CORES} cores)"
        ),
        "baseline": (
            "trl.GRPOTrainer(use_cpu=True, bf16=False, gradient_checkpointing=False) in each "
            "setup of trl_setups (one process with 1 thread, the reference; one process with "
            "every core's thread; torchrun with a CPU process per core, gloo DDP): "
            "model.generate, the reward function and the update in each process; "
            "per_device_train_batch_size = prompts x group size / processes (one generation "
            "per step); the target is held against the fastest setup"
        ),
        "sizes": sizes,
        "throughput_target": {"rlstack_over_trl_at_least": THROUGHPUT_TARGET},
        # The last size's (the real model's in the full run) holds the targets.
        "weight_sync": syncs[plan["sync_sizes"][-1]],
        "weight_sync_by_size": syncs,
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
