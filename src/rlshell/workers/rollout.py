"""Rollout and reference workers for placements where they do not share the actor's processes.

`RolloutWorker` holds the rollout engine ``rollout.backend`` names
(`rlshell.engines.rollout`) and receives weights from actor
rank 0 (buckets or patches through the Ray object store); where it shares
the actor's GPUs it moves its model to host memory during the update
(`offload`, `reload`). `ReferenceWorker`
holds the frozen initial policy and computes the reference log-probs of the
KL term; it is started only when ``algorithm.kl_coef`` > 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from attrs import evolve, frozen
from torch import Tensor

from rlshell.cluster.worker import Worker
from rlshell.config import Config
from rlshell.engines.rollout import RolloutEngine, make_rollout_engine
from rlshell.engines.rollout.multi_turn import AgentLoop, make_agent_loop, sample
from rlshell.models import get_model
from rlshell.rollout import RolloutBatch, SamplingParams
from rlshell.sync.transfer import WeightReceiver
from rlshell.workers.common import build_rollout_model, worker_device
from rlshell.workers.forward import policy_forward

__all__ = ["ReferenceWorker", "RolloutResult", "RolloutWorker"]


@frozen
class RolloutResult:
    """A batch with what the asynchronous runner keeps of its making.

    ``version``: the actor version of the weights that sampled it (the
    number of updates behind them: `RolloutWorker.apply_sync`'s); ``started``
    and ``finished``: wall-clock times (``time.time()``) of the generation;
    ``idle_before``: how long the worker waited between its previous request
    and this one (0 for its first).

    With ``rollout.partial_rollouts`` a generation may switch weights between
    two tokens: ``version`` is then the version it started with (its oldest
    tokens'), ``token_versions`` each response token's (-1 past a response's
    end; None without partial rollouts: every token is ``version``'s) and
    ``syncs`` what each sync applied during it received.
    """

    batch: RolloutBatch
    version: int
    started: float
    finished: float
    idle_before: float
    token_versions: Tensor | None = None
    syncs: tuple[dict[str, float], ...] = ()


class RolloutWorker(Worker):
    """Samples with the ``rollout.backend`` engine; its weights arrive from the actor."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.engine: RolloutEngine | None = None
        self.agent: AgentLoop | None = None  # agent.tools: multi-turn rollouts with tool calls
        self.receiver: WeightReceiver | None = None
        self.version = 0  # the actor version of the weights held (runner.mode='async')
        self._last_finished: float | None = None
        # rollout.partial_rollouts: syncs offered while a request generates (`offer_sync`,
        # from the worker's control thread), applied by the generating thread.
        self._offers = _OfferedSyncs(self)

    def init_worker(self, tokenizer_path: str) -> None:
        from rlshell.tokenizer import load_tokenizer

        model = build_rollout_model(self.config, merged_lora=True)
        tokenizer = load_tokenizer(tokenizer_path)
        self.engine = make_rollout_engine(self.config.rollout, model, tokenizer, worker_device())
        self.agent = make_agent_loop(self.config, tokenizer)
        self.receiver = WeightReceiver(self.engine.weight_targets())

    def generate(self, prompts: Sequence[str], params: SamplingParams, seed: int) -> RolloutBatch:
        return sample(self._engine(), self.agent, prompts, params, seed)

    def generate_versioned(
        self, prompts: Sequence[str], params: SamplingParams, seed: int
    ) -> RolloutResult:
        """`generate`, tagged with the weights' version and the generation's times."""
        started = time.time()
        idle = 0.0 if self._last_finished is None else max(0.0, started - self._last_finished)
        if not self.config.rollout.partial_rollouts:
            batch = sample(self._engine(), self.agent, prompts, params, seed)
            self._last_finished = time.time()
            return RolloutResult(batch, self.version, started, self._last_finished, idle)
        offers = self._offers
        offers.apply()  # what was offered before this request started
        version, offers.applied = self.version, []
        batch, token_versions = self._engine().generate_partial(prompts, params, seed, offers)
        self._last_finished = time.time()
        syncs = tuple(offers.applied)
        return RolloutResult(
            batch, version, started, self._last_finished, idle, token_versions, syncs
        )

    def offer_sync(self, refs: Sequence[Any], full: bool, version: int) -> None:
        """``rollout.partial_rollouts``: hold a sync staged by the actor for the generating
        thread, which applies it between two tokens of the request in flight (or before
        the next one). Called in the worker's ``control`` concurrency group, so it lands
        while a request generates; syncs are applied in the order they were offered."""
        self._offers.offer(refs, full, version)

    def apply_sync(self, refs: Sequence[Any], full: bool, version: int) -> dict[str, float]:
        """Apply one sync staged by the actor (`ActorWorker.stage_weights`: the refs of its
        records, in order) and take up version ``version``; returns what was received.

        Queued behind the requests already submitted, it lands between two of
        them: a request in flight finishes with the weights it started with.
        """
        import ray

        started = time.perf_counter()
        applied = sum(self.receive_weights(ray.get(ref)) for ref in refs)
        received = self.finish_sync(full)
        self.version = version
        seconds = time.perf_counter() - started
        return {**received, "applied_bytes": float(applied), "seconds": seconds}

    def receive_weights(self, message: Any) -> int:
        """Apply one bucket or patch sent by actor rank 0; returns the bytes applied."""
        if self.receiver is None:
            raise RuntimeError("init_worker() has not run")
        return self.receiver.receive(message)

    def finish_sync(self, full: bool) -> dict[str, float]:
        """Check that a full sync covered every tensor, then have the engine take the new
        weights up (`RolloutEngine.weights_updated`); returns what was received."""
        if self.receiver is None:
            raise RuntimeError("init_worker() has not run")
        received = self.receiver.finish(check_coverage=True)
        started = time.perf_counter()
        self._engine().weights_updated()
        received["engine_reload_seconds"] = time.perf_counter() - started
        return received

    def rollout_weights(self) -> dict[str, Tensor]:
        return {name: t.detach().clone() for name, t in self._engine().weight_targets().items()}

    def offload(self) -> float:
        """Move the engine's model to host memory while the actor updates on the GPU they
        share (`rlshell.runners.offload`); the seconds it took."""
        started = time.perf_counter()
        self._engine().offload()
        return time.perf_counter() - started

    def reload(self) -> float:
        """Move it back before the next rollout; the seconds it took."""
        started = time.perf_counter()
        self._engine().reload()
        return time.perf_counter() - started

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("init_worker() has not run")
        return self.engine


class _OfferedSyncs:
    """The syncs offered to a `RolloutWorker` and not applied yet: its `WeightSwitch`
    (`rlshell.engines.rollout.hf.HFRolloutEngine.generate_partial`)."""

    def __init__(self, worker: RolloutWorker) -> None:
        self.worker = worker
        self.applied: list[dict[str, float]] = []  # by the request in flight, in order
        self._waiting: list[tuple[Sequence[Any], bool, int]] = []
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        return self.worker.version

    def offer(self, refs: Sequence[Any], full: bool, version: int) -> None:
        with self._lock:
            self._waiting.append((refs, full, version))

    def pending(self) -> bool:
        with self._lock:
            return bool(self._waiting)

    def apply(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for refs, full, version in waiting:
            self.applied.append(self.worker.apply_sync(refs, full, version))


class ReferenceWorker(Worker):
    """The frozen initial policy: log-probs of sampled responses for the KL term."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.model: torch.nn.Module | None = None

    def init_worker(self) -> None:
        torch.manual_seed(self.config.actor.seed)
        # The initial policy; a LoRA actor's is its base model (its adapters start at B = 0).
        model_cfg = evolve(self.config.actor.model, is_lora=False)
        model = get_model(model_cfg).to(worker_device()).eval()
        for param in model.parameters():
            param.requires_grad_(False)
        self.model = model

    @torch.no_grad()
    def compute_ref_logprobs(self, batch: RolloutBatch) -> Tensor:
        """log π_ref of every response token of ``batch`` (zeros where masked)."""
        if self.model is None:
            raise RuntimeError("init_worker() has not run")
        logprobs, _ = policy_forward(
            self.model,
            batch,
            self.config.rollout.temperature,
            self.config.actor.logprob_chunk_size,
            share_prompts=self.config.actor.share_prompt_forward,
        )
        return torch.where(batch.response_mask, logprobs.cpu(), 0.0)
