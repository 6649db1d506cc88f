"""The ``reasoning`` runner: GRPO (and PPO-style losses) on a language model.

One step, as the loop below reads: prompts → rollout → reward → reference
log-probs (when KL is on) → advantages and actor update (rlcore) → weight
sync → metrics → checkpoint / eval, each timed under ``time/``.

    python -m rlshell.train configs/grpo.py
"""

from __future__ import annotations

import shutil
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from attrs import evolve

from rlshell.checkpoint import (
    TrainerState,
    clean_partials,
    commit,
    prune,
    read_trainer_state,
    resolve_resume,
    staging_dir,
    write_trainer_state,
)
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import ComponentPlan, PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config, DataConfig
from rlshell.config.loading import ConfigError
from rlshell.data import ArithmeticTask, PromptExample, PromptSampler, SamplerState, load_dataset
from rlshell.metrics import logger_for_run, plot_run, tokens_per_second
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.tokenizer import ensure_tokenizer, load_tokenizer
from rlshell.workers.actor import ActorWorker
from rlshell.workers.reward import RewardWorker
from rlshell.workers.rollout import ReferenceWorker, RolloutWorker

__all__ = [
    "ReasoningTrainer",
    "arithmetic_task_of",
    "prepare_tokenizer",
    "rollout_shares_actor",
    "run",
    "with_tokenizer_ids",
]


def rollout_shares_actor(plan: PlacementPlan) -> bool:
    """Whether the rollout runs inside the actor's processes (both in one placement key).

    That is the collocated case: the same processes (or devices) under the
    same placement, so weights are synced in memory. Otherwise the rollout is
    its own worker group.
    """
    actor, rollout = plan.component("actor"), plan.component("rollout")
    return _same_slots(actor, rollout)


def _same_slots(a: ComponentPlan, b: ComponentPlan) -> bool:
    def slots(plan: ComponentPlan) -> list[tuple[int, int, tuple[int, ...]]]:
        return [(w.node_rank, w.local_rank, w.gpus) for w in plan.workers]

    return a.placement == b.placement and slots(a) == slots(b)


def run(config: Config, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> None:
    """Train until ``runner.max_steps``, resuming first when ``checkpoint.resume`` says so."""
    run_dir.mkdir(parents=True, exist_ok=True)
    clean_partials(run_dir)
    resume_from = resolve_resume(config.checkpoint.resume, run_dir)
    tokenizer_dir = prepare_tokenizer(config, run_dir)
    config = with_tokenizer_ids(config, tokenizer_dir)
    task = arithmetic_task_of(config.data)
    train_set = load_dataset(config.data, "train", task)
    val_set = load_dataset(config.data, "val", task) if config.runner.eval_interval else []
    sampler = PromptSampler(train_set, config.runner.prompts_per_step, seed=config.runner.seed)
    with ExitStack() as stack:
        trainer = stack.enter_context(ReasoningTrainer.launch(config, cluster, plan, tokenizer_dir))
        start_step = 0
        if resume_from is not None:
            state = read_trainer_state(resume_from)
            start_step = trainer.load_checkpoint(resume_from)
            sampler.load_state(SamplerState(state.sampler_epoch, state.sampler_position))
            print(f"resumed from {resume_from} (step {start_step})", flush=True)
        trainer.sync_weights(full=True)
        logger = stack.enter_context(logger_for_run(config, run_dir, start_step))
        if start_step == 0 and val_set:
            logger.log(0, trainer.evaluate(val_set, step=0))
        saved: dict[str, float] = {}
        for step in range(start_step + 1, config.runner.max_steps + 1):
            metrics = trainer.step(step, sampler.next())
            if val_set and step % config.runner.eval_interval == 0:
                metrics.update(trainer.evaluate(val_set, step=step))
            # Logged before the checkpoint: a checkpoint of step N implies its metrics
            # are on disk. The time a save took is reported with the step after it.
            logger.log(step, {**metrics, **saved})
            saved = {}
            if _checkpoint_due(config, step):
                with _timed(saved, "time/checkpoint"):
                    trainer.save_checkpoint(run_dir, step, sampler.state())
    plot_run(run_dir)
    if config.checkpoint.export_hf and config.checkpoint.interval:
        from rlshell.checkpoint import list_checkpoints
        from rlshell.export import export_checkpoint

        checkpoints = list_checkpoints(run_dir)
        if checkpoints:
            out = export_checkpoint(checkpoints[-1][1], run_dir / "hf_model")
            print(f"exported the final policy to {out}", flush=True)


def arithmetic_task_of(data: DataConfig) -> ArithmeticTask:
    return ArithmeticTask(
        num_terms=data.num_terms,
        max_operand=data.max_operand,
        num_val=data.num_val,
        num_train=data.num_train,
        seed=data.seed,
    )


def prepare_tokenizer(config: Config, run_dir: Path) -> Path:
    """The tokenizer directory of a run: given, the model's own, or the project's, built here."""
    model = config.actor.model
    if model.tokenizer_path is not None:
        path = Path(model.tokenizer_path)
    elif model.path is not None:
        path = Path(model.path)
    else:
        path = run_dir / "tokenizer"
        ensure_tokenizer(path)
        return path
    load_tokenizer(path)  # a clear error now, not in every worker
    return path


def with_tokenizer_ids(config: Config, tokenizer_dir: Path) -> Config:
    """For a model built from ``model_kwargs``: vocabulary size and special ids from the tokenizer.

    An explicit ``vocab_size`` smaller than the tokenizer's vocabulary is an
    error (tokens would index past the embedding).
    """
    model = config.actor.model
    if model.path is not None:
        return config
    tokenizer = load_tokenizer(tokenizer_dir)
    size = len(tokenizer)
    kwargs = dict(model.model_kwargs)
    given = kwargs.get("vocab_size")
    if given is not None and int(given) < size:
        raise ConfigError(
            [
                f"actor.model.model_kwargs.vocab_size: {given} is smaller than the tokenizer's "
                f"{size} tokens ({tokenizer_dir}); remove it to use the tokenizer's size"
            ]
        )
    kwargs.setdefault("vocab_size", size)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, key)
        if value is not None:
            kwargs.setdefault(key, int(value))
    actor = evolve(config.actor, model=evolve(model, model_kwargs=kwargs))
    return evolve(config, actor=actor)


def _checkpoint_due(config: Config, step: int) -> bool:
    interval = config.checkpoint.interval
    return bool(interval) and (step % interval == 0 or step == config.runner.max_steps)


@contextmanager
def _timed(metrics: dict[str, float], key: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - start


def _seed(*parts: int) -> int:
    """A sampling seed that depends only on the run's seed, the step and the worker."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class ReasoningTrainer:
    """The worker groups of a run and the one-step choreography between them.

    ``with ReasoningTrainer.launch(config, cluster, plan, tokenizer_dir) as t:``
    starts every group the plan names; `step` runs one GRPO step and returns
    its metrics; `evaluate`, `sync_weights`, `save_checkpoint` and
    `load_checkpoint` do what they say. `run` is the loop around it.
    """

    def __init__(self, config: Config, tokenizer_dir: Path) -> None:
        self.config = config
        self.tokenizer_dir = tokenizer_dir
        self.actor: WorkerGroup[ActorWorker] | None = None
        self.rollout: WorkerGroup[Any] | None = None
        self.reward: WorkerGroup[RewardWorker] | None = None
        self.reference: WorkerGroup[ReferenceWorker] | None = None
        self.hybrid = False
        self.pad_id = 0

    @classmethod
    @contextmanager
    def launch(
        cls, config: Config, cluster: Cluster, plan: PlacementPlan, tokenizer_dir: Path
    ) -> Iterator[ReasoningTrainer]:
        trainer = cls(config, tokenizer_dir)
        try:
            trainer._launch(cluster, plan)
            yield trainer
        finally:
            trainer.shutdown()

    def _launch(self, cluster: Cluster, plan: PlacementPlan) -> None:
        config = self.config
        timeout = config.cluster.call_timeout_s
        self.hybrid = rollout_shares_actor(plan)
        started = time.perf_counter()
        self.actor = ActorWorker.create_group(config, config.runner.max_steps, self.hybrid).launch(
            cluster, plan.component("actor"), call_timeout_s=timeout
        )
        self.reward = RewardWorker.create_group(config.reward).launch(
            cluster, plan.component("reward"), call_timeout_s=timeout
        )
        if not self.hybrid:
            self.rollout = RolloutWorker.create_group(config).launch(
                cluster, plan.component("rollout"), call_timeout_s=timeout
            )
        if config.algorithm.kl_coef > 0:
            self.reference = ReferenceWorker.create_group(config).launch(
                cluster, plan.component("reference"), call_timeout_s=timeout
            )
        calls = [self.actor.init_worker(str(self.tokenizer_dir))]
        if self.rollout is not None:
            calls.append(self.rollout.init_worker(str(self.tokenizer_dir)))
        if self.reference is not None:
            calls.append(self.reference.init_worker())
        for call in calls:
            call.wait()
        if self.rollout is None:
            self.rollout = self.actor
        else:
            self.actor.execute_on(0).set_rollout_handles(self.rollout.actors).wait()
        tokenizer = load_tokenizer(self.tokenizer_dir)
        self.pad_id = int(tokenizer.pad_token_id)
        where = "collocated with the actor" if self.hybrid else "in its own workers"
        print(
            f"workers up in {time.perf_counter() - started:.1f} s "
            f"(rollout {where}, weight sync '{config.rollout.weight_sync}')",
            flush=True,
        )

    # -- the step

    def step(self, step: int, prompts: Sequence[PromptExample]) -> dict[str, float]:
        config = self.config
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        params = SamplingParams(
            n=config.algorithm.group_size,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            top_k=config.rollout.top_k,
            max_new_tokens=config.rollout.max_new_tokens,
        )
        with _timed(metrics, "time/rollout"):
            batch = self.generate([p.prompt for p in prompts], params, step)
        answers = [p.answer for p in prompts for _ in range(params.n)]
        with _timed(metrics, "time/reward"):
            scored = self._reward().score(list(batch.response_texts), answers).wait()[0]
        scores = torch.tensor(scored.scores, dtype=torch.float32)
        ref_logprobs = None
        if self.reference is not None:
            with _timed(metrics, "time/reference"):
                ref_logprobs = self._reference_logprobs(batch)
        with _timed(metrics, "time/update"):
            train = self._actor().run_training(batch, scores, ref_logprobs).wait()[0]
        with _timed(metrics, "time/sync"):
            sync = self.sync_weights(full=False)
        step_time = time.perf_counter() - started
        metrics.update(train)
        metrics.update(scored.metrics())
        metrics.update(sync)
        metrics.update(_rollout_metrics(batch, scores, params.n))
        metrics["time/step"] = step_time
        metrics["perf/tokens_per_s"] = tokens_per_second(batch.num_tokens, step_time)
        metrics["perf/completion_tokens_per_s"] = tokens_per_second(
            int(batch.response_mask.sum()), step_time
        )
        return metrics

    def generate(self, prompts: Sequence[str], params: SamplingParams, step: int) -> RolloutBatch:
        """Prompts split evenly over the rollout ranks; one batch back, in prompt order."""
        group = self._rollout_group()
        ranks = group.world_size
        shares = [list(prompts[rank::ranks]) for rank in range(ranks)]
        busy = [rank for rank in range(ranks) if shares[rank]]
        seeds = [_seed(self.config.runner.seed, step, rank) for rank in busy]
        calls = [
            group.execute_on(rank).generate(shares[rank], params, seed)
            for rank, seed in zip(busy, seeds, strict=True)
        ]
        parts = [call.wait()[0] for call in calls]
        merged = RolloutBatch.concat(parts, self.pad_id)
        # Rank r answered prompts r, r+R, ...: put the groups back in prompt order.
        order = _interleave_order([len(shares[rank]) for rank in busy], params.n)
        return merged.select(order, group_size=params.n)

    def evaluate(self, examples: Sequence[PromptExample], step: int) -> dict[str, float]:
        """Greedy decoding on the held-out split: ``eval/accuracy`` is the mean reward."""
        started = time.perf_counter()
        params = SamplingParams(n=1, max_new_tokens=self.config.rollout.max_new_tokens, greedy=True)
        batch = self.generate([e.prompt for e in examples], params, step)
        scored = self._reward().score(list(batch.response_texts), [e.answer for e in examples])
        result = scored.wait()[0]
        return {
            "eval/accuracy": sum(result.scores) / len(result.scores),
            "eval/response_length": float(batch.response_lengths.float().mean()),
            "time/eval": time.perf_counter() - started,
        }

    def sync_weights(self, full: bool) -> dict[str, float]:
        if self.hybrid and self.config.rollout.weight_sync == "shared":
            return {"rollout/sync_bytes": 0.0}  # the engine generates with the actor's module
        actor = self._actor()
        results = actor.sync_model_to_rollout(full=full).wait()
        if not self.hybrid:
            rollout = self._rollout_group()
            rollout.finish_sync(full).wait()
        stats: dict[str, float] = results[0]
        return {f"rollout/sync_{key}": value for key, value in stats.items()}

    def _reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        reference = self.reference
        assert reference is not None
        ranks = reference.world_size
        rows = [list(range(rank, batch.rows, ranks)) for rank in range(ranks)]
        calls = [
            (mine, reference.execute_on(rank).compute_ref_logprobs(batch.select(mine)))
            for rank, mine in enumerate(rows)
            if mine
        ]
        out = torch.zeros_like(batch.logprobs)
        for mine, call in calls:
            part = call.wait()[0]
            out[torch.as_tensor(mine), : part.shape[1]] = part
        return out

    # -- checkpoints

    def save_checkpoint(self, run_dir: Path, step: int, sampler: SamplerState) -> Path:
        staging = staging_dir(run_dir, step)
        self._actor().save_checkpoint(str(staging), step).wait()
        shutil.copytree(self.tokenizer_dir, staging / "tokenizer")
        write_trainer_state(
            staging,
            TrainerState(
                step=step,
                sampler_epoch=sampler.epoch,
                sampler_position=sampler.position,
                experiment_name=self.config.runner.experiment_name,
            ),
        )
        final = commit(staging, run_dir, step)
        prune(run_dir, self.config.checkpoint.keep_last)
        return final

    def load_checkpoint(self, path: Path) -> int:
        steps = self._actor().load_checkpoint(str(path)).wait()
        return int(steps[0])

    # -- plumbing

    def _actor(self) -> WorkerGroup[ActorWorker]:
        if self.actor is None:
            raise RuntimeError("the actor group is not running")
        return self.actor

    def _rollout_group(self) -> WorkerGroup[Any]:
        if self.rollout is None:
            raise RuntimeError("the rollout group is not running")
        return self.rollout

    def _reward(self) -> Any:
        if self.reward is None:
            raise RuntimeError("the reward group is not running")
        return self.reward.execute_on(0)

    def shutdown(self) -> None:
        groups = [self.reference, self.reward, self.actor]
        if self.rollout is not None and self.rollout is not self.actor:
            groups.append(self.rollout)
        for group in groups:
            if group is not None:
                group.shutdown()


def _interleave_order(counts: Sequence[int], n: int) -> list[int]:
    """Row order that undoes a round-robin split of prompts (``n`` rows per prompt)."""
    offsets = [sum(counts[:rank]) for rank in range(len(counts))]
    total = sum(counts)
    order: list[int] = []
    for prompt in range(total):
        rank, index = prompt % len(counts), prompt // len(counts)
        start = (offsets[rank] + index) * n
        order.extend(range(start, start + n))
    return order


def _rollout_metrics(batch: RolloutBatch, scores: torch.Tensor, n: int) -> dict[str, float]:
    lengths = batch.response_lengths.float()
    grouped = scores.view(-1, n)
    solved = (grouped > 0).any(dim=1).float().mean()
    uniform = (grouped.max(dim=1).values == grouped.min(dim=1).values).float().mean()
    return {
        "rollout/response_length": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/tokens": float(batch.num_tokens),
        "rollout/groups_solved": float(solved),
        "rollout/groups_uniform": float(uniform),
    }
