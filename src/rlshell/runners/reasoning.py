"""The ``reasoning`` trainer: GRPO (and PPO-style losses) on a language model.

One step, as `ReasoningTrainer.step` reads: prompts → rollout → reward →
reference log-probs (when KL is on) → advantages and actor update (rlcore) →
weight sync → metrics, each timed under ``time/``. Where the plan has the
actor and the rollout time-share GPUs they take turns on them, each moving
its state to host memory while the other computes (`rlshell.runners.offload`).
The run loop around it (`rlshell.runners.loop`) evaluates, logs and saves.

    python -m rlshell.train configs/grpo.py
"""

from __future__ import annotations

import shutil
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar, Self

import torch

from rlcore.shaping import (
    adaptive_kl_coef,
    filter_informative_groups,
    kl_penalized_rewards,
    overlong_penalty,
)
from rlshell.checkpoint import QUEUE_FILE, TrainerState, queue_problem
from rlshell.cluster.errors import WorkerDiedError, WorkerError
from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.cluster.placement import PlacementPlan
from rlshell.cluster.ray_cluster import Cluster
from rlshell.config import Config
from rlshell.data import PromptExample, PromptSampler, SamplerState, load_prompts
from rlshell.engines.rollout.multi_turn import agent_metrics, check_turns
from rlshell.metrics import tokens_per_second
from rlshell.rewards.failures import FailureWatches
from rlshell.rewards.pool import RewardResult
from rlshell.rewards.weighted import WeightedReward, WeightedScores
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.rollout.advantages import compute_advantages, outcome_token_rewards
from rlshell.runners.async_rollout import AsyncRollouts, Slot, load_queue, save_queue
from rlshell.runners.facts import trains_critic
from rlshell.runners.loop import timed
from rlshell.runners.offload import OffloadPlan, plan_offload
from rlshell.runners.rules.reasoning import ReasoningRules, optimizer_steps_per_batch
from rlshell.runners.spec import RunSpec
from rlshell.runners.trainer import Launch, launched_together
from rlshell.tokenizer import load_tokenizer, prepare_tokenizer, with_tokenizer_ids
from rlshell.workers.actor import ActorWorker
from rlshell.workers.critic import CriticWorker
from rlshell.workers.reward import RewardWorker
from rlshell.workers.rollout import ReferenceWorker, RolloutWorker

__all__ = ["ReasoningTrainer"]


def _seed(*parts: int) -> int:
    """A sampling seed that depends only on the run's seed, the step and the worker."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class ReasoningTrainer(ReasoningRules):
    """The worker groups of a reasoning run and the one-step choreography between them.

    ``ReasoningTrainer.launch(spec, cluster, plan, run_dir)`` builds the run's
    tokenizer and prompt sampler and starts every group the plan names;
    `step` runs one GRPO step on the next prompts and returns its metrics;
    `evaluate` scores greedy answers on the held-out split; `save` and `load`
    do what they say. The run loop (`rlshell.runners.loop`) drives it.

    The reward is ``reward.reward_type``'s, or the weighted total of
    ``reward.weights``' rewards (`rlshell.rewards.weighted`). Reward failures
    are loud (`rlshell.rewards.failures.FailureWatches`): the first failure of
    each kind of each reward is printed once a run, with its traceback, the
    reward function and the sample, through `report_to`'s printer; a step on
    which every call of one reward failed, the ``reward.max_failed_steps``-th
    in a row for that reward, raises `RewardFailedError` before its update.
    """

    curves: ClassVar[tuple[str, ...]] = ("reward/mean", "eval/accuracy")

    def __init__(
        self,
        config: Config,
        tokenizer_dir: str,
        rollout_in_actor: bool,
        offload: OffloadPlan | None = None,
    ) -> None:
        self.config = config
        self.tokenizer_dir = tokenizer_dir
        self.rollout_in_actor = rollout_in_actor
        self.offload = offload or OffloadPlan()
        self._phase: str | None = None  # "rollout" or "update": who has the shared GPUs now
        self._offload_seconds = 0.0
        self._stack = ExitStack()  # each group's shutdown, from the moment its actors exist
        self.actor: WorkerGroup[ActorWorker] | None = None
        self.rollout: WorkerGroup[Any] | None = None
        self.reward: WorkerGroup[RewardWorker] | None = None
        self.reference: WorkerGroup[ReferenceWorker] | None = None
        self.critic: WorkerGroup[CriticWorker] | None = None
        self.pad_id = 0
        self.train_set: list[PromptExample] = []
        self.val_set: list[PromptExample] = []
        self.sampler: PromptSampler | None = None
        self._synced = False  # whether the rollout holds the actor's current weights
        self.rewards = WeightedReward.of(config.reward)
        self.reward_watch = FailureWatches(self.rewards.functions(), config.reward.max_failed_steps)
        self._print_line: Callable[[str], None] = _print_to_stderr
        # β of the KL penalty in the reward (algorithm.kl_in_reward); adaptive with kl_target.
        self.kl_coef = config.algorithm.kl_coef
        # The actor's version: how many updates its weights have had (runner.mode='async'
        # tags rollouts with the version that sampled them).
        self.version = 0
        self.pipeline: AsyncRollouts | None = None
        self._sync_calls: list[GroupCall] = []  # async weight syncs queued on the rollout
        self._t0 = time.time()  # the async timeline's origin
        self._salvaging = False  # saving after a rollout worker died (salvage)

    def report_to(self, print_line: Callable[[str], None]) -> None:
        """Print what the run should hear (reward failures) with ``print_line`` from now on."""
        self._print_line = print_line

    # -- launching

    @classmethod
    def launch(cls, spec: RunSpec, cluster: Cluster, plan: PlacementPlan, run_dir: Path) -> Self:
        config = spec.config
        tokenizer_dir = prepare_tokenizer(config, run_dir)
        if config.agent.tools:  # how turns end, checked before any worker starts
            check_turns(config, load_tokenizer(tokenizer_dir))
        trainer = cls(
            with_tokenizer_ids(config, tokenizer_dir),
            tokenizer_dir,
            spec.rollout_in_actor,
            plan_offload(config, plan),
        )
        try:
            trainer._launch(cluster, plan)
        except BaseException:
            trainer.close()
            raise
        return trainer

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
        timeout = config.cluster.call_timeout_s
        started = time.perf_counter()
        total_updates = config.runner.max_steps * optimizer_steps_per_batch(config)
        # Every group's actors are created first, then waited for: their processes start and
        # import side by side (a failure stops them all: `launch` closes the trainer).
        actor = ActorWorker.create_group(config, total_updates, self.rollout_in_actor)
        reward = RewardWorker.create_group(config.reward)
        launches: list[Launch] = [
            (actor, plan.component("actor")),
            (reward, plan.component("reward")),
        ]
        if not self.rollout_in_actor:
            # Partial rollouts: syncs are offered in a thread of their own, while one generates.
            partial = config.runner.mode == "async" and config.rollout.partial_rollouts
            rollout = RolloutWorker.create_group(config)
            launches.append(
                (rollout, plan.component("rollout"), {"control": 1} if partial else None)
            )
        if config.algorithm.kl_coef > 0:
            reference = ReferenceWorker.create_group(config)
            launches.append((reference, plan.component("reference")))
        if trains_critic(config):
            critic_updates = config.runner.max_steps * optimizer_steps_per_batch(config)
            critic = CriticWorker.create_group(config, critic_updates)
            launches.append((critic, plan.component("critic")))
        launched_together(self._stack, cluster, timeout, *launches)
        self.actor, self.reward = actor, reward
        if not self.rollout_in_actor:
            self.rollout = rollout
        if config.algorithm.kl_coef > 0:
            self.reference = reference
        if trains_critic(config):
            self.critic = critic
        calls = [self.actor.init_worker(self.tokenizer_dir)]
        if self.rollout is not None:
            calls.append(self.rollout.init_worker(self.tokenizer_dir))
        if self.reference is not None:
            calls.append(self.reference.init_worker())
        if self.critic is not None:
            calls.append(self.critic.init_worker())
        for call in calls:
            call.wait()
        if self.rollout is None:
            self.rollout = self.actor
        else:
            self.actor.execute_on(0).set_rollout_handles(self.rollout.actors).wait()
        tokenizer = load_tokenizer(self.tokenizer_dir)
        self.pad_id = int(tokenizer.pad_token_id)
        if config.runner.mode == "async":
            self.pipeline = AsyncRollouts(
                config.algorithm.max_staleness, self._submit_step, self._resubmit
            )
        where = "collocated with the actor" if self.rollout_in_actor else "in its own workers"
        print(
            f"workers up in {time.perf_counter() - started:.1f} s "
            f"(rollout {where}, weight sync '{config.rollout.weight_sync}'"
            f"{_describe(self.offload)})",
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
        self._ensure_synced()
        started = time.perf_counter()
        params = self._sampling_params()
        batch, scored = self._sample_and_score(prompts, params, step, 0, metrics)
        return self._learn(step, batch, scored, params, metrics, started)

    def _async_step(self, step: int, pipeline: AsyncRollouts) -> dict[str, float]:
        """One step of ``runner.mode='async'``: the batch queued ``max_staleness`` steps ago
        (or sooner), its update while the rollout generates the next ones, then the new
        weights queued behind them (`rlshell.runners.async_rollout`)."""
        metrics: dict[str, float] = {}
        self._ensure_synced()
        self._check_syncs(wait=False)  # before the step takes its rollout from the queue
        started = time.perf_counter()
        params = self._sampling_params()
        with timed(metrics, "time/rollout"):  # the actor's wait for this step's rollout
            slot, queue = pipeline.take(step, self.version)
            merged = self._merge([r.batch for r in slot.collect()], slot.counts, params.n)
        metrics.update(queue)
        metrics["async/generate_s"] = queue["async/generate_end"] - queue["async/generate_start"]
        for key in ("async/generate_start", "async/generate_end"):  # seconds since launch
            metrics[key] -= self._t0
        scored = self._score(slot.prompts, merged, params, step, 0, metrics)
        metrics["async/update_start"] = time.time() - self._t0
        out = self._learn(step, merged, scored, params, metrics, started)
        out["async/update_end"] = time.time() - self._t0
        return out

    def _sampling_params(self) -> SamplingParams:
        config = self.config
        return SamplingParams(
            n=config.algorithm.group_size,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            top_k=config.rollout.top_k,
            max_new_tokens=config.rollout.max_new_tokens,
            min_new_tokens=config.rollout.min_new_tokens,
        )

    def _learn(
        self,
        step: int,
        batch: RolloutBatch,
        scored: WeightedScores,
        params: SamplingParams,
        metrics: dict[str, float],
        started: float,
    ) -> dict[str, float]:
        """The step from a scored batch on: reference, advantages, update, weight sync."""
        config = self.config
        prompts = batch.rows // params.n
        scores = self._shaped_scores(batch, scored)
        if config.algorithm.dynamic_sampling:
            with timed(metrics, "time/dynamic_sampling"):
                batch, scores = self._informative_batch(
                    batch, scores, scored, prompts, params, step, metrics
                )
        # The critic's values (its own processes) while the reference and actor compute theirs.
        values_call = None if self.critic is None else self.critic.compute_values(batch)
        ref_logprobs = None
        if self.reference is not None:
            with timed(metrics, "time/reference"):
                ref_logprobs = self._reference_logprobs(batch)
        self._update_phase()
        old_logprobs = None
        algorithm = config.algorithm
        actor_trains = self.critic is None or step > config.critic.warmup_steps
        several = actor_trains and optimizer_steps_per_batch(config) > 1
        # The KL penalty in the reward is taken on π_old: recomputed unless old_logprobs says
        # the rollout's (as the policy ratio does).
        kl_in_reward = self._kl_in_reward()
        if several or (kl_in_reward and algorithm.old_logprobs == "recompute"):
            with timed(metrics, "time/old_logprobs"):
                old_logprobs = self._actor().compute_logprobs(batch).wait()[0]
        values = None
        if values_call is not None:
            with timed(metrics, "time/values"):
                values = values_call.wait()[0]
        token_rewards = None
        if kl_in_reward:
            assert ref_logprobs is not None
            sampled = batch.logprobs if old_logprobs is None else old_logprobs
            token_rewards = self._kl_penalised(batch, scores, sampled, ref_logprobs, metrics)
            ref_logprobs = None  # the penalty is in the reward: the loss has no KL term
        estimate = compute_advantages(batch, scores, config, values, token_rewards)
        with timed(metrics, "time/update"):
            critic_call = None
            if self.critic is not None and values is not None:
                critic_call = self.critic.run_training(batch, estimate.returns, values)
            train: dict[str, float] = {}
            if actor_trains:
                actor_call = self._actor().run_training(
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
        if self.offload.any:
            metrics["time/offload"], self._offload_seconds = self._offload_seconds, 0.0
        metrics["perf/tokens_per_s"] = tokens_per_second(batch.num_tokens, step_time)
        metrics["perf/completion_tokens_per_s"] = tokens_per_second(
            int(batch.response_mask.sum()), step_time
        )
        return metrics

    def _kl_in_reward(self) -> bool:
        """Whether the KL term is a penalty in the reward (read only where a reference runs:
        with ``kl_coef`` 0 the key is declared unread)."""
        return self.config.algorithm.kl_coef > 0 and self.config.algorithm.kl_in_reward

    def _adaptive_kl(self) -> bool:
        """Whether β of the KL penalty in the reward moves (and so is checkpointed)."""
        return self._kl_in_reward() and self.config.algorithm.kl_target is not None

    def _kl_penalised(
        self,
        batch: RolloutBatch,
        scores: torch.Tensor,
        logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """The token rewards with the KL penalty of π_old (``logprobs``) against the
        reference at this step's β (`rlcore.shaping.kl_penalized_rewards`); β moves for the
        next step when ``algorithm.kl_target`` is set (`rlcore.shaping.adaptive_kl_coef`)."""
        algorithm = self.config.algorithm
        mask = batch.trained_mask
        placed = outcome_token_rewards(batch, scores)
        rewards, kl = kl_penalized_rewards(
            placed, logprobs.float(), ref_logprobs.float(), mask, self.kl_coef, algorithm.kl_kind
        )
        response_kl = float(kl.sum(-1).mean())  # KL of a response: summed over its tokens
        metrics["reward/kl"] = response_kl
        metrics["reward/kl_coef"] = self.kl_coef
        metrics["reward/kl_penalty"] = self.kl_coef * response_kl
        if algorithm.kl_target is not None:
            self.kl_coef = adaptive_kl_coef(
                self.kl_coef, response_kl, algorithm.kl_target, algorithm.kl_horizon, batch.rows
            )
        return rewards

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
        return batch, self._score(prompts, batch, params, step, round_, metrics)

    def _score(
        self,
        prompts: Sequence[PromptExample],
        batch: RolloutBatch,
        params: SamplingParams,
        step: int,
        round_: int,
        metrics: dict[str, float],
    ) -> WeightedScores:
        """The rewards of ``batch``'s responses to ``prompts`` (``params.n`` each)."""
        suffix = "" if round_ == 0 else "_resample"
        answers = [p.answer for p in prompts for _ in range(params.n)]
        with timed(metrics, f"time/reward{suffix}"):
            parts = self._reward().score(list(batch.response_texts), answers).wait()[0]
            scored = self.rewards.combine(parts, batch.response_lengths, params.n)
        self._report_failures(parts, f"step {step}")
        if round_ == 0:
            self.reward_watch.check(step, parts)  # before the update: no step on 0s only
        return scored

    def _shaped_scores(self, batch: RolloutBatch, scored: WeightedScores) -> torch.Tensor:
        """The scores the advantages read: the rewards' total plus DAPO's overlong penalty
        (``algorithm.overlong_buffer``)."""
        scores = torch.tensor(scored.scores, dtype=torch.float32)
        algorithm = self.config.algorithm
        if algorithm.overlong_buffer is not None:
            scores = scores + overlong_penalty(
                batch.response_lengths,
                self.config.rollout.max_new_tokens,
                algorithm.overlong_buffer,
                algorithm.overlong_penalty_factor,
            ).to(scores)
        return scores

    def _informative_batch(
        self,
        batch: RolloutBatch,
        scores: torch.Tensor,
        scored: WeightedScores,
        wanted: int,
        params: SamplingParams,
        step: int,
        metrics: dict[str, float],
    ) -> tuple[RolloutBatch, torch.Tensor]:
        """DAPO's dynamic sampling: ``wanted`` groups whose correctness scores differ,
        sampling further prompts for at most ``algorithm.max_sampling_rounds`` rounds."""
        n = params.n
        kept: list[tuple[RolloutBatch, torch.Tensor]] = []
        dropped: list[tuple[RolloutBatch, torch.Tensor]] = []

        def split(part: RolloutBatch, part_scores: torch.Tensor, result: WeightedScores) -> None:
            correct = torch.tensor(result.correct.scores, dtype=torch.float32).view(-1, n)
            informative = filter_informative_groups(correct).tolist()
            for group, keep in enumerate(informative):
                rows = list(range(group * n, (group + 1) * n))
                (kept if keep else dropped).append(
                    (part.select(rows, group_size=n), part_scores[rows])
                )

        split(batch, scores, scored)
        rounds, drawn = 1, wanted
        while len(kept) < wanted and rounds < self.config.algorithm.max_sampling_rounds:
            more = self._sampler().next()
            more_batch, more_scored = self._sample_and_score(more, params, step, rounds, metrics)
            split(more_batch, self._shaped_scores(more_batch, more_scored), more_scored)
            rounds += 1
            drawn += len(more)
        filled = max(0, wanted - len(kept))
        chosen = kept[:wanted] + dropped[:filled]
        metrics["rollout/sampling_rounds"] = float(rounds)
        metrics["rollout/prompts_drawn"] = float(drawn)
        metrics["rollout/informative_groups_frac"] = (len(kept) / drawn) if drawn else 0.0
        metrics["rollout/filled_groups"] = float(filled)
        out = RolloutBatch.concat([part for part, _ in chosen], self.pad_id)
        return out, torch.cat([part_scores for _, part_scores in chosen])

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, step: int, round_: int = 0
    ) -> RolloutBatch:
        """Prompts split evenly over the rollout ranks; one batch back, in prompt order."""
        self._rollout_phase()
        ticket = self._submit_generate(prompts, params, step, round_, "generate")
        return self._merge(ticket.wait(), ticket.counts, params.n)

    def _submit_generate(
        self, prompts: Sequence[str], params: SamplingParams, step: int, round_: int, method: str
    ) -> _Generation:
        """Queue ``prompts``' rollout on the rollout ranks (``method``: the workers' generate
        or generate_versioned), round-robin; the requests, not waited for."""
        group = self._rollout_group()
        ranks = group.world_size
        shares = [list(prompts[rank::ranks]) for rank in range(ranks)]
        busy = [rank for rank in range(ranks) if shares[rank]]
        # A step's first round keeps the seeds it always had; further rounds get their own.
        seed = self.config.runner.seed
        seeds = [
            _seed(seed, step, rank) if round_ == 0 else _seed(seed, step, rank, round_)
            for rank in busy
        ]
        calls = [
            group.execute_on(rank).call(method, shares[rank], params, seed)
            for rank, seed in zip(busy, seeds, strict=True)
        ]
        return _Generation(calls, [len(shares[rank]) for rank in busy], self.config.rollout.backend)

    def _merge(self, parts: Sequence[RolloutBatch], counts: Sequence[int], n: int) -> RolloutBatch:
        """The ranks' batches as one, in prompt order (rank r answered prompts r, r+R, …)."""
        merged = RolloutBatch.concat(list(parts), self.pad_id)
        return merged.select(_interleave_order(counts, n), group_size=n)

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy decoding on the held-out split: ``eval/accuracy`` is the mean score of the
        correctness reward, ``reward.reward_type`` (the only reward scored here)."""
        return self.evaluate_on(self.val_set, step)

    def evaluate_on(self, examples: Sequence[PromptExample], step: int) -> dict[str, float]:
        self._ensure_synced()
        started = time.perf_counter()
        params = SamplingParams(n=1, max_new_tokens=self.config.rollout.max_new_tokens, greedy=True)
        batch = self.generate([e.prompt for e in examples], params, step)
        correctness = self.rewards.correctness
        texts, answers = list(batch.response_texts), [e.answer for e in examples]
        results = self._reward().score(texts, answers, [correctness]).wait()[0]
        self._report_failures(results, f"the evaluation at step {step}")
        result: RewardResult = results[correctness]
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

    def _report_failures(self, results: Mapping[str, RewardResult], when: str) -> None:
        for line in self.reward_watch.notices(results, when):
            self._print_line(line)

    # -- offload: the actor and the rollout take turns on GPUs they share

    def _rollout_phase(self) -> None:
        """Make room for the rollout: the actor's state to host memory, the rollout's back."""
        if self._phase == "rollout" or not self.offload.any:
            return
        started = time.perf_counter()
        if self.offload.actor_optimizer:
            self._actor().offload(self.offload.actor_params).wait()
        if self.offload.rollout and self._phase == "update":
            self._rollout_group().reload().wait()
        self._phase = "rollout"
        self._offload_seconds += time.perf_counter() - started

    def _update_phase(self) -> None:
        """Make room for the update: the rollout's model to host memory, the actor's state back."""
        if self._phase == "update" or not self.offload.any:
            return
        started = time.perf_counter()
        if self.offload.rollout:
            self._rollout_group().offload().wait()
        if self.offload.actor_optimizer and self._phase == "rollout":
            self._actor().reload(self.offload.actor_params).wait()
        self._phase = "update"
        self._offload_seconds += time.perf_counter() - started

    def _ensure_synced(self) -> None:
        """A full sync after launch or load, before the rollout generates."""
        if not self._synced:
            self.sync_weights(full=True)

    def sync_weights(self, full: bool) -> dict[str, float]:
        """The actor's weights to the rollout (``full``: every tensor, even in ``patch``
        mode); the ``rollout/sync_*`` metrics."""
        self._synced = self._synced or full
        if self.rollout_in_actor and self.config.rollout.weight_sync == "shared":
            return {"rollout/sync_bytes": 0.0}  # the engine generates with the actor's module
        if self.pipeline is not None:
            return self._push_weights(full)
        actor = self._actor()
        results = actor.sync_model_to_rollout(full=full).wait()
        stats: dict[str, float] = results[0]
        if not self.rollout_in_actor:
            finished = self._rollout_group().finish_sync(full).wait()
            stats["engine_reload_seconds"] = max(part["engine_reload_seconds"] for part in finished)
        return {f"rollout/sync_{key}": value for key, value in stats.items()}

    # -- runner.mode='async'

    def _submit_step(self, step: int) -> Slot:
        """Draw step ``step``'s prompts and queue its rollout (`AsyncRollouts`)."""
        slot = Slot(step, self._sampler().next(), [])
        slot.ticket = self._resubmit(slot)
        return slot

    def _resubmit(self, slot: Slot) -> _Generation:
        """Queue ``slot``'s prompts on the rollout workers (a restored slot's again: its
        rollout was lost with a worker); its per-worker counts follow the requests."""
        params = self._sampling_params()
        prompts = [p.prompt for p in slot.prompts]
        ticket = self._submit_generate(prompts, params, slot.step, 0, "generate_versioned")
        slot.counts = ticket.counts
        return ticket

    def salvage(self, error: BaseException) -> bool:
        """Whether the last completed step can still be saved after ``error``: in
        ``runner.mode='async'``, when a rollout worker failed (the actor holds the step's
        weights; the queued rollouts that finished are saved, the others' prompts kept)."""
        rollout_lost = isinstance(error, WorkerError) and error.component == "rollout"
        self._salvaging = self.pipeline is not None and rollout_lost
        return self._salvaging

    def _push_weights(self, full: bool) -> dict[str, float]:
        """Stage the actor's weights and queue them on every rollout worker behind the
        requests already there, as version ``self.version``; waits for the actor only."""
        results = self._actor().stage_weights(full).wait()
        refs, stats = results[0]
        rollout = self._rollout_group()
        if self.config.rollout.partial_rollouts:
            # Offered beside the requests in flight, which take them up between two tokens;
            # acknowledged before anything else is queued, so a request queued later starts
            # with these weights or newer (the staleness bound's premise).
            for rank in range(rollout.world_size):
                view = rollout.execute_on(rank)
                view.call_in("control", "offer_sync", refs, full, self.version).wait()
            return {f"rollout/sync_{key}": value for key, value in stats.items()}
        self._sync_calls += [
            rollout.execute_on(rank).apply_sync(refs, full, self.version)
            for rank in range(rollout.world_size)
        ]
        return {f"rollout/sync_{key}": value for key, value in stats.items()}

    def _check_syncs(self, wait: bool) -> None:
        """Surface the errors of the weight syncs queued on the rollout workers: of those
        done (``wait``: of all, waiting for them)."""
        pending = []
        for call in self._sync_calls:
            if wait or call.done():
                call.wait()
            else:
                pending.append(call)
        self._sync_calls = pending

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

    def save(self, directory: Path, step: int) -> TrainerState:
        self._update_phase()  # the actor's state where it trains
        critic_saved = (
            None if self.critic is None else self.critic.save_checkpoint(str(directory), step)
        )
        self._actor().save_checkpoint(str(directory), step).wait()
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
                self._check_syncs(wait=True)
        sampler = self._sampler().state()
        extra = {"kl_coef": self.kl_coef} if self._adaptive_kl() else {}
        return TrainerState(
            step=step,
            sampler_epoch=sampler.epoch,
            sampler_position=sampler.position,
            experiment_name=self.config.runner.experiment_name,
            extra=extra,
        )

    def load(self, checkpoint: Path, state: TrainerState) -> int:
        self._update_phase()
        step = int(self._actor().load_checkpoint(str(checkpoint)).wait()[0])
        if self.critic is not None:
            self.critic.load_checkpoint(str(checkpoint)).wait()
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
        if self._adaptive_kl():
            if "kl_coef" in state.extra:
                self.kl_coef = float(state.extra["kl_coef"])
            else:
                self._print_line(
                    f"{checkpoint} holds no adaptive KL coefficient (its run had no "
                    f"algorithm.kl_target): β starts again from algorithm.kl_coef={self.kl_coef}"
                )
        self._synced = False
        return step

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

    def _sampler(self) -> PromptSampler:
        if self.sampler is None:
            raise RuntimeError("the trainer was not launched")
        return self.sampler

    def close(self) -> None:
        self._stack.close()


def _print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _describe(offload: OffloadPlan) -> str:
    moved = []
    if offload.actor_optimizer:
        moved.append("actor optimizer" + (" and parameters" if offload.actor_params else ""))
    if offload.rollout:
        moved.append("rollout model")
    return f"; offloading the {' and the '.join(moved)} between phases" if moved else ""


class _Generation:
    """Rollout requests queued on the rollout ranks (`ReasoningTrainer._submit_generate`)."""

    def __init__(self, calls: list[GroupCall], counts: list[int], backend: str) -> None:
        self.calls = calls
        self.counts = counts  # prompts per request, in the order of the calls
        self.backend = backend

    def done(self) -> bool:
        return all(call.done() for call in self.calls)

    def wait(self) -> list[Any]:
        try:
            return [call.wait()[0] for call in self.calls]
        except WorkerDiedError as error:
            error.extend_message(
                f" It was generating with the '{self.backend}' rollout engine, which runs in "
                "that process."
            )
            raise


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


def _value_metrics(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """How well the values before the update predicted the returns: their mean, the
    returns' mean and the explained variance 1 − Var[G − V] / Var[G] over valid tokens."""
    from rlcore.masked import masked_mean, masked_var

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
