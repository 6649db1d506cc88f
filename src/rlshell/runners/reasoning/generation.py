"""Rollout requests of a reasoning run: prompts dealt over the rollout ranks, one batch back.

`Generator.submit` deals prompts round-robin over the rollout ranks, each with
a seed that depends only on the run's seed, the step, the rank and the
sampling round; `Generator.merge` puts the ranks' batches back in prompt
order. `training_sampling_params` is what a training step samples with.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

from rlshell.cluster.errors import WorkerDiedError
from rlshell.cluster.group import GroupCall, WorkerGroup
from rlshell.config import Config
from rlshell.rollout import RolloutBatch, SamplingParams

__all__ = ["Generation", "Generator", "interleave_order", "training_sampling_params"]


def training_sampling_params(config: Config) -> SamplingParams:
    """``algorithm.group_size`` samples per prompt, as ``rollout`` says."""
    return SamplingParams(
        n=config.algorithm.group_size,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=config.rollout.top_k,
        max_new_tokens=config.rollout.max_new_tokens,
        min_new_tokens=config.rollout.min_new_tokens,
    )


def sampling_seed(*parts: int) -> int:
    """A sampling seed that depends only on the run's seed, the step and the worker."""
    return zlib.crc32(repr(parts).encode()) & 0x7FFFFFFF


class Generation:
    """Rollout requests queued on the rollout ranks (`Generator.submit`)."""

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


class Generator:
    """Generates on ``rollout``'s ranks; ``before`` runs before each synchronous generation
    (the GPU turn of `rlshell.runners.reasoning.turns.GpuTurns`)."""

    def __init__(
        self,
        config: Config,
        rollout: WorkerGroup[Any],
        pad_id: int,
        before: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.rollout = rollout
        self.pad_id = pad_id
        self.before = before

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, step: int, round_: int = 0
    ) -> RolloutBatch:
        """Prompts split evenly over the rollout ranks; one batch back, in prompt order."""
        self.before()
        ticket = self.submit(prompts, params, step, round_, "generate")
        return self.merge(ticket.wait(), ticket.counts, params.n)

    def submit(
        self, prompts: Sequence[str], params: SamplingParams, step: int, round_: int, method: str
    ) -> Generation:
        """Queue ``prompts``' rollout on the rollout ranks (``method``: the workers' generate
        or generate_versioned), round-robin; the requests, not waited for."""
        ranks = self.rollout.world_size
        shares = [list(prompts[rank::ranks]) for rank in range(ranks)]
        busy = [rank for rank in range(ranks) if shares[rank]]
        # A step's first round keeps the seeds it always had; further rounds get their own.
        seed = self.config.runner.seed
        seeds = [
            sampling_seed(seed, step, rank)
            if round_ == 0
            else sampling_seed(seed, step, rank, round_)
            for rank in busy
        ]
        calls = [
            self.rollout.execute_on(rank).call(method, shares[rank], params, rank_seed)
            for rank, rank_seed in zip(busy, seeds, strict=True)
        ]
        return Generation(calls, [len(shares[rank]) for rank in busy], self.config.rollout.backend)

    def merge(self, parts: Sequence[RolloutBatch], counts: Sequence[int], n: int) -> RolloutBatch:
        """The ranks' batches as one, in prompt order (rank r answered prompts r, r+R, …)."""
        merged = RolloutBatch.concat(list(parts), self.pad_id)
        return merged.select(interleave_order(counts, n), group_size=n)


def interleave_order(counts: Sequence[int], n: int) -> list[int]:
    """Row order that undoes a round-robin split of prompts (``n`` rows per prompt)."""
    offsets = [sum(counts[:rank]) for rank in range(len(counts))]
    total = sum(counts)
    order: list[int] = []
    for prompt in range(total):
        rank, index = prompt % len(counts), prompt // len(counts)
        start = (offsets[rank] + index) * n
        order.extend(range(start, start + n))
    return order
