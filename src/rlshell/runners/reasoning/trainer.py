"""The ``reasoning`` trainer: GRPO (and PPO-style losses) on a language model.

One step, as `ReasoningTrainer.train_on` reads: prompts → rollout
(`generation`) → reward (`scoring`) → reference log-probs (when KL is on) →
advantages (`rlshell.rollout.advantages`, on the driver) and the actor's
update → weight sync (`weight_sync`) → metrics, each timed under ``time/``.
Where the plan has the actor and the rollout time-share GPUs they take turns
on them (`turns`). The run loop around it (`rlshell.runners.loop`)
evaluates, logs and saves.

    python -m rlshell.train configs/grpo.py
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from attrs import frozen

from rlcore.masked import masked_mean, masked_var
from rlshell.checkpoint import QUEUE_FILE, TrainerState, queue_problem
from rlshell.cluster.errors import WorkerError
from rlshell.cluster.group import WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.data import PromptExample, PromptSampler, SamplerState, load_prompts
from rlshell.engines.rollout.multi_turn import agent_metrics, check_turns
from rlshell.metrics import tokens_per_second
from rlshell.rewards.weighted import WeightedScores
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.rollout.advantages import compute_advantages
from rlshell.runners.async_rollout import AsyncRollouts, Slot, load_queue, save_queue
from rlshell.runners.facts import RunFacts
from rlshell.runners.loop import timed
from rlshell.runners.offload import OffloadPlan, plan_offload
from rlshell.runners.reasoning.generation import (
    Generation,
    Generator,
    training_sampling_params,
)
from rlshell.runners.reasoning.groups import ReasoningGroups, launch_groups, reference_logprobs
from rlshell.runners.reasoning.kl_penalty import KLPenalty
from rlshell.runners.reasoning.scoring import DynamicSampling, Scoring, shaped_scores
from rlshell.runners.reasoning.turns import GpuTurns
from rlshell.runners.reasoning.weight_sync import WeightSync
from rlshell.runners.rules.reasoning import ReasoningRules, optimizer_steps_per_batch
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import closed_on_failure
from rlshell.tokenizer import load_tokenizer, prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.actor import ActorWorker

__all__ = ["ReasoningTrainer"]


@frozen
class _Running:
    """What a launched trainer composes: its groups and the collaborators built on them."""

    groups: ReasoningGroups
    turns: GpuTurns
    generator: Generator
    weights: WeightSync
    dynamic: DynamicSampling


class ReasoningTrainer(ReasoningRules):
    """The worker groups of a reasoning run and the one-step choreography between them.

    ``ReasoningTrainer.launch(spec, cluster, plan, run_dir)`` builds the run's
    tokenizer and prompt sampler and starts every group the plan names;
    `step` runs one GRPO step on the next prompts and returns its metrics;
    `evaluate` scores greedy answers on the held-out split; `save` and `load`
    do what they say. The run loop (`rlshell.runners.loop`) drives it.

    The phases are collaborators it composes: `Generator` (rollout requests),
    `Scoring` and `DynamicSampling` (rewards), `KLPenalty` (β), `GpuTurns`
    (offload between phases), `WeightSync` (actor → rollout) and
    `rlshell.runners.async_rollout.AsyncRollouts` (``runner.mode='async'``).
    Reward failures are loud: see `rlshell.runners.reasoning.scoring`.
    """

    curves: ClassVar[tuple[str, ...]] = ("reward/mean", "eval/accuracy")

    def __init__(
        self,
        config: Config,
        facts: RunFacts,
        tokenizer_dir: str,
        offload: OffloadPlan | None = None,
    ) -> None:
        self.config = config  # facts.config with the tokenizer's ids
        self.facts = facts
        self.tokenizer_dir = tokenizer_dir
        self.offload = offload or OffloadPlan()
        self._stack = ExitStack()  # each group's shutdown, from the moment its actors exist
        self._running: _Running | None = None
        self.train_set: list[PromptExample] = []
        self.val_set: list[PromptExample] = []
        self.sampler: PromptSampler | None = None
        self.scoring = Scoring(config.reward)
        self.kl = KLPenalty(config.algorithm)
        # The actor's version: how many updates its weights have had (runner.mode='async'
        # tags rollouts with the version that sampled them).
        self.version = 0
        self.pipeline: AsyncRollouts | None = None
        self._t0 = time.time()  # the async timeline's origin
        self._salvaging = False  # saving after a rollout worker died (salvage)

    def report_to(self, print_line: Callable[[str], None]) -> None:
        """Print what the run should hear (reward failures) with ``print_line`` from now on."""
        self.scoring.print_line = print_line

    # -- launching

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        config = spec.config
        tokenizer_dir = prepare_tokenizer(config, run_dir)
        if config.agent.tools:  # how turns end, checked before any worker starts
            check_turns(config, load_tokenizer(tokenizer_dir))
        trainer = cls(
            with_tokenizer_ids(config, tokenizer_dir),
            spec,
            tokenizer_dir,
            plan_offload(spec, plan),
        )
        return closed_on_failure(trainer, lambda: trainer._launch(cluster, plan))

    def _launch(self, cluster: Cluster, plan: PlacementPlan) -> None:
        config = self.config

        def tokenizer() -> Any:
            return load_tokenizer(self.tokenizer_dir)

        self.train_set = load_prompts(config.data, "train", tokenizer)
        self.val_set = (
            load_prompts(config.data, "val", tokenizer) if config.runner.eval_interval else []
        )
        self.sampler = PromptSampler(
            self.train_set, config.runner.prompts_per_step, seed=config.runner.seed
        )
        started = time.perf_counter()
        groups = launch_groups(self._stack, cluster, plan, config, self.facts, self.tokenizer_dir)
        pad_id = int(tokenizer().pad_token_id)
        turns = GpuTurns(self.offload, groups.actor, groups.rollout)
        asynchronous = config.runner.mode == "async"
        self._running = _Running(
            groups=groups,
            turns=turns,
            generator=Generator(config, groups.rollout, pad_id, before=turns.rollout),
            weights=WeightSync(
                config, groups.actor, groups.rollout, self.facts.rollout_in_actor, asynchronous
            ),
            dynamic=DynamicSampling(config, self._sample_and_score, self._sampler().next, pad_id),
        )
        if asynchronous:
            self.pipeline = AsyncRollouts(
                config.algorithm.max_staleness, self._submit_step, self._resubmit
            )
        where = "collocated with the actor" if self.facts.rollout_in_actor else "in its own workers"
        print(
            f"workers up in {time.perf_counter() - started:.1f} s "
            f"(rollout {where}, weight sync '{config.rollout.weight_sync}'"
            f"{turns.describe()})",
            flush=True,
        )

    # -- the step

    def step(self, step: int) -> dict[str, float]:
        """One GRPO step on the sampler's next prompts (``runner.mode='async'``: on the
        rollout queued for this step)."""
        if self.pipeline is not None:
            return self._async_step(step, self.pipeline)
        return self.train_on(step, self._sampler().next())

    def train_on(self, step: int, prompts: Sequence[PromptExample]) -> dict[str, float]:
        """One GRPO step on ``prompts``: rollout, reward, (reference), update, sync."""
        metrics: dict[str, float] = {}
        self.running.weights.ensure(self.version)
        started = time.perf_counter()
        params = training_sampling_params(self.config)
        batch, scored = self._sample_and_score(prompts, params, step, 0, metrics)
        return self._learn(
            step, batch, shaped_scores(self.config, batch, scored), scored, params, metrics, started
        )

    def _async_step(self, step: int, pipeline: AsyncRollouts) -> dict[str, float]:
        """One step of ``runner.mode='async'``: the batch queued ``max_staleness`` steps ago
        (or sooner), its update while the rollout generates the next ones, then the new
        weights queued behind them (`rlshell.runners.async_rollout`)."""
        running = self.running
        metrics: dict[str, float] = {}
        running.weights.ensure(self.version)
        running.weights.check(wait=False)  # before the step takes its rollout from the queue
        started = time.perf_counter()
        params = training_sampling_params(self.config)
        with timed(metrics, "time/rollout"):  # the actor's wait for this step's rollout
            slot, queue = pipeline.take(step, self.version)
            merged = running.generator.merge(
                [r.batch for r in slot.collect()], slot.counts, params.n
            )
        metrics.update(queue)
        metrics["async/generate_s"] = queue["async/generate_end"] - queue["async/generate_start"]
        for key in ("async/generate_start", "async/generate_end"):  # seconds since launch
            metrics[key] -= self._t0
        scored = self.scoring.score(
            self._reward(), slot.prompts, merged, params.n, step, 0, metrics
        )
        metrics["async/update_start"] = time.time() - self._t0
        scores = shaped_scores(self.config, merged, scored)
        out = self._learn(step, merged, scores, scored, params, metrics, started)
        out["async/update_end"] = time.time() - self._t0
        return out

    def _sample_and_score(
        self,
        prompts: Sequence[PromptExample],
        params: SamplingParams,
        step: int,
        round_: int,
        metrics: dict[str, float],
    ) -> tuple[RolloutBatch, WeightedScores]:
        """Generate ``params.n`` responses per prompt and score them (``round_``: the sampling
        round of dynamic sampling, 0 for a step's first)."""
        suffix = "" if round_ == 0 else "_resample"
        with timed(metrics, f"time/rollout{suffix}"):
            batch = self.generate([p.prompt for p in prompts], params, step, round_)
        scored = self.scoring.score(self._reward(), prompts, batch, params.n, step, round_, metrics)
        return batch, scored

    def _learn(
        self,
        step: int,
        batch: RolloutBatch,
        scores: torch.Tensor,
        scored: WeightedScores,
        params: SamplingParams,
        metrics: dict[str, float],
        started: float,
    ) -> dict[str, float]:
        """The step from a scored batch on: reference, advantages, update, weight sync."""
        config = self.config
        running = self.running
        groups = running.groups
        if config.algorithm.dynamic_sampling:
            with timed(metrics, "time/dynamic_sampling"):
                batch, scores = running.dynamic.informative_batch(
                    batch, scores, scored, batch.rows // params.n, params, step, metrics
                )
        # The critic's values (its own processes) while the reference and actor compute theirs.
        values_call = None if groups.critic is None else groups.critic.compute_values(batch)
        ref_logprobs = None
        if groups.reference is not None:
            with timed(metrics, "time/reference"):
                ref_logprobs = reference_logprobs(groups.reference, batch)
        running.turns.update()
        old_logprobs = None
        actor_trains = groups.critic is None or step > config.critic.warmup_steps
        several = actor_trains and optimizer_steps_per_batch(config) > 1
        # The KL penalty in the reward is taken on π_old: recomputed unless old_logprobs says
        # the rollout's (as the policy ratio does).
        kl_in_reward = self.kl.in_reward
        if several or (kl_in_reward and config.algorithm.old_logprobs == "recompute"):
            with timed(metrics, "time/old_logprobs"):
                old_logprobs = groups.actor.compute_logprobs(batch).wait()[0]
        values = None
        if values_call is not None:
            with timed(metrics, "time/values"):
                values = values_call.wait()[0]
        token_rewards = None
        if kl_in_reward:
            assert ref_logprobs is not None
            sampled = batch.logprobs if old_logprobs is None else old_logprobs
            token_rewards = self.kl.penalised(batch, scores, sampled, ref_logprobs, metrics)
            ref_logprobs = None  # the penalty is in the reward: the loss has no KL term
        estimate = compute_advantages(batch, scores, config, values, token_rewards)
        with timed(metrics, "time/update"):
            critic_call = None
            if groups.critic is not None and values is not None:
                critic_call = groups.critic.run_training(batch, estimate.returns, values)
            train: dict[str, float] = {}
            if actor_trains:
                actor_call = groups.actor.run_training(
                    batch, estimate.advantages, ref_logprobs, old_logprobs
                )
                train = actor_call.wait()[0]
            if critic_call is not None:
                assert values is not None
                train.update(critic_call.wait()[0])
                train.update(_value_metrics(values, estimate.returns, batch.trained_mask))
        with timed(metrics, "time/sync"):
            sync = {}
            if actor_trains:
                self.version = step
                sync = self.sync_weights(full=False)
        step_time = time.perf_counter() - started
        metrics.update(train)
        metrics.update(scored.metrics())
        metrics.update(sync)
        correct = torch.tensor(scored.correct.scores, dtype=torch.float32)
        metrics.update(_rollout_metrics(batch, scores, correct, params.n))
        metrics.update(agent_metrics(batch))
        if config.algorithm.overlong_buffer is not None:
            metrics["reward/shaped_mean"] = float(scores.mean())
        metrics["time/step"] = step_time
        if running.turns.offload.any:
            metrics["time/offload"] = running.turns.take_seconds()
        metrics["perf/tokens_per_s"] = tokens_per_second(batch.num_tokens, step_time)
        metrics["perf/completion_tokens_per_s"] = tokens_per_second(
            int(batch.response_mask.sum()), step_time
        )
        return metrics

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, step: int, round_: int = 0
    ) -> RolloutBatch:
        """Prompts split evenly over the rollout ranks; one batch back, in prompt order."""
        return self.running.generator.generate(prompts, params, step, round_)

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy decoding on the held-out split: ``eval/accuracy`` is the mean score of the
        correctness reward, ``reward.reward_type`` (the only reward scored here)."""
        return self.evaluate_on(self.val_set, step)

    def evaluate_on(self, examples: Sequence[PromptExample], step: int) -> dict[str, float]:
        self.running.weights.ensure(self.version)
        started = time.perf_counter()
        params = SamplingParams(n=1, max_new_tokens=self.config.rollout.max_new_tokens, greedy=True)
        batch = self.generate([e.prompt for e in examples], params, step)
        texts, answers = list(batch.response_texts), [e.answer for e in examples]
        result = self.scoring.correctness(
            self._reward(), texts, answers, f"the evaluation at step {step}"
        )
        agent = {
            key.replace("agent/", "eval/"): value
            for key, value in agent_metrics(batch).items()
            if key in ("agent/turns_mean", "agent/tool_calls_per_response", "agent/answered_frac")
        }
        return {
            **agent,
            "eval/accuracy": sum(result.scores) / len(result.scores),
            "eval/reward_failed_frac": result.failed_frac,
            "eval/response_length": float(batch.response_lengths.float().mean()),
            "time/eval": time.perf_counter() - started,
        }

    def sync_weights(self, full: bool) -> dict[str, float]:
        """The actor's weights to the rollout (``full``: every tensor, even in ``patch``
        mode); the ``rollout/sync_*`` metrics."""
        return self.running.weights.sync(full, self.version)

    # -- runner.mode='async'

    def _submit_step(self, step: int) -> Slot:
        """Draw step ``step``'s prompts and queue its rollout (`AsyncRollouts`)."""
        slot = Slot(step, self._sampler().next(), [])
        slot.ticket = self._resubmit(slot)
        return slot

    def _resubmit(self, slot: Slot) -> Generation:
        """Queue ``slot``'s prompts on the rollout workers (a restored slot's again: its
        rollout was lost with a worker); its per-worker counts follow the requests."""
        params = training_sampling_params(self.config)
        prompts = [p.prompt for p in slot.prompts]
        ticket = self.running.generator.submit(prompts, params, slot.step, 0, "generate_versioned")
        slot.counts = ticket.counts
        return ticket

    def salvage(self, error: BaseException) -> bool:
        """Whether the last completed step can still be saved after ``error``: in
        ``runner.mode='async'``, when a rollout worker failed (the actor holds the step's
        weights; the queued rollouts that finished are saved, the others' prompts kept)."""
        rollout_lost = isinstance(error, WorkerError) and error.component == "rollout"
        self._salvaging = self.pipeline is not None and rollout_lost
        return self._salvaging

    # -- checkpoints

    def save(self, directory: Path, step: int) -> TrainerState:
        running = self.running
        running.turns.update()  # the actor's state where it trains
        critic = running.groups.critic
        critic_saved = None if critic is None else critic.save_checkpoint(str(directory), step)
        running.groups.actor.save_checkpoint(str(directory), step).wait()
        if critic_saved is not None:
            critic_saved.wait()
        if Path(self.tokenizer_dir).is_dir():
            shutil.copytree(self.tokenizer_dir, directory / "tokenizer")
        else:  # a Hub id: the files as transformers loads them
            load_tokenizer(self.tokenizer_dir).save_pretrained(directory / "tokenizer")
        if self.pipeline is not None:
            # What was generated ahead is saved too: a resume trains on it first, once.
            queued = self.pipeline.drain(keep_failed=self._salvaging)
            save_queue(queued, directory / QUEUE_FILE)
            if not self._salvaging:  # (a dead worker's syncs failed with it)
                running.weights.check(wait=True)
        sampler = self._sampler().state()
        return TrainerState(
            step=step,
            sampler_epoch=sampler.epoch,
            sampler_position=sampler.position,
            experiment_name=self.config.runner.experiment_name,
            extra=self.kl.state(),
        )

    def load(self, checkpoint: Path, state: TrainerState) -> int:
        running = self.running
        running.turns.update()
        step = int(running.groups.actor.load_checkpoint(str(checkpoint)).wait()[0])
        if running.groups.critic is not None:
            running.groups.critic.load_checkpoint(str(checkpoint)).wait()
        self._sampler().load_state(SamplerState(state.sampler_epoch, state.sampler_position))
        self.version = step
        queue_file = checkpoint / QUEUE_FILE
        restored: list[Slot] = []
        if queue_file.is_file():
            restored = load_queue(queue_file)
        if self.pipeline is not None:
            self.pipeline.start_at(step, restored)
        elif restored:  # (refused before start: rlshell.runners.loop.run)
            raise ValueError(queue_problem(checkpoint, self.config.runner.mode))
        self.kl.restore(state.extra, checkpoint, self.scoring.print_line)
        running.weights.synced = False
        return step

    # -- plumbing

    @property
    def running(self) -> _Running:
        """The launched groups and collaborators (an error before `launch`)."""
        if self._running is None:
            raise RuntimeError("the trainer was not launched")
        return self._running

    @property
    def groups(self) -> ReasoningGroups:
        return self.running.groups

    @property
    def actor(self) -> WorkerGroup[ActorWorker]:
        return self.running.groups.actor

    def _reward(self) -> Any:
        return self.running.groups.reward.execute_on(0)

    def _sampler(self) -> PromptSampler:
        if self.sampler is None:
            raise RuntimeError("the trainer was not launched")
        return self.sampler

    def close(self) -> None:
        self._stack.close()


def _value_metrics(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How well the values before the update predicted the returns: their mean, the
    returns' mean and the explained variance 1 − Var[G − V] / Var[G] over valid tokens."""
    residual = masked_var(returns - values, mask)
    spread = masked_var(returns, mask)
    explained = 1.0 - float(residual) / float(spread) if float(spread) > 0 else 0.0
    return {
        "critic/values_mean": float(masked_mean(values, mask)),
        "critic/returns_mean": float(masked_mean(returns, mask)),
        "critic/explained_variance": explained,
    }


def _rollout_metrics(
    batch: RolloutBatch, scores: torch.Tensor, correct: torch.Tensor, n: int
) -> dict[str, float]:
    """``correct``: the correctness reward's scores (solved: > 0); ``scores``: the totals."""
    lengths = batch.response_lengths.float()
    grouped = scores.view(-1, n)
    solved = (correct.view(-1, n) > 0).any(dim=1).float().mean()
    uniform = (grouped.max(dim=1).values == grouped.min(dim=1).values).float().mean()
    return {
        "rollout/response_length": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/tokens": float(batch.num_tokens),
        "rollout/groups_solved": float(solved),
        "rollout/groups_uniform": float(uniform),
    }
