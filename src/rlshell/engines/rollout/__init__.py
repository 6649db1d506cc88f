"""Rollout engines: prompts in, a `rlshell.rollout.RolloutBatch` out, with the actor's weights.

One protocol, `RolloutEngine`, and the engines that implement it, one module
each (``rollout.backend`` names one; `make_rollout_engine` builds it, once, in
the worker that holds it):

- ``hf``: `rlshell.engines.rollout.hf.HFRolloutEngine`, Hugging Face
  ``generate`` on any device, the CPU included;
- ``vllm`` and ``sglang`` are named by the config for GPU configs that plan
  them (``--dry-run``) and are refused for a run of this version
  (`rlshell.runners.validation`): no engine module is installed for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from rlshell.rollout import RolloutBatch, SamplingParams

if TYPE_CHECKING:
    from rlshell.config import RolloutConfig

__all__ = ["ROLLOUT_ENGINES", "RolloutEngine", "make_rollout_engine"]

ROLLOUT_ENGINES = ("hf",)
"""The ``rollout.backend`` values this installation has an engine for."""


class RolloutEngine(Protocol):
    """Samples responses with a copy of the policy whose weights the actor's syncs replace.

    engine = make_rollout_engine(config.rollout, model, tokenizer, device)
    targets = engine.weight_targets()                   # syncs write into these tensors
    batch = engine.generate(prompts, params, seed=seed) # rows g·n … g·n+n−1 answer prompt g
    engine.offload(); ...; engine.reload()              # make room on a shared GPU meanwhile
    """

    def weight_targets(self) -> dict[str, Tensor]:
        """The engine's own tensors by state-dict name: weight syncs write into them."""
        ...

    def generate(
        self, prompts: Sequence[str], params: SamplingParams, seed: int | None = None
    ) -> RolloutBatch:
        """``params.n`` responses per prompt, grouped by prompt; ``seed`` makes it repeatable."""
        ...

    def offload(self) -> None:
        """Move the engine's model to host memory (the actor updates on a GPU they share)."""
        ...

    def reload(self) -> None:
        """Move it back before the engine generates again."""
        ...


def make_rollout_engine(
    config: RolloutConfig, model: nn.Module, tokenizer: object, device: torch.device
) -> RolloutEngine:
    """The engine ``config.backend`` names, holding ``model`` on ``device``."""
    if config.backend == "hf":
        from rlshell.engines.rollout.hf import HFRolloutEngine

        return HFRolloutEngine(model, tokenizer, device)
    raise ValueError(
        f"rollout.backend: no '{config.backend}' engine in this installation; engines: "
        f"{', '.join(ROLLOUT_ENGINES)}"
    )
